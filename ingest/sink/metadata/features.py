"""Delta table features: which ones ingest writes through, and which it refuses before writing.

Tables created by another writer (Delta Spark) carry features that ingest's commit
path may not honour. ingest writes Parquet with pyarrow and commits add actions
(``delta.py``: delta-rs ``create_write_transaction``, which checks nothing about
the rows), or MERGEs with delta-rs (upsert). Measured with Delta Spark 4.4 and
delta-rs 1.6.6 (tests/delta/test_interop.py):

- column mapping (name or id): the files ingest writes with pyarrow carry each column's
  physical name and Parquet field id, nested fields too, and their statistics and partition
  values go by physical names (``mapping.py``); a delta-rs MERGE does the same.
- generated columns, CHECK constraints, NOT NULL columns, invariants, identity columns:
  appended files would lack the generated and identity values and nobody would check the
  rows. With the Spark engine the batch's rows are checked with Delta Spark (a row that
  breaks a constraint becomes a dead letter naming it) and written by Delta Spark, an
  insert-only MERGE per partition with its txn (``ingest/sink/inserts.py``); an
  overwrite's by its transaction's ``writeFiles``. A delta-rs MERGE computes generated
  columns and checks constraints (upserts; identity and invariants: Delta Spark's MERGE).
- deletion vectors: appends add new files (no vector needed), a delta-rs MERGE
  honours the vectors of the files it rewrites (no deleted row comes back).
  Compaction (``maintenance/compact.py``) leaves every file with a vector as it is
  and compacts the others. An overwrite's cut cannot go through delta-rs, whose remove
  action cannot name the vector of the file it removes: with the Spark engine it is
  Delta Spark's DELETE inside Delta Spark's transaction (``ingest/sink/overwrite.py``).
- change data feed: appends need no cdc files (readers derive inserts from adds);
  a delta-rs MERGE writes update pre/post images and deletes; an overwrite's cut goes
  through Delta Spark, whose DELETE writes the change data of what it cuts.
- appendOnly (``delta.appendOnly = true``): an upsert's MERGE removes files; it is
  refused (delta-rs only fails its commits over and over).
- timestampNtz: written by delta-rs and by our pyarrow files alike (``timestamp[us]``).
- row tracking, domain metadata, clustering, in-commit timestamps, vacuumProtocolCheck,
  VARIANT columns, type widening and v2 checkpoints: delta-rs 1.6.6 refuses to write to such a table (or, for v2
  checkpoints, writes classic checkpoints). ingest appends to it by committing its
  files and txn actions through Delta Spark's own transaction in the driver JVM
  (``FeatureRule.delta_spark``; ``through_delta_spark`` names a table's such features),
  which assigns row ids, timestamps and checkpoints as Delta Spark's writes do.

``check_table(uri, table, use)`` refuses a table with a feature that ``FEATURES``
marks unsupported for ``use`` (``append``, ``upsert``, ``compact``: compaction, or
``overwrite``: ``replay --overwrite``'s cut; both rewrite files with pyarrow), or one
ingest does not know, with ``UnsupportedTableFeature`` naming each feature and why.
It is called where a run, a replay or an maintenance pass opens its tables, and again
for each batch on the snapshot it plans on (a feature turned on mid-run stops the
run before the batch writes anything). docs/delta-compat.md lists the rules and
their tests.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from deltalake import DeltaTable

from ingest.errors import SinkError

__all__ = [
    "FEATURES",
    "USES",
    "FeatureRule",
    "UnsupportedTableFeature",
    "Use",
    "active_features",
    "check_table",
    "committed_by_delta_spark",
    "cut_writes_change_data",
    "rows_through_delta_spark",
    "through_delta_spark",
]

Use = Literal["append", "upsert", "compact", "overwrite"]
USES: tuple[Use, ...] = ("append", "upsert", "compact", "overwrite")


class UnsupportedTableFeature(SinkError):
    """A target table uses a Delta feature ingest cannot write (or keep) correctly for
    what it was asked to do; raised before anything is written."""


@dataclass(frozen=True)
class FeatureRule:
    """What ingest does with one table feature: per use, whether it writes through;
    ``why`` explains a refusal; ``test`` names the test that pins it."""

    append: bool
    upsert: bool
    compact: bool
    overwrite: bool
    why: str
    test: str
    # Uses ingest writes through only by committing with Delta Spark's own transaction in
    # the driver JVM (the Spark engine: ``ingest/engines/spark/delta_commit.py``).
    delta_spark: tuple[Use, ...] = ()
    # Appends whose rows Delta Spark's writer must write itself (it computes, checks or
    # assigns values), not only commit: ``ingest/sink/inserts.py``.
    rows: bool = False

    def allows(self, use: Use, *, delta_spark: bool = False) -> bool:
        allowed: bool = getattr(self, use)
        return allowed or (delta_spark and use in self.delta_spark)


_INTEROP = "tests/delta/test_interop.py::"
_THROUGH_SPARK = (
    "; ingest appends to it by committing through Delta Spark's own transaction in the "
    "driver JVM, upserts with Delta Spark's MERGE (one per partition) and replaces an "
    "overwrite's range with Delta Spark's DELETE inside that transaction, which needs the "
    'Spark engine (spark.engine = "auto" picks it for such a table)'
)

_BY_SPARK_WRITER = (
    "; with the Spark engine, ingest hands such an append's rows to Delta Spark (an insert-only "
    "MERGE per partition, carrying its txn), after the rows that break a CHECK constraint, a "
    "NOT NULL column or an invariant became dead letters naming it"
)

# Feature name (as Delta names it in readerFeatures/writerFeatures) -> rule. "notNull" is
# no protocol feature: a NOT NULL column, which every writer must check (protocol
# "Column Invariants"/nullability).
FEATURES: Mapping[str, FeatureRule] = {
    "appendOnly": FeatureRule(
        append=True,
        upsert=False,
        compact=True,
        overwrite=False,
        why="delta.appendOnly = true forbids removes: a MERGE's, an overwrite's cut's "
        "(delta-rs then only fails its commits)",
        test=_INTEROP + "test_refusals_name_the_feature",
    ),
    "invariants": FeatureRule(
        append=False,
        upsert=False,
        compact=True,
        overwrite=True,
        why="columns carry delta.invariants expressions, which no ingest write checks"
        + _BY_SPARK_WRITER,
        test="tests/sink/test_features.py::test_invariants_are_refused",
        delta_spark=("append", "upsert"),
        rows=True,
    ),
    "notNull": FeatureRule(
        append=False,
        upsert=True,
        compact=True,
        overwrite=True,
        why="appended files are committed without checking NOT NULL columns (a null "
        "would be committed; Spark then reads another value in its place)" + _BY_SPARK_WRITER,
        test=_INTEROP + "test_delta_spark_writes_the_rows",
        delta_spark=("append",),
        rows=True,
    ),
    "checkConstraints": FeatureRule(
        append=False,
        upsert=True,
        compact=True,
        overwrite=True,
        why="appended files are committed without evaluating CHECK constraints" + _BY_SPARK_WRITER,
        test=_INTEROP + "test_delta_spark_writes_the_rows",
        delta_spark=("append",),
        rows=True,
    ),
    "generatedColumns": FeatureRule(
        append=False,
        upsert=True,
        compact=True,
        overwrite=True,
        why="appended files lack the generated columns (Spark would read nulls)" + _BY_SPARK_WRITER,
        test=_INTEROP + "test_delta_spark_writes_the_rows",
        delta_spark=("append",),
        rows=True,
    ),
    "columnMapping": FeatureRule(
        append=True,
        upsert=True,
        compact=True,
        overwrite=True,
        why="",
        test=_INTEROP + "test_column_mapping",
    ),
    "deletionVectors": FeatureRule(
        append=True,
        upsert=True,
        compact=True,
        overwrite=False,
        why="an overwrite's cut removes the files holding the range, and the remove of a file "
        "with a deletion vector must name that vector (PROTOCOL.md, Deletion Vectors: a "
        "logical file is its path and its vector's id); delta-rs 1.6's RemoveAction "
        "(deltalake.transaction) has no deletionVector field, so such a file would stay live "
        "(upstream limit). With the Spark engine the overwrite commits through Delta Spark's "
        "transaction, whose DELETE of the range marks the rows in deletion vectors "
        '(spark.engine = "auto" picks it for such a replay)',
        test="tests/delta/test_overwrite_delta_spark.py::test_overwrite_through_delta_spark",
        delta_spark=("overwrite",),
    ),
    "changeDataFeed": FeatureRule(
        append=True,
        upsert=True,
        compact=True,
        overwrite=False,
        why="an overwrite's cut rewrites the files holding the range without its rows; with no "
        "change data files in the commit, a feed reader derives a delete and an insert of "
        "every other row of those files too, and delta-rs 1.6's commit (create_write_"
        "transaction) takes add actions only, no cdc action (upstream limit). With the Spark "
        "engine the cut is Delta Spark's DELETE, which writes the change data of what it "
        'cuts, and the replayed rows are written with theirs (spark.engine = "auto" picks it '
        "for such a replay)",
        test="tests/delta/test_overwrite_delta_spark.py::test_overwrite_through_delta_spark",
        delta_spark=("overwrite",),
    ),
    "timestampNtz": FeatureRule(
        append=True,
        upsert=True,
        compact=True,
        overwrite=True,
        why="",
        test=_INTEROP + "test_timestamp_ntz",
    ),
    "vacuumProtocolCheck": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why='delta-rs 1.6 refuses every write to such a table ("Unsupported table features '
        'required: [VacuumProtocolCheck]", upstream limit)' + _THROUGH_SPARK,
        test=_INTEROP + "test_delta_spark_features",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "identityColumns": FeatureRule(
        append=False,
        upsert=False,
        compact=True,
        overwrite=True,
        why="identity values are assigned by the writer; delta-rs and ingest assign none"
        + _BY_SPARK_WRITER,
        test=_INTEROP + "test_delta_spark_writes_the_rows",
        delta_spark=("append", "upsert"),
        rows=True,
    ),
    "rowTracking": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="the writer must assign row ids and commit versions; delta-rs 1.6.6 refuses any "
        "write to such a table ('Unsupported table features required: [RowTracking]', upstream "
        "limit)" + _THROUGH_SPARK,
        test=_INTEROP + "test_delta_spark_features",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "domainMetadata": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="delta-rs 1.6.6 refuses any write to such a table ('Unsupported table features "
        "required: [DomainMetadata]', upstream limit); it comes with clustering and row tracking"
        + _THROUGH_SPARK,
        test=_INTEROP + "test_delta_spark_features",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "clustering": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="delta-rs 1.6.6 refuses any write to a clustered table ('Unsupported table "
        "features required: [ClusteredTable]', upstream limit)" + _THROUGH_SPARK,
        test=_INTEROP + "test_delta_spark_features",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "inCommitTimestamp": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="every commit must carry an in-commit timestamp; delta-rs 1.6.6 refuses any write "
        "to such a table ('Unsupported table features required: [InCommitTimestamp]', upstream "
        "limit)" + _THROUGH_SPARK,
        test=_INTEROP + "test_delta_spark_features",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "v2Checkpoint": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="delta-rs 1.6.6 appends to such a table, but the checkpoints it writes (ingest "
        "maintain, every delta.checkpointInterval commits) are classic ones without the "
        "checkpointMetadata action of a v2 checkpoint (upstream limit)" + _THROUGH_SPARK,
        test=_INTEROP + "test_delta_spark_features",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "variantType": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="delta-rs 1.6.6 reads a VARIANT column (a struct of metadata and value binaries) "
        "but does not write to such a table, and pyarrow would write it back without Parquet's "
        "VARIANT annotation (upstream limits)" + _THROUGH_SPARK,
        test=_INTEROP + "test_variant_type",
        delta_spark=("append", "upsert", "overwrite"),
    ),
    "typeWidening": FeatureRule(
        append=False,
        upsert=False,
        compact=False,
        overwrite=False,
        why="a column's type was widened (its older files hold the narrower type): delta-rs "
        "1.6.6 loads such a table's log but refuses to write to it ('Unsupported table "
        "features required: [TypeWidening]') and its pyarrow reads refuse the reader feature "
        "(upstream limits); compaction would read the old files through them" + _THROUGH_SPARK,
        test="tests/delta/test_type_widening.py::test_type_widening",
        delta_spark=("append", "upsert", "overwrite"),
    ),
}

# Features a table may list (writer version 7) without using them: each is active only
# when the table's metadata says so.
_CONDITIONAL = (
    "appendOnly",
    "invariants",
    "checkConstraints",
    "generatedColumns",
    "columnMapping",
    "changeDataFeed",
    "identityColumns",
)
_MAX_READER, _MAX_WRITER = 3, 7


def _fields(table: DeltaTable) -> list[dict[str, Any]]:
    schema: dict[str, Any] = json.loads(table.schema().to_json())
    fields: list[dict[str, Any]] = schema.get("fields", [])
    return fields


def _true(configuration: Mapping[str, str | None], key: str) -> bool:
    value = {k.lower(): v for k, v in configuration.items()}.get(key.lower())
    return (value or "").strip().lower() == "true"


def _used(table: DeltaTable) -> dict[str, str]:
    """The conditional features the table's metadata uses, with what shows it."""
    configuration = table.metadata().configuration
    fields = _fields(table)
    used: dict[str, str] = {}
    if _true(configuration, "delta.appendOnly"):
        used["appendOnly"] = "delta.appendOnly = true"
    mode = {k.lower(): v for k, v in configuration.items()}.get("delta.columnmapping.mode")
    if mode and mode.lower() != "none":
        used["columnMapping"] = f"delta.columnMapping.mode = {mode}"
    if _true(configuration, "delta.enableChangeDataFeed"):
        used["changeDataFeed"] = "delta.enableChangeDataFeed = true"
    constraints = sorted(k for k in configuration if k.lower().startswith("delta.constraints."))
    if constraints:
        used["checkConstraints"] = ", ".join(
            f"{k.split('.', 2)[2]}: {configuration[k]}" for k in constraints
        )

    def named(key: str) -> list[str]:
        return [f["name"] for f in fields if key in (f.get("metadata") or {})]

    for feature, key in (
        ("generatedColumns", "delta.generationExpression"),
        ("invariants", "delta.invariants"),
        ("identityColumns", "delta.identity.start"),
    ):
        if named(key):
            used[feature] = "columns " + ", ".join(named(key))
    not_null = [f["name"] for f in fields if f.get("nullable") is False]
    if not_null:
        used["notNull"] = "NOT NULL columns " + ", ".join(not_null)
    return used


