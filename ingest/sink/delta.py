"""One Delta table seen by the driver: txn versions, schema, and the one commit per batch.

``DeltaTarget.commit_files`` commits files written elsewhere (by Spark tasks,
with pyarrow) in ONE delta-rs transaction together with one ``txn`` action per
source partition. The loop it runs, until the commit lands or gives up:

1. Load the table (none yet: it will be created by this very commit, with the
   batch's schema and partition columns).
2. Read the txn version of every app id of the batch. Where a version moved
   past what the batch was filtered with (a concurrent writer of the same
   partitions won a race), re-filter: drop the files whose rows are all covered
   now, rewrite the ones that are partly covered (deleting the old file). A file
   that does not say which offsets it holds cannot be re-filtered:
   ``StaleBatchError`` tells the caller to redo the batch.
3. Keep only txn versions above the table's (never move a version back). With
   no file and no txn left, the batch is already durable: nothing is committed.
4. Check that every file exists with its size (delta-rs does not), evolve the
   schema additively if the batch has new columns, commit.
5. ``CommitFailedError`` (a concurrent transaction conflicted, e.g. one that
   wrote the same app ids) or a lost creation race: back off and go to 1.

``DeltaTarget.commit_replacing`` is the overwrite form (``ingest replay
--overwrite``): in the same single transaction it also removes every row the
table holds in the batch's offset ranges. Files wholly inside a range are
removed; files that mix rows inside and outside are rewritten without the
inside rows. The txn versions never move back, and every partition's txn is
written even when its version stays, so a concurrent writer of the same
partitions conflicts with the replacement instead of racing it.

A commit that gives up deletes the files it would have added, so a lost race
leaves no orphans behind. The committed version is found in the history by a
token the commit carries in its commitInfo (``ingest.commit``).
"""

from __future__ import annotations

import json
import logging
import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Field, Schema, Transaction
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction, create_table_with_add_actions

from ingest.errors import SinkError
from ingest.sink.files import FOOTER_KEY, DataFile, delta_stats, sources_of, write_parquet
from ingest.sink.storage import TableLocation

__all__ = [
    "CommitOutcome",
    "DeltaTarget",
    "StaleBatchError",
    "now_ms",
    "schema_changes",
    "txn_times",
]

log = logging.getLogger("ingest.sink")

COMMIT_TOKEN_KEY = "ingest.commit"
_INT64_MIN = -(2**63)
PartitionKey = tuple[str, int]


class StaleBatchError(SinkError):
    """A concurrent writer covered offsets of this batch and its files cannot be
    re-filtered in place: the caller must redo the batch from its segments."""


@dataclass(frozen=True)
class CommitOutcome:
    """What a commit did: the table version holding the batch (None when nothing
    needed committing and the table does not exist), the files and rows it
    added, and the txn version of every app id afterwards."""

    version: int | None
    files: tuple[DataFile, ...]
    rows: int
    txn_versions: Mapping[str, int | None]
    attempts: int
    committed: bool
    dropped_rows: int = 0
    stage_seconds: Mapping[str, float] = field(default_factory=dict)


def now_ms() -> int:
    """A txn action's ``lastUpdated``: when the commit holding it was made."""
    return int(time.time() * 1000)


# How far back ``txn_times`` reads commit files before it gives up on an app id
# (checkpoints, written every 100 commits by default, cut the walk short).
_TXN_WALK_LIMIT = 500


