"""The Delta sink: the landing protocol and driver-side commits through delta-rs.

``land.py`` (the landing protocol: ``Batch`` in, ``BatchResult`` out; dead letters
first, then the table, for append, overwrite and upsert, and orphan cleanup;
the data files come from a ``FileWriter``), ``config.py`` (``TableConfig``),
``txn.py`` (app ids, txn version arithmetic), ``storage.py`` (a
table's location as a pyarrow filesystem), ``files.py`` (Parquet data files
written outside delta-rs, with stats and provenance), ``delta.py``
(``DeltaTarget``: txn versions and the commit retry loop, re-filtering after a
lost race), ``rewrite.py`` (data files rewritten without some rows: the
overwrite's cut, the re-filter), ``schema.py`` (additive schema evolution),
``txnlog.py`` (when each txn was written, from the Delta log), ``merge.py``
(upsert mode) and ``deadletter.py`` (the dead-letter table). The Spark job in
``spark_jobs`` supplies the writer; this package never imports Spark. Results are
keyed by ``Partition`` (``ingest.protocol.partition``, re-exported).
"""

from ingest.protocol.partition import Partition
from ingest.sink.config import TableConfig
from ingest.sink.deadletter import DEAD_LETTER_SCHEMA
from ingest.sink.delta import CommitOutcome, DeltaTarget, StaleBatchError
from ingest.sink.files import DataFile, Source, write_data_files
from ingest.sink.land import Batch, BatchResult, FileWriter, land
from ingest.sink.merge import upsert
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "Batch",
    "BatchResult",
    "CommitOutcome",
    "DataFile",
    "DeltaTarget",
    "FileWriter",
    "Partition",
    "Source",
    "StaleBatchError",
    "TableConfig",
    "TableLocation",
    "app_id",
    "land",
    "upsert",
    "write_data_files",
]
