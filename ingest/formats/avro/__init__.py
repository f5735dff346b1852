"""avro."""