def txn_times(location: TableLocation, app_ids: Sequence[str]) -> dict[str, int | None]:
    """When each app id's txn version was last written (ms since the epoch), read
    from the Delta log: its ``lastUpdated``, else the timestamp of the commit that
    holds it. None: no such txn (or older than the walk reaches)."""
    found: dict[str, int | None] = dict.fromkeys(app_ids)
    wanted = set(app_ids)
    filesystem, root = location.filesystem()
    log_dir = f"{root.rstrip('/')}/_delta_log"
    try:
        listing = filesystem.get_file_info(pafs.FileSelector(log_dir))
    except (FileNotFoundError, OSError):
        return found
    commits = sorted(
        (int(info.base_name[:20]), info.path)
        for info in listing
        if info.base_name.endswith(".json") and info.base_name[:20].isdigit()
    )
    checkpoints = sorted(
        (int(info.base_name[:20]), info.path)
        for info in listing
        if ".checkpoint" in info.base_name and info.base_name.endswith(".parquet")
    )
    newest_checkpoint = checkpoints[-1][0] if checkpoints else -1
    for version, path in reversed(commits[-_TXN_WALK_LIMIT:]):
        if not wanted or version <= newest_checkpoint:
            break
        with filesystem.open_input_stream(path) as stream:
            lines = stream.read().decode().splitlines()
        stamp: int | None = None
        seen: dict[str, int | None] = {}
        for line in lines:
            if '"commitInfo"' in line:
                stamp = json.loads(line)["commitInfo"].get("timestamp")
            elif '"txn"' in line:
                txn = json.loads(line)["txn"]
                if txn.get("appId") in wanted:
                    seen[txn["appId"]] = txn.get("lastUpdated")
        for app, updated in seen.items():
            found[app] = updated if updated is not None else stamp
            wanted.discard(app)
    if wanted and checkpoints:
        parts = [p for v, p in checkpoints if v == newest_checkpoint]
        for part in parts:
            with filesystem.open_input_file(part) as handle:
                column = pq.read_table(handle, columns=["txn"]).column("txn")
            for txn in column.to_pylist():
                if txn and txn.get("appId") in wanted:
                    found[txn["appId"]] = txn.get("lastUpdated")
    return found


def _type_json(delta_field: Field) -> object:
    return json.loads(delta_field.to_json())["type"]


def schema_changes(table_schema: Schema, batch_schema: pa.Schema) -> list[Field]:
    """The columns a batch adds to a table; raises ``SinkError`` naming every column
    whose type differs (only nullable top-level additions are evolved)."""
    existing = {f.name: f for f in table_schema.fields}
    incoming = Schema.from_arrow(batch_schema).fields
    clashes = [
        f"{f.name} (table {json.dumps(_type_json(existing[f.name]))}, "
        f"batch {json.dumps(_type_json(f))})"
        for f in incoming
        if f.name in existing and _type_json(f) != _type_json(existing[f.name])
    ]
    if clashes:
        raise SinkError(
            "the batch's schema is incompatible with the table's; columns: " + "; ".join(clashes)
        )
    return [Field(f.name, f.type, nullable=True) for f in incoming if f.name not in existing]


def nullable_schema(schema: pa.Schema) -> pa.Schema:
    """Every top-level column nullable: older rows lack new columns, and Delta's
    NOT NULL would be an invariant the files written here do not promise."""
    return pa.schema([f.with_nullable(True) for f in schema], metadata=None)


