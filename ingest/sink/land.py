"""The landing protocol: one batch of segments into one Delta table, exactly once.

``landing(batch)`` is a generator, sans-I/O for the data files: it yields a
``WriteRequest``, the engine that drives it (``ingest.engines.drive``) writes those files
with its tasks and sends back ``WrittenFiles``, and it returns the ``BatchResult``. The
sink never calls up into an engine; the rest is here.
Steps, each timed in ``BatchResult.stage_seconds`` (the names are metric labels):

1. ``plan``: read the txn version of every source partition from the table and
   from the dead-letter table (an overwrite reads none: it writes its whole
   range again); segments whose records are all at or below the table's version
   are left out, and the writer plans its tasks for the rest.
2. ``spark``: the engine's tasks (planned and run between the yield and the send) read, filter (what each table holds already),
   decode and write the data files and the dead letters they find. They return
   the files, and the rows a SQL transform marked in ``_dead_letter``.
3. ``dead_letters``: the driver's dead letters (corrupt batches, from their raw
   bytes; rows the transform marked; rows of an upsert without a merge key, both
   from their raw records) are written, and all of the batch's dead letters are
   committed to the dead-letter table FIRST, in one transaction carrying the
   batch's txn actions (same app ids).
4. ``commit``: the data files and the txn actions in ONE transaction on the
   table (append; with ``overwrite`` the same transaction removes the rows the
   table holds in the batch's offset ranges), or a MERGE with them (upsert: the
   rows are staged under ``_ingest_staging/<token>`` in the table's location). A table
   with constraints, generated or identity columns, on the Spark engine: its rows are
   staged too, those that break a constraint become dead letters in step 3, and the
   others go to Delta Spark (append: an insert-only MERGE, ``inserts.py``) or to the MERGE.
   This commit makes the batch durable: the supervisor commits Kafka offsets
   only after it. The fault point ``before_delta_commit`` fires just before it.

Dead-letter guarantee. delta-rs commits one table per transaction, so the two
tables cannot change atomically together. The order makes it exact anyway:
every dead letter of offsets up to the table's txn version V is in the
dead-letter table, because its commit came before the table's. A crash between
the two commits leaves dead letters whose good rows are not yet in the table;
the replay re-reads the same segments, the dead-letter table's own txn versions
drop the dead letters it already holds, and the table's commit completes the
batch. So each bad record lands once in the dead-letter table, each good one
once in the table (replays under the same configuration decode alike), and
Kafka offsets move only past both. The dead-letter table is committed only for
batches that have dead letters; its txn version for a partition therefore
means "every dead letter up to here is in", never "the batch is durable".

Orphans. Until a commit takes them over (a commit that gives up deletes its own
files, see ``delta.py``), the files written for an attempt are deleted when it
fails; an upsert's staged files are deleted whatever happens. A writer whose
run fails deletes the files it knows it wrote.

Stale batches. When a concurrent writer covered offsets of files that do not
say which offsets they hold, the commit raises ``StaleBatchError`` and the batch
is redone from its segments (up to 5 times in a row).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
import uuid
from collections.abc import Generator, Mapping, Sequence

import pyarrow as pa

from ingest.errors import ConfigError, SinkError
from ingest.faults import fault_point
from ingest.protocol.partition import Partition
from ingest.sink.batch import Batch, BatchResult, WriteRequest, WrittenFiles
from ingest.sink.deadletter import (
    DEAD_LETTER_SCHEMA,
    STAGE_DECODE,
    STAGE_TRANSFORM,
    Rejected,
    corrupt_dead_letters,
    read_corrupt_raw,
    rejected_dead_letters,
)
from ingest.sink.delta import CommitOutcome, DeltaTarget
from ingest.sink.files import DataFile, write_data_files
from ingest.sink.inserts import checks_of, insert
from ingest.sink.maintenance.rewrite import StaleBatchError
from ingest.sink.merging.merge import upsert
from ingest.sink.merging.staged import upsert_source
from ingest.sink.metadata.evolution import mapping_of
from ingest.sink.metadata.features import (
    check_table,
    cut_writes_change_data,
    rows_through_delta_spark,
)
from ingest.sink.metadata.mapping import ColumnMapping
from ingest.sink.overwrite import commit_replacing
from ingest.sink.storage import TableLocation
from ingest.sink.table_config import DELETE_COLUMN
from ingest.sink.txn import app_id, or_minus_one

__all__ = ["STAGING", "Landing", "landing"]

log = logging.getLogger("ingest.sink")

STAGING = "_ingest_staging"
_STALE_ATTEMPTS = 5


# Yields what to write, is sent what was written, returns the batch's result.
Landing = Generator[WriteRequest, WrittenFiles, BatchResult]


class _Stages:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._start = time.perf_counter()

    def lap(self, name: str, since: float) -> float:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - since
        return now

    def done(self) -> dict[str, float]:
        self.seconds["total"] = time.perf_counter() - self._start
        return dict(self.seconds)


def landing(batch: Batch) -> Landing:
    """Lands ``batch`` in its table, its files written by whoever drives it (see the
    module docstring); a stale batch is redone from its segments."""
    for attempt in range(1, _STALE_ATTEMPTS + 1):
        landing = _Landing(batch)
        try:
            result = yield from landing.run()
        except StaleBatchError as exc:
            log.info("%s: redoing the batch: %s", batch.table.uri, exc)
            continue
        landing.main.release()  # the next batch's load starts from these snapshots
        landing.dead.release()
        return dataclasses.replace(result, attempts=attempt)
    raise SinkError(f"{batch.table.uri}: the batch went stale {_STALE_ATTEMPTS} times in a row")


class _Landing:
    """One attempt at landing a batch: its tables, app ids and txn actions."""

    def __init__(self, batch: Batch) -> None:
        config = batch.table
        self.batch = batch
        self.config = config
        self.main = DeltaTarget(
            TableLocation.of(config.uri, config.storage_options),
            partition_by=config.partition_by,
            properties=config.properties,
            committer=batch.committer,
            name=config.name,
        )
        self.dead = DeltaTarget(
            TableLocation.of(config.dead_letters, config.dead_letter_options),
            committer=batch.committer,
            name=config.dead_letter_name,
        )
        self.apps = {key: app_id(config.uri, config.group, *key) for key in batch.partitions()}
        last = batch.last_offsets()
        self.txns = {self.apps[key]: last[key] for key in self.apps}
        self.upserting = config.mode == "upsert"
        # Rows handed to Delta Spark's writer, and the checks they pass first (inserts.py).
        self.inserting = False
        self.checks: list[tuple[str, str]] = []
        self.token = uuid.uuid4().hex[:16]
        self.mapping: ColumnMapping | None = None  # the table's, as planned

    @property
    def staged(self) -> bool:
        """The batch's rows are staged and read back in the driver (not committed as
        written): an upsert's, and an append's that Delta Spark writes."""
        return self.upserting or self.inserting

    def app_id_of(self, topic: str, partition: int) -> str:
        return self.apps.get(Partition(topic, partition)) or app_id(
            self.config.uri, self.config.group, topic, partition
        )

    def run(self) -> Landing:
        batch, main, dead = self.batch, self.main, self.dead
        stages = _Stages()
        started = time.perf_counter()
        planned, dead_planned = self._planned()
        request = self._request(planned, dead_planned)
        started = stages.lap("plan", started)

        data_files: list[DataFile] = []
        dead_files: list[DataFile] = []
        # Until a commit takes them over (and cleans up after itself), files written
        # for this attempt are deleted if it fails.
        dead_handed_over = main_handed_over = False
        try:
            written = yield request  # the engine's tasks write the files
            data_files.extend(written.data)
            dead_files.extend(written.dead)
            started = stages.lap("spark", started)  # the engine's tasks (a metric label)

            extra, source = self._driver_dead_letters(written, request)
            if extra:
                dead_files.extend(
                    write_data_files(
                        pa.concat_tables(extra),
                        dead.location,
                        name=f"part-{self.token}-driver-dead",
                    )
                )
            dead_handed_over = True
            dead_outcome = self._commit_dead_letters(dead_files, dead_planned)
            started = stages.lap("dead_letters", started)

            fault_point("before_delta_commit")
            main_handed_over = True
            outcome = self._commit_table(data_files, written.schema, source, planned)
            stages.lap("commit", started)
        except BaseException:
            if not dead_handed_over:
                dead.location.delete(f.path for f in dead_files)
            if not main_handed_over and not self.staged:
                main.location.delete(f.path for f in data_files)
            raise
        finally:
            if self.staged:
                main.location.delete_dir(f"{STAGING}/{self.token}")
        return BatchResult(
            table_version=outcome.version,
            dead_letter_version=None if dead_outcome is None else dead_outcome.version,
            durable_offsets={key: outcome.txn_versions.get(app) for key, app in self.apps.items()},
            rows_written=outcome.rows,
            dead_letters=0 if dead_outcome is None else dead_outcome.rows,
            stage_seconds=stages.done(),
            path=written.path,
            files=len(outcome.files),
            replaced_rows=outcome.dropped_rows if batch.overwrite else 0,
            deleted_rows=outcome.deleted_rows,
        )

    def _planned(self) -> tuple[dict[str, int | None], dict[str, int | None]]:
        """The txn versions of the table and of the dead-letter table (by app id) the
        batch is filtered with."""
        table = self.main.load()
        # A feature turned on since the run started stops it before this batch writes.
        check_table(
            self.config.uri,
            table,
            "upsert" if self.upserting else "append",
            delta_spark=self.batch.committer is not None,
        )
        if self.batch.overwrite:
            check_table(
                self.config.uri, table, "overwrite", delta_spark=self.batch.committer is not None
            )
        self.main.check_partitioning(table)
        self.mapping = mapping_of(table)
        if table is not None and self.batch.committer is not None:
            # Rows that break the table's constraints become dead letters (both modes).
            checked = bool(rows_through_delta_spark(table))
            # A cut that writes change data: the replayed rows need theirs too.
            changes = self.batch.overwrite and cut_writes_change_data(table)
            self.inserting = (checked or changes) and not self.upserting
            self.checks = checks_of(table) if checked else []
        apps = list(self.apps.values())
        if not self.batch.overwrite:
            return DeltaTarget.versions_in(table, apps), self.dead.versions(apps)
        if self.upserting:
            raise ConfigError(
                "applies to append mode; an upsert replay MERGEs, which already replaces",
                key="--overwrite",
            )
        # Everything in range is written again; the commits take the old rows out.
        return dict.fromkeys(apps), dict.fromkeys(apps)

    def _request(
        self, planned: Mapping[str, int | None], dead_planned: Mapping[str, int | None]
    ) -> WriteRequest:
        skip = {key: planned[app] for key, app in self.apps.items()}
        return WriteRequest(
            token=self.token,
            segments=tuple(
                s
                for s in self.batch.segments
                if s.record_count
                and s.last_offset > or_minus_one(skip[Partition(s.topic, s.partition)])
            ),
            skip_through=skip,
            dead_skip_through={key: dead_planned[app] for key, app in self.apps.items()},
            table=self.main.location,
            dead=self.dead.location,
            partition_by=() if self.staged else self.config.partition_by,
            prefix=f"{STAGING}/{self.token}" if self.staged else "",
            segment_options=dict(self.batch.segment_storage_options),
            ingest_time=dt.datetime.now(dt.UTC),
            mapping=None if self.staged else self.mapping,
        )

    def _driver_dead_letters(
        self, written: WrittenFiles, request: WriteRequest
    ) -> tuple[list[pa.Table], pa.Table | None]:
        """The dead letters found on the driver (corrupt batches, transform rejects,
        null merge keys; non-empty tables), and an upsert's rows to merge."""
        batch, config = self.batch, self.config
        skip, dead_skip = request.skip_through, request.dead_skip_through
        extra: list[pa.Table] = []
        corrupt = [
            c
            for c in batch.corrupt
            if c.first_offset > or_minus_one(skip[Partition(c.topic, c.partition)])
            and c.first_offset > or_minus_one(dead_skip[Partition(c.topic, c.partition)])
        ]
        if corrupt:
            extra.append(
                corrupt_dead_letters(
                    [(c, read_corrupt_raw(c.uri, batch.segment_storage_options)) for c in corrupt],
                    ingest_time=request.ingest_time,
                )
            )
        if written.rejected:
            extra.append(self._rejected(written.rejected, STAGE_TRANSFORM, request))
        source = None
        stage = STAGE_TRANSFORM if config.transform else STAGE_DECODE
        if self.inserting:
            source, _ = upsert_source(self.main.location, written.data, written.schema, [])
        if self.upserting:
            source, keyless = upsert_source(
                self.main.location,
                written.data,
                written.schema,
                config.merge_keys,
                deletes=config.deletes,
                latest_only=not self.checks,
            )
            if keyless is not None:
                message = f"a merge key is null ({', '.join(config.merge_keys)})"
                deleting = (
                    keyless.column(DELETE_COLUMN).to_pylist()
                    if DELETE_COLUMN in keyless.column_names
                    else [False] * keyless.num_rows
                )
                rejected = [
                    (t, p, o, f"a delete: {message}" if d else message)
                    for t, p, o, d in zip(
                        keyless.column("topic").to_pylist(),
                        keyless.column("partition").to_pylist(),
                        keyless.column("offset").to_pylist(),
                        deleting,
                        strict=True,
                    )
                ]
                extra.append(self._rejected(rejected, stage, request))
        if source is not None and self.checks:
            source, failed = self._checked(source)
            if failed:
                extra.append(self._rejected(failed, stage, request))
        return [t for t in extra if t.num_rows], source

    def _checked(self, rows: pa.Table) -> tuple[pa.Table, list[Rejected]]:
        """``rows`` that pass the table's checks, and the others as rejects naming the
        check each fails."""
        assert self.batch.committer is not None
        failing = self.batch.committer.failing(rows, self.checks)
        bad = [i for i, label in enumerate(failing) if label is not None]
        if not bad:
            return rows, []
        keys = rows.select(["topic", "partition", "offset"]).take(bad).to_pylist()
        rejected = [
            (k["topic"], k["partition"], k["offset"], f"violates the table's {failing[i]}")
            for k, i in zip(keys, bad, strict=True)
        ]
        return rows.filter(pa.array([label is None for label in failing])), rejected

    def _rejected(
        self, rejected: Sequence[Rejected], stage: str, request: WriteRequest
    ) -> pa.Table:
        return rejected_dead_letters(
            self.batch.segments,
            rejected,
            stage,
            skip_through=request.dead_skip_through,
            storage_options=self.batch.segment_storage_options,
            ingest_time=request.ingest_time,
        )

    def _commit_dead_letters(
        self, files: Sequence[DataFile], planned: Mapping[str, int | None]
    ) -> CommitOutcome | None:
        """The dead-letter table's commit (None: none was needed)."""
        if self.batch.overwrite:
            if files or self.dead.load() is not None:
                return commit_replacing(
                    self.dead,
                    files,
                    self.txns,
                    DEAD_LETTER_SCHEMA,
                    ranges=self.batch.offset_ranges(),
                )
            return None
        if files:
            return self.dead.commit_files(
                files, self.txns, DEAD_LETTER_SCHEMA, planned=planned, app_id_of=self.app_id_of
            )
        return None

    def _commit_table(
        self,
        files: Sequence[DataFile],
        schema: pa.Schema,
        source: pa.Table | None,
        planned: Mapping[str, int | None],
    ) -> CommitOutcome:
        """The table's commit: the one that makes the batch durable."""
        if self.upserting:
            assert source is not None
            return upsert(
                self.main,
                source,
                merge_keys=self.config.merge_keys,
                txns=self.txns,
                app_id_of=self.app_id_of,
            )
        if self.batch.overwrite:  # rows Delta Spark writes go in the same transaction
            return commit_replacing(
                self.main,
                [] if self.inserting else files,
                self.txns,
                schema,
                ranges=self.batch.offset_ranges(),
                mapping=self.mapping,
                rows=source if self.inserting else None,
            )
        if self.inserting:
            assert source is not None and self.batch.committer is not None
            return insert(self.main, self.batch.committer, source, self.txns, self.app_id_of)
        return self.main.commit_files(
            files,
            self.txns,
            schema,
            planned=planned,
            app_id_of=self.app_id_of,
            mapping=self.mapping,
        )
