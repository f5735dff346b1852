"""What a Delta table's protocol and metaData ask of ingest's writes: the table features it
writes through or refuses (``features``; ``probe_table``: the table a configuration would
make), the columns a batch may add (``evolution``), and the physical names and field ids of
column mapping (``mapping``)."""
