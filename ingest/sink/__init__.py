"""The Delta sink: the landing protocol and driver-side commits through delta-rs.

``land.py`` (the landing protocol: ``Batch`` in, ``BatchResult`` out; dead letters
first, then the table, for append, overwrite and upsert, and orphan cleanup; the
data files come from the engine that drives it), ``delta.py`` (``DeltaTarget``: txn versions
and the commit retry loop, re-filtering after a lost race), ``txn.py`` (app ids, txn
version arithmetic, the txn actions of a commit), ``durable.py`` (the txn version of
each partition, and where a worker starts), ``table_config.py`` (``TableConfig``),
``storage.py`` (a table's location as a pyarrow filesystem), ``files.py`` (Parquet
data files written outside delta-rs, with stats and provenance), ``metadata/`` (what a
table's protocol and metaData ask: the features written through or refused, additive
schema evolution, column mapping's physical names), ``txnlog.py`` (when each txn was written, from the Delta log),
``merge.py`` (upsert mode), ``deadletter.py`` (the dead-letter table) and
``maintenance/`` (compaction, rewrites without some rows, one maintenance pass). The
engines (``ingest.engines``) write the files and drive the landing; this package never
imports Spark.
Results are keyed by ``Partition`` (``ingest.protocol.partition``, re-exported).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ingest.protocol.partition import Partition
    from ingest.sink.batch import Batch, BatchResult
    from ingest.sink.deadletter import DEAD_LETTER_SCHEMA
    from ingest.sink.delta import CommitOutcome, DeltaTarget
    from ingest.sink.files import DataFile, Source, write_data_files
    from ingest.sink.land import Landing
    from ingest.sink.maintenance.rewrite import StaleBatchError
    from ingest.sink.merging.merge import upsert
    from ingest.sink.storage import TableLocation
    from ingest.sink.table_config import TableConfig
    from ingest.sink.txn import app_id

# (``land``, the function, is ``ingest.sink.land.land``: the package's ``land`` is the module.)
# Imported on first use: a Spark or local-engine task needs files.py and storage.py only,
# not merge.py's pyarrow.dataset (and pandas behind it): 0.3 s of every task process's start.
_EXPORTS = {
    "Batch": "ingest.sink.batch",
    "BatchResult": "ingest.sink.batch",
    "CommitOutcome": "ingest.sink.delta",
    "DEAD_LETTER_SCHEMA": "ingest.sink.deadletter",
    "DataFile": "ingest.sink.files",
    "DeltaTarget": "ingest.sink.delta",
    "Landing": "ingest.sink.land",
    "Partition": "ingest.protocol.partition",
    "Source": "ingest.sink.files",
    "StaleBatchError": "ingest.sink.maintenance.rewrite",
    "TableConfig": "ingest.sink.table_config",
    "TableLocation": "ingest.sink.storage",
    "app_id": "ingest.sink.txn",
    "upsert": "ingest.sink.merging.merge",
    "write_data_files": "ingest.sink.files",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'ingest.sink' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "DEAD_LETTER_SCHEMA",
    "Batch",
    "BatchResult",
    "CommitOutcome",
    "DataFile",
    "DeltaTarget",
    "Landing",
    "Partition",
    "Source",
    "StaleBatchError",
    "TableConfig",
    "TableLocation",
    "app_id",
    "upsert",
    "write_data_files",
]
