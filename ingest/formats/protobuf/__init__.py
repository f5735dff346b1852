"""protobuf."""
