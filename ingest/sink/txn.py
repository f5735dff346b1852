"""The Delta ``txn`` app id of one source partition of one table, fed by one group,
the arithmetic of txn versions, and the txn actions and properties each commit carries.

Derivation (stable across releases; changing it would break exactly-once for
every existing table)::

    app_id = "ingest:" + topic + ":" + partition + ":"
             + sha256(json.dumps([normalize_uri(table_uri), group, topic, partition]))[:24]

The readable prefix names the partition in ``DESCRIBE HISTORY``; the digest
binds the table and the group (any string, so it cannot be spelled into the id
unambiguously). The URI is normalized (``storage.normalize_uri``: absolute
local paths, no trailing slash, ``s3a`` = ``s3``) so that spellings of one table
agree. The dead-letter table carries the same app ids (derived from the MAIN
table's URI): its txn versions say which offsets' dead letters it already holds.

A txn version is the last offset of its partition a table holds; None means no
txn yet (nothing held). One more app id, ``REWRITE_GUARD``, is no partition's:
its txn makes commits that remove files conflict with each other (``delta.py``).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction
from deltalake.transaction import AddAction, RemoveAction

from ingest.sink.storage import normalize_uri

__all__ = [
    "COMMIT_TOKEN_KEY",
    "REWRITE_GUARD",
    "MergeClauses",
    "MergeDone",
    "TableCommitter",
    "advances",
    "app_id",
    "commit_properties",
    "guard_transaction",
    "newer_txns",
    "now_ms",
    "operation_metrics",
    "or_minus_one",
]

# commitInfo's key for a commit's token: its version is found again by it.
COMMIT_TOKEN_KEY = "ingest.commit"

# The app id of the txn every commit that removes a snapshot's files carries (see
# ``guard_transaction`` below); no partition's app id can be spelled so.
REWRITE_GUARD = "ingest:rewrite-guard"


@dataclass(frozen=True)
class MergeClauses:
    """A MERGE of source ``s`` into target ``t`` (an upsert's: ``merge.py``; an insert-only
    append's: ``inserts.py``): the ``columns`` it writes; ``update_when`` and
    ``delete_when``: None when no matched row updates or deletes; ``txn``: the one txn action
    (app id, version) its commit carries."""

    on: str
    update_when: str | None
    delete_when: str | None
    insert_when: str | None
    columns: tuple[str, ...]
    txn: tuple[str, int]


@dataclass(frozen=True)
class MergeDone:
    """A MERGE's commit: its version, and the rows it inserted, updated and deleted."""

    version: int
    inserted: int
    updated: int
    deleted: int


class TableCommitter(Protocol):
    """Another writer's transaction that commits a batch's files and txn actions, for a
    table whose features delta-rs cannot write (``metadata/features.through_delta_spark``):
    Delta Spark's, in the driver JVM (``ingest/engines/spark/delta_commit.py``). The
    engine that has one hands it to the batch (``batch.Batch.committer``)."""

    def commit(
        self,
        uri: str,
        adds: Sequence[AddAction],
        txns: Mapping[str, int],
        *,
        read_version: int,
        read_txns: Mapping[str, int | None],
    ) -> int | None:
        """Commits ``adds`` with ``txns`` (app id -> version) in one transaction, if the
        table is still at ``read_version`` with the txn versions ``read_txns`` the files
        were filtered with: the committed version; None when a concurrent commit won
        (the caller reloads and tries again)."""
        ...

    def replace(
        self,
        uri: str,
        adds: Sequence[AddAction],
        txns: Mapping[str, int],
        *,
        condition: str,
        read_version: int,
        read_txns: Mapping[str, int | None],
        rows: pa.Table | None = None,
    ) -> tuple[int, int] | None:
        """As ``commit``, and the same transaction deletes the table's rows that match
        ``condition`` (Spark SQL on the table's columns) as the writer's own DELETE does,
        and adds ``rows`` as the writer's own write does (it checks the table's
        constraints and fills generated and identity columns): the committed version and
        the rows deleted; None when a concurrent commit won."""
        ...

    def merge(self, uri: str, rows: pa.Table, clauses: MergeClauses) -> MergeDone | None:
        """MERGEs ``rows`` into the table as ``clauses`` say, in one commit that carries
        ``clauses.txn`` (one partition's app id and version): what it did; None when a
        concurrent commit won (the caller reloads and tries again)."""
        ...

    def failing(self, rows: pa.Table, checks: Sequence[tuple[str, str]]) -> list[str | None]:
        """Per row of ``rows``, the label of the first check it fails (None: passes all);
        ``checks``: (label, Spark SQL boolean expression), failed when not true (a null
        fails, as in Delta's constraint checks)."""
        ...

    def create_table(
        self,
        name: str,
        uri: str,
        schema_json: str,
        partition_by: Sequence[str],
        properties: Mapping[str, str],
    ) -> None:
        """Creates the table ``name`` of Spark's catalog at ``uri``, with the columns of
        ``schema_json`` (a Delta struct type) and no rows, registered as Spark registers a
        table (``ingest/engines/spark/catalog.py``); or finds it created by a rival.
        ``SinkError`` when the name holds a table elsewhere."""
        ...

    def add_columns(self, uri: str, schema_json: str) -> None:
        """Adds the columns of ``schema_json`` (a Delta struct type) to the table, as
        Delta Spark's ALTER TABLE ADD COLUMNS does (new physical names and ids under
        column mapping)."""
        ...


def app_id(table_uri: str, group: str, topic: str, partition: int) -> str:
    identity = json.dumps([normalize_uri(table_uri), group, topic, int(partition)])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return f"ingest:{topic}:{int(partition)}:{digest}"


def or_minus_one(version: int | None) -> int:
    """The last offset a txn version covers: -1 when there is no txn."""
    return -1 if version is None else version


def advances(version: int, current: int | None) -> bool:
    """Whether txn ``version`` moves past ``current`` (None: no txn yet)."""
    return current is None or version > current


def newer_txns(txns: Mapping[str, int], current: Mapping[str, int | None]) -> dict[str, int]:
    """The txns (app id -> version) that move past ``current``: a commit never moves
    a version back."""
    return {app: version for app, version in txns.items() if advances(version, current.get(app))}


def now_ms() -> int:
    """A txn action's ``lastUpdated``: when the commit holding it was made."""
    return int(time.time() * 1000)


def commit_properties(
    token: str,
    txns: Mapping[str, int],
    *,
    guarded: DeltaTable | None = None,
    actions: Sequence[AddAction | RemoveAction] | None = None,
    read: bool = False,
) -> CommitProperties:
    """A commit's properties: its token (to find its version again) and its txn actions;
    with ``guarded`` (the snapshot the commit was planned on), also the rewrite guard's
    txn (``guard_transaction``); with ``actions`` (a commit of add/remove actions), the
    ``operationMetrics`` Delta Spark's DESCRIBE HISTORY shows (``operation_metrics``)."""
    transactions = [Transaction(app, v, last_updated=now_ms()) for app, v in sorted(txns.items())]
    if guarded is not None:
        transactions.append(guard_transaction(guarded))
    metadata: dict[str, Any] = {COMMIT_TOKEN_KEY: token}
    if actions is not None:
        metadata.update(operation_metrics(actions, read=read))
    return CommitProperties(custom_metadata=metadata, app_transactions=transactions)


def operation_metrics(
    actions: Sequence[AddAction | RemoveAction], *, read: bool = False
) -> dict[str, Any]:
    """commitInfo entries for a commit of ``actions``: ``operationMetrics`` named as Delta
    Spark names a WRITE's (``numFiles``, ``numOutputRows``, ``numOutputBytes``; with
    removes, ``numRemovedFiles`` and ``numRemovedBytes``), string values as Spark writes
    them; and ``isBlindAppend`` when the commit only adds files and (``read`` false) read no
    data: Spark's conflict checks then let a concurrent DELETE or UPDATE through, as with
    its own appends. delta-rs writes no metrics for ``create_write_transaction``."""
    adds = [a for a in actions if isinstance(a, AddAction)]
    removes = [a for a in actions if isinstance(a, RemoveAction)]
    metrics = {
        "numFiles": len(adds),
        "numOutputRows": sum(int(json.loads(a.stats or "{}").get("numRecords", 0)) for a in adds),
        "numOutputBytes": sum(a.size for a in adds),
    }
    if removes:
        metrics["numRemovedFiles"] = len(removes)
        metrics["numRemovedBytes"] = sum(r.size or 0 for r in removes)
    return {
        "operationMetrics": {key: str(value) for key, value in metrics.items()},
        "isBlindAppend": not removes and not read,
    }


def guard_transaction(table: DeltaTable) -> Transaction:
    """The txn action every commit that removes files of the table's snapshot carries
    (an overwrite's cut, a MERGE, a compaction), under the one app id ``REWRITE_GUARD``.

    delta-rs does not fail a commit whose removed files a concurrent commit removed
    with ``dataChange=false`` (a compaction): both would go through, and the rows of
    those files would then be in the table twice (the compacted copy, and the cut's
    or the merge's remainder). Two such commits carrying the same app id conflict
    instead (delta-rs checks concurrent txn actions by app id), so the loser retries
    from the new snapshot. Appends remove nothing and do not carry it: a compaction
    never makes a batch's commit retry."""
    return Transaction(
        REWRITE_GUARD, or_minus_one(table.transaction_version(REWRITE_GUARD)) + 1, now_ms()
    )
