"""json_schema."""
