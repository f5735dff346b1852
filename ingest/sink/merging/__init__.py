"""MERGE into a table: upsert mode's (``merge.py``: the txn filter, the dedupe by key, then
the MERGE with the batch's txn actions: file by file for a plain table, ``streamed.py``;
delta-rs's or Delta Spark's otherwise) and the staged rows it reads back (``staged.py``)."""
