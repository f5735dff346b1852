"""Appends whose rows Delta Spark writes (an insert-only MERGE): tables with CHECK
constraints, NOT NULL columns, invariants, generated or identity columns
(``features.rows_through_delta_spark``).

ingest's own appends commit Parquet files that nobody checked or completed. For such a
table the batch's rows are staged like an upsert's (``land.py``) and read back in the
driver; then:

1. ``checks_of`` lists what each row must satisfy: every CHECK constraint
   (``delta.constraints.<name>``), every NOT NULL column (but generated and identity ones,
   which the writer fills) and every column invariant. Delta Spark evaluates them on the
   batch (``TableCommitter.failing``: a null result fails, as in Delta's own checks); a row
   that fails one becomes a dead letter naming it (``land.py``), and is never committed.
2. ``insert`` hands the other rows to Delta Spark as an insert-only MERGE on (topic,
   partition, offset), which computes the generated columns and assigns identity values
   from the table's high-water mark as Delta Spark's own writes do. Its idempotent-DML
   confs take one txn action per commit, so the batch makes one MERGE per Kafka
   partition, each carrying that partition's rows and txn: every partition's rows and its
   offsets land in one commit. Why a MERGE and not Delta Spark's append: the rows are
   re-filtered by the txn versions of a delta-rs snapshot, and Delta's writer skips a
   write only when the table's txn version already reaches the batch's; a rival that
   committed part of the range in between would get that part twice. The MERGE's join
   leaves out any offset the table holds at its own snapshot, and Delta's conflict check
   fails it when a rival adds such rows while it runs. So an offset the table holds is
   never appended again, by any group (unlike ingest's own appends, where another group
   lands its own copy). A lost race reloads, re-filters and merges again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from ingest.errors import SinkError
from ingest.sink.delta import CommitOutcome, DeltaTarget
from ingest.sink.merging.merge import merge_per_partition
from ingest.sink.txn import MergeClauses, TableCommitter

__all__ = ["checks_of", "insert"]

log = logging.getLogger("ingest.sink")


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def checks_of(table: DeltaTable) -> list[tuple[str, str]]:
    """(label, Spark SQL expression every row must make true) of ``table``'s constraints."""
    configuration = table.metadata().configuration
    checks = [
        (f"CHECK constraint {key.split('.', 2)[2]} ({value})", str(value))
        for key, value in sorted(configuration.items())
        if key.lower().startswith("delta.constraints.") and value
    ]
    fields: list[dict[str, Any]] = json.loads(table.schema().to_json()).get("fields", [])
    for field in fields:
        name, metadata = field["name"], field.get("metadata") or {}
        filled = "delta.generationExpression" in metadata or any(
            key.startswith("delta.identity.") for key in metadata
        )
        if field.get("nullable") is False and not filled:
            checks.append((f"NOT NULL column {name}", f"{_quoted(name)} IS NOT NULL"))
        invariant = metadata.get("delta.invariants")
        if invariant:
            expression = json.loads(invariant)["expression"]["expression"]
            checks.append((f"invariant of column {name} ({expression})", expression))
    return checks


def _insert_only(rows: pa.Table, txn: tuple[str, int]) -> MergeClauses:
    """A MERGE that inserts the rows whose offset the table does not hold yet."""
    on = " AND ".join(f"t.{_quoted(c)} = s.{_quoted(c)}" for c in ("topic", "partition", "offset"))
    return MergeClauses(on, None, None, None, tuple(rows.schema.names), txn)


def insert(
    target: DeltaTarget,
    committer: TableCommitter,
    source: pa.Table,
    txns: Mapping[str, int],
    app_id_of: Callable[[str, int], str],
) -> CommitOutcome:
    """Appends ``source`` (rows that passed ``checks_of``) through Delta Spark, one
    insert-only MERGE per partition with its txn (see the module docstring)."""
    keys = {"topic", "partition", "offset"}
    table = target.load()
    held = set() if table is None else {f.name for f in table.schema().fields}
    if not keys <= set(source.column_names) or not keys <= held:
        raise SinkError(
            f"{target.uri}: an append Delta Spark writes needs the columns topic, partition "
            "and offset in the rows and the table (its MERGE joins on them)"
        )
    return merge_per_partition(
        target,
        committer,
        source,
        source.schema,
        txns,
        app_id_of,
        rows_of=lambda rows: rows,
        clauses_of=_insert_only,
    )
