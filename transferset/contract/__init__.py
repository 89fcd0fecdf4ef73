"""The data contract: the Parquet schema and metadata, the label rule, the repeated-id check."""