class DeltaTarget:
    """One Delta table the driver commits to."""

    def __init__(
        self,
        location: TableLocation,
        *,
        partition_by: Sequence[str] = (),
        max_attempts: int = 20,
        backoff_seconds: float = 0.05,
        max_backoff_seconds: float = 2.0,
    ) -> None:
        self.location = location
        self.partition_by = tuple(partition_by)
        self.max_attempts = max_attempts
        self.backoff_seconds = backoff_seconds
        self.max_backoff_seconds = max_backoff_seconds

    def __repr__(self) -> str:
        return f"DeltaTarget({self.location.uri!r})"

    @property
    def uri(self) -> str:
        return self.location.uri

    # -- reading -----------------------------------------------------------------------

    def load(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self.location.delta_options())
        except TableNotFoundError:
            return None
        except DeltaError as exc:
            raise SinkError(f"{self.uri}: cannot load the table: {exc}") from exc

    @staticmethod
    def versions_in(table: DeltaTable | None, app_ids: Sequence[str]) -> dict[str, int | None]:
        if table is None:
            return dict.fromkeys(app_ids)
        return {app: table.transaction_version(app) for app in app_ids}

    def versions(self, app_ids: Sequence[str]) -> dict[str, int | None]:
        return self.versions_in(self.load(), app_ids)

    def check_partitioning(self, table: DeltaTable | None) -> None:
        if table is None:
            return
        existing = tuple(table.metadata().partition_columns)
        if existing != self.partition_by:
            raise SinkError(
                f"{self.uri} is partitioned by {list(existing)}, the configuration says "
                f"{list(self.partition_by)}"
            )

    # -- committing --------------------------------------------------------------------

    def create_empty(self, schema: pa.Schema) -> None:
        """Creates the table with no data and no txn, or finds it created by a rival.

        Data never rides in the creating commit: when two writers create the same table
        at once, delta-rs rebases the loser's create onto the winner's without checking
        txn actions (both creates "succeed"), which would land the same offsets twice.
        With no retries the loser is refused instead, and both then commit their data
        through create_write_transaction, whose conflict check sees the txn actions."""
        try:
            create_table_with_add_actions(
                self.uri,
                Schema.from_arrow(schema),
                [],
                mode="error",
                partition_by=list(self.partition_by) or None,
                storage_options=self.location.delta_options(),
                commit_properties=CommitProperties(max_commit_retries=0),
            )
        except CommitFailedError:
            log.info("%s: another writer created the table first", self.uri)
        except DeltaError as exc:
            if "already exists" not in str(exc):
                raise SinkError(f"{self.uri}: cannot create the table: {exc}") from exc
            log.info("%s: another writer created the table first", self.uri)

    def commit_files(
        self,
        files: Sequence[DataFile],
        txns: Mapping[str, int],
        schema: pa.Schema,
        *,
        planned: Mapping[str, int | None],
        app_id_of: Callable[[str, int], str],
    ) -> CommitOutcome:
        """Commits ``files`` with ``txns`` (app id -> last offset) in one transaction.

        ``planned`` are the txn versions the files were filtered with; ``app_id_of``
        maps a file's (topic, partition) to its app id."""
        pending = list(files)
        dropped = 0
        schema = nullable_schema(schema)
        # Set while a commit's outcome is unknown: its files must then stay.
        in_doubt = False
        try:
            for attempt in range(1, self.max_attempts + 1):
                table = self.load()
                self.check_partitioning(table)
                current = self.versions_in(table, list(txns))
                pending, lost = self._refilter(pending, planned, current, app_id_of, attempt)
                dropped += lost
                wanted = {
                    app: version
                    for app, version in txns.items()
                    if current.get(app) is None or version > current[app]  # type: ignore[operator]
                }
                if not pending and not wanted:
                    return CommitOutcome(
                        version=None if table is None else table.version(),
                        files=(),
                        rows=0,
                        txn_versions=current,
                        attempts=attempt,
                        committed=False,
                        dropped_rows=dropped,
                    )
                self._check_files(pending)
                if table is None:
                    self.create_empty(schema)
                    continue  # reload: the data goes through the conflict-checked path
                try:
                    if self.evolve(table, schema):
                        table = self.load() or table
                except CommitFailedError:
                    self._sleep(attempt)
                    continue
                in_doubt = True
                token = self._try_commit(
                    table, [f.add_action() for f in pending], wanted, attempt, "commit"
                )
                if token is None:
                    in_doubt = False
                    continue
                break
            else:
                raise SinkError(f"{self.uri}: no commit after {self.max_attempts} attempts")
        except BaseException:
            if in_doubt:
                log.error(
                    "%s: commit outcome unknown; keeping its %d files", self.uri, len(pending)
                )
            else:
                self.location.delete(f.path for f in pending)
            raise
        return self._committed(token, pending, {**current, **wanted}, attempt, dropped)

    def commit_replacing(
        self,
        files: Sequence[DataFile],
        txns: Mapping[str, int],
        schema: pa.Schema,
        *,
        ranges: Mapping[PartitionKey, tuple[int, int]],
    ) -> CommitOutcome:
        """Commits ``files`` and ``txns`` in one transaction that also removes the
        table's rows in ``ranges`` ((topic, partition) -> inclusive first and last
        offset). ``CommitOutcome.dropped_rows`` counts the rows it replaced."""
        pending = list(files)
        schema = nullable_schema(schema)
        in_doubt = False
        rewritten: list[DataFile] = []
        try:
            for attempt in range(1, self.max_attempts + 1):
                table = self.load()
                if table is None:
                    self.create_empty(schema)
                    continue
                self.check_partitioning(table)
                names = {f.name for f in table.schema().fields}
                missing = sorted({"topic", "partition", "offset"} - names)
                if missing:
                    raise SinkError(
                        f"{self.uri}: rows can be replaced only in a table that keeps the "
                        f"columns topic, partition and offset; it lacks {missing}"
                    )
                current = self.versions_in(table, list(txns))
                # Never back, and always written: a rival of these partitions conflicts.
                wanted = {
                    app: max(version, _or_minus_one(current[app])) for app, version in txns.items()
                }
                try:
                    if self.evolve(table, schema):
                        continue  # reload: the cut is taken from the evolved snapshot
                except CommitFailedError:
                    self._sleep(attempt)
                    continue
                self._check_files(pending)
                removes, rewritten, replaced = self._cut_ranges(table, ranges, attempt)
                actions: list[AddAction | RemoveAction] = [
                    *removes,
                    *(f.add_action() for f in rewritten),
                    *(f.add_action() for f in pending),
                ]
                in_doubt = True
                token = self._try_commit(table, actions, wanted, attempt, "replacing")
                if token is None:
                    in_doubt = False
                    self.location.delete(f.path for f in rewritten)
                    rewritten = []
                    continue
                break
            else:
                raise SinkError(f"{self.uri}: no commit after {self.max_attempts} attempts")
        except BaseException:
            if in_doubt:
                log.error(
                    "%s: commit outcome unknown; keeping its %d files",
                    self.uri,
                    len(pending) + len(rewritten),
                )
            else:
                self.location.delete(f.path for f in [*pending, *rewritten])
            raise
        log.info(
            "%s: replaced %d rows in %d files with %d rows",
            self.uri,
            replaced,
            len(removes),
            sum(f.rows for f in pending),
        )
        return self._committed(token, pending, {**current, **wanted}, attempt, replaced)

    def _committed(
        self,
        token: str,
        files: Sequence[DataFile],
        txn_versions: Mapping[str, int | None],
        attempts: int,
        dropped_rows: int,
    ) -> CommitOutcome:
        """The outcome of a commit that went through (found again by its token)."""
        return CommitOutcome(
            version=self._version_of(token),
            files=tuple(files),
            rows=sum(f.rows for f in files),
            txn_versions=txn_versions,
            attempts=attempts,
            committed=True,
            dropped_rows=dropped_rows,
        )

    def _try_commit(
        self,
        table: DeltaTable,
        actions: Sequence[AddAction | RemoveAction],
        txns: Mapping[str, int],
        attempt: int,
        what: str,
    ) -> str | None:
        """One commit of ``actions`` and ``txns``: the token it carries (find its version
        with ``_version_of``), or None when a concurrent commit won (after the backoff)."""
        token = uuid.uuid4().hex
        properties = CommitProperties(
            custom_metadata={COMMIT_TOKEN_KEY: token},
            app_transactions=[
                Transaction(app, v, last_updated=now_ms()) for app, v in sorted(txns.items())
            ],
        )
        try:
            table.create_write_transaction(
                list(actions),
                "append",
                table.schema(),
                partition_by=list(self.partition_by) or None,
                commit_properties=properties,
            )
        except CommitFailedError as exc:
            log.info("%s: %s attempt %d lost a race: %s", self.uri, what, attempt, exc)
            self._sleep(attempt)
            return None
        except DeltaError as exc:
            raise SinkError(f"{self.uri}: commit failed: {exc}") from exc
        return token

    def _cut_ranges(
        self,
        table: DeltaTable,
        ranges: Mapping[PartitionKey, tuple[int, int]],
        attempt: int,
    ) -> tuple[list[RemoveAction], list[DataFile], int]:
        """The remove actions, rewritten files and replaced row count that take
        every row in ``ranges`` out of ``table``'s current snapshot."""
        if not ranges:
            return [], [], 0
        listing = pa.table(table.get_add_actions(flatten=True))
        removes: list[RemoveAction] = []
        rewritten: list[DataFile] = []
        replaced = 0
        now_ms = int(time.time() * 1000)
        partition_columns = [c for c in listing.column_names if c.startswith("partition.")]
        filesystem, root = self.location.filesystem()
        for entry in listing.to_pylist():
            if not _may_hold(entry, ranges):
                continue
            with filesystem.open_input_file(f"{root}/{entry['path']}") as handle:
                rows = pq.read_table(handle)
            inside = _in_ranges(rows, ranges)
            hits = pc.sum(inside).as_py() or 0
            if not hits:
                continue
            replaced += hits
            described = _footer(rows.schema)
            partition_values = (
                described.partition_values
                if described is not None
                else tuple(
                    (column.removeprefix("partition."), _partition_text(entry[column]))
                    for column in partition_columns
                )
            )
            removes.append(
                RemoveAction(
                    entry["path"],
                    True,
                    now_ms,
                    size=int(entry["size_bytes"]),
                    partition_values=dict(partition_values) or None,
                )
            )
            if hits < rows.num_rows:
                remaining = rows.filter(pc.invert(inside))
                rewritten.append(
                    self._write_remainder(entry["path"], partition_values, remaining, attempt)
                )
        return removes, rewritten, replaced

    def commit_txns(self, txns: Mapping[str, int], schema: pa.Schema) -> CommitOutcome:
        """A commit holding only txn actions (e.g. after a merge that changed nothing)."""
        return self.commit_files(
            [], txns, schema, planned=dict.fromkeys(txns), app_id_of=lambda t, p: ""
        )

    def evolve(self, table: DeltaTable, schema: pa.Schema) -> bool:
        """Adds the batch's new columns to the table (a commit of its own)."""
        added = schema_changes(table.schema(), schema)
        if not added:
            return False
        log.info("%s: adding columns %s", self.uri, [f.name for f in added])
        table.alter.add_columns(added)
        return True

    # -- helpers -----------------------------------------------------------------------

    def _sleep(self, attempt: int) -> None:
        ceiling = min(self.max_backoff_seconds, self.backoff_seconds * 2 ** (attempt - 1))
        time.sleep(random.uniform(ceiling / 2, ceiling))

    def _version_of(self, token: str) -> int:
        table = self.load()
        assert table is not None
        for entry in table.history(limit=50):
            if entry.get(COMMIT_TOKEN_KEY) == token:
                return int(entry["version"])
        raise SinkError(f"{self.uri}: committed, but the commit is not in the last 50 versions")

    def _check_files(self, files: Sequence[DataFile]) -> None:
        if not files:
            return
        sizes = self.location.sizes(f.path for f in files)
        wrong = [
            f"{f.path} ({'missing' if sizes[f.path] is None else f'{sizes[f.path]} bytes'}, "
            f"expected {f.size})"
            for f in files
            if sizes[f.path] != f.size
        ]
        if wrong:
            raise SinkError(f"{self.uri}: data files to commit are not as written: {wrong}")

    def _refilter(
        self,
        files: list[DataFile],
        planned: Mapping[str, int | None],
        current: Mapping[str, int | None],
        app_id_of: Callable[[str, int], str],
        attempt: int,
    ) -> tuple[list[DataFile], int]:
        moved = {
            app
            for app, version in current.items()
            if version is not None and (planned.get(app) is None or version > planned[app])  # type: ignore[operator]
        }
        if not moved or not files:
            return files, 0
        kept: list[DataFile] = []
        dropped = 0
        for data_file in files:
            if not data_file.sources:
                raise StaleBatchError(
                    f"{self.uri}: a concurrent writer covered offsets of this batch and "
                    f"{data_file.path} does not say which offsets it holds"
                )
            cut: dict[PartitionKey, int] = {}
            for source in data_file.sources:
                app = app_id_of(source.topic, source.partition)
                version = current.get(app)
                if app in moved and version is not None and source.min_offset <= version:
                    cut[(source.topic, source.partition)] = version
            if not cut:
                kept.append(data_file)
                continue
            rewritten = self._rewrite(data_file, cut, attempt)
            self.location.delete([data_file.path])
            dropped += data_file.rows - (rewritten.rows if rewritten else 0)
            if rewritten is not None:
                kept.append(rewritten)
        log.info("%s: re-filtered after a concurrent commit; %d rows dropped", self.uri, dropped)
        return kept, dropped

    def _rewrite(
        self, data_file: DataFile, cut: Mapping[PartitionKey, int], attempt: int
    ) -> DataFile | None:
        """The file without rows at or below ``cut``'s offsets (None when none is left)."""
        if all(
            (s.topic, s.partition) in cut and s.max_offset <= cut[(s.topic, s.partition)]
            for s in data_file.sources
        ):
            return None
        filesystem, root = self.location.filesystem()
        with filesystem.open_input_file(f"{root}/{data_file.path}") as handle:
            rows = pq.read_table(handle)
        covered = _in_ranges(rows, {key: (_INT64_MIN, version) for key, version in cut.items()})
        remaining = rows.filter(pc.invert(covered))
        if remaining.num_rows == 0:
            return None
        return self._write_remainder(data_file.path, data_file.partition_values, remaining, attempt)

    def _write_remainder(
        self,
        path: str,
        partition_values: tuple[tuple[str, str | None], ...],
        remaining: pa.Table,
        attempt: int,
    ) -> DataFile:
        """``remaining`` written next to ``path`` as a new data file (with its footer)."""
        filesystem, root = self.location.filesystem()
        directory, _, name = path.rpartition("/")
        prefix = f"r{attempt}-{uuid.uuid4().hex[:8]}"
        relative = f"{directory}/{prefix}-{name}" if directory else f"{prefix}-{name}"
        described = DataFile(
            path=relative,
            size=0,
            partition_values=partition_values,
            rows=remaining.num_rows,
            stats=delta_stats(remaining),
            sources=sources_of(remaining),
            modification_time=0,
        )
        metadata = {**(remaining.schema.metadata or {}), FOOTER_KEY: described.to_json().encode()}
        with filesystem.open_output_stream(f"{root}/{relative}") as stream:
            write_parquet(remaining.replace_schema_metadata(metadata), stream)
        size = filesystem.get_file_info(f"{root}/{relative}").size
        return DataFile(
            path=relative,
            size=int(size),
            partition_values=partition_values,
            rows=remaining.num_rows,
            stats=described.stats,
            sources=described.sources,
            modification_time=int(time.time() * 1000),
        )


