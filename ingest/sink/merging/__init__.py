"""MERGE into a table: upsert mode's (``merge.py``: the txn filter, the dedupe by key, delta-rs's
MERGE or Delta Spark's with the batch's txn actions) and the staged rows it reads back
(``staged.py``)."""