def active_features(table: DeltaTable) -> dict[str, str]:
    """Every feature the table uses (name -> what shows it): those its protocol lists
    (reader and writer features), minus the conditional ones its metadata does not use,
    plus the ones a legacy protocol (no feature lists) uses through its metadata."""
    protocol = table.protocol()
    listed: dict[str, str] = {}
    for kind, names in (
        ("reader", protocol.reader_features or []),
        ("writer", protocol.writer_features or []),
    ):
        for name in names:
            listed.setdefault(name, f"a {kind} feature")
    used = _used(table)
    active = {
        name: used.get(name, how)
        for name, how in listed.items()
        if name not in _CONDITIONAL or name in used
    }
    for name, how in used.items():
        active.setdefault(name, how)
    return active


def _matching(table: DeltaTable | None, test: Callable[[FeatureRule], bool]) -> list[str]:
    """The active features of ``table`` whose known rule passes ``test``, sorted."""
    if table is None:
        return []
    rules = {name: FEATURES.get(name) for name in active_features(table)}
    return sorted(name for name, rule in rules.items() if rule is not None and test(rule))


def through_delta_spark(table: DeltaTable | None, use: Use = "append") -> list[str]:
    """The features of ``table`` that ingest honours for ``use`` only through Delta Spark
    (its transaction, its writer or its MERGE; empty: delta-rs does it all)."""
    return _matching(
        table, lambda rule: not rule.allows(use) and rule.allows(use, delta_spark=True)
    )


