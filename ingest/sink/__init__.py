"""The Delta sink: driver-side commits through delta-rs.

``config.py`` (``TableConfig``), ``txn.py`` (app ids), ``storage.py`` (a table's
location as a pyarrow filesystem), ``files.py`` (Parquet data files written
outside delta-rs, with stats and provenance), ``delta.py`` (``DeltaTarget``: txn
versions, the one commit per batch, re-filtering after a lost race, additive
schema evolution), ``merge.py`` (upsert mode) and ``deadletter.py`` (the
dead-letter table). The Spark job in ``spark_jobs`` writes the files; this
package commits them, and never imports Spark.
"""

from ingest.sink.config import TableConfig
from ingest.sink.deadletter import DEAD_LETTER_SCHEMA
from ingest.sink.delta import CommitOutcome, DeltaTarget, StaleBatchError
from ingest.sink.files import DataFile, Source, write_data_files
from ingest.sink.merge import upsert
from ingest.sink.storage import TableLocation
from ingest.sink.txn import app_id

__all__ = [
    "DEAD_LETTER_SCHEMA",
    "CommitOutcome",
    "DataFile",
    "DeltaTarget",
    "Source",
    "StaleBatchError",
    "TableConfig",
    "TableLocation",
    "app_id",
    "upsert",
    "write_data_files",
]