def _may_hold(entry: Mapping[str, object], ranges: Mapping[PartitionKey, tuple[int, int]]) -> bool:
    """Whether a file's statistics allow rows in ``ranges`` (no statistics: maybe)."""
    low_topic, high_topic = entry.get("min.topic"), entry.get("max.topic")
    low_part, high_part = entry.get("min.partition"), entry.get("max.partition")
    low_offset, high_offset = entry.get("min.offset"), entry.get("max.offset")
    for (topic, partition), (first, last) in ranges.items():
        topic_out = (
            isinstance(low_topic, str)
            and isinstance(high_topic, str)
            and not low_topic <= topic <= high_topic
        )
        partition_out = (
            isinstance(low_part, int)
            and isinstance(high_part, int)
            and not low_part <= partition <= high_part
        )
        offsets_out = (
            isinstance(low_offset, int)
            and isinstance(high_offset, int)
            and (high_offset < first or low_offset > last)
        )
        if topic_out or partition_out or offsets_out:
            continue
        return True
    return False


def _footer(schema: pa.Schema) -> DataFile | None:
    """How ingest described a data file it wrote (None for another writer's file)."""
    raw = (schema.metadata or {}).get(FOOTER_KEY)
    return None if raw is None else DataFile.from_json(raw)


def _in_ranges(rows: pa.Table, ranges: Mapping[PartitionKey, tuple[int, int]]) -> Any:
    """A mask of the rows whose (topic, partition, offset) falls in ``ranges``
    ((topic, partition) -> inclusive first and last offset)."""
    topic, partition, offset = rows.column("topic"), rows.column("partition"), rows.column("offset")
    inside: Any = None
    for (name, index), (first, last) in ranges.items():
        hit = pc.and_(
            pc.and_(pc.equal(topic, name), pc.equal(partition, index)),
            pc.and_(pc.greater_equal(offset, first), pc.less_equal(offset, last)),
        )
        hit = pc.fill_null(hit, False)
        inside = hit if inside is None else pc.or_(inside, hit)
    return inside if inside is not None else pa.array(np.zeros(rows.num_rows, bool))


def _or_minus_one(version: int | None) -> int:
    return -1 if version is None else version


def _partition_text(value: object) -> str | None:
    """A partition value as the Delta log writes it (strings; None for null)."""
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)