def committed_by_delta_spark(table: DeltaTable | None) -> list[str]:
    """The features of ``table`` for which every commit of ingest goes through Delta Spark's
    transaction (delta-rs cannot write such a table at all): its maintenance is skipped."""
    return _matching(
        table, lambda rule: "append" in rule.delta_spark and not rule.rows and not rule.append
    )


def rows_through_delta_spark(table: DeltaTable | None) -> list[str]:
    """The features of ``table`` for which an append's rows go to Delta Spark's writer."""
    return _matching(table, lambda rule: rule.rows)


def cut_writes_change_data(table: DeltaTable | None) -> bool:
    """Whether an overwrite's cut of ``table`` (Delta Spark's DELETE) writes change data
    files: a change feed without deletion vectors. A commit with such files is read from
    them alone, so the replayed rows must be written with theirs (Delta Spark's writer)."""
    if table is None or "changeDataFeed" not in active_features(table):
        return False
    return not _true(table.metadata().configuration, "delta.enableDeletionVectors")


def check_table(uri: str, table: DeltaTable | None, use: Use, *, delta_spark: bool = False) -> None:
    """Raises ``UnsupportedTableFeature`` if ``table`` (at ``uri``; None: not created yet,
    so ingest creates it) uses a feature ingest cannot honour for ``use``; ``delta_spark``:
    the commit can go through Delta Spark's transaction."""
    if table is None:
        return
    protocol = table.protocol()
    problems: list[str] = []
    if protocol.min_reader_version > _MAX_READER or protocol.min_writer_version > _MAX_WRITER:
        problems.append(
            f"protocol version reader {protocol.min_reader_version} / writer "
            f"{protocol.min_writer_version} (ingest knows up to {_MAX_READER} / {_MAX_WRITER})"
        )
    for name, how in sorted(active_features(table).items()):
        rule = FEATURES.get(name)
        if rule is None:
            problems.append(
                f"table feature '{name}' ({how}), which ingest does not know; it was never "
                f"tested with ingest's writes"
            )
        elif not rule.allows(use, delta_spark=delta_spark):
            problems.append(f"table feature '{name}' ({how}): {rule.why}")
    if problems:
        doing = {
            "append": "append to this table",
            "upsert": "upsert into this table",
            "compact": "compact this table's files (set maintenance.compact = false to run "
            "without compaction)",
            "overwrite": "cut a range out of this table (replay --overwrite)",
        }[use]
        raise UnsupportedTableFeature(
            f"{uri}: ingest cannot {doing}: "
            + "; ".join(problems)
            + " (docs/delta-compat.md lists what each mode supports)"
        )
