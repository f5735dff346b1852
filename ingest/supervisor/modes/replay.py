"""``ingest replay``: a range of offsets again, into the same table, idempotently.

No group membership and no offset commit: the replay assigns itself the
partitions asked for, spawns a worker per partition bounded by ``--from`` and
``--to``, and lands the segments through the same Spark job as ``ingest run``,
under the same txn app ids. So, in append mode, offsets the table already holds
(at or below its txn version for the partition) are dropped before writing:
replaying an ingested range adds nothing, twice or ten times. In upsert mode
the job MERGEs, so replays are idempotent by key as well.

A replay that would land offsets past the table's txn version moves that
version, like ``ingest run`` does. It must therefore start at or below the
version + 1: starting further on would mark the offsets in between as landed
without landing them, so such a partition is refused (``ingest run`` or a
replay from an earlier offset fills it).

``--overwrite`` (append mode) writes every record of the range again and, in
the same Delta transaction per batch, removes the rows the table held at those
offsets (files partly in range are rewritten without them): after a schema or
transform fix, the range reads as the current configuration decodes it. The
dead-letter table's rows in the range are replaced the same way, first. A
replay killed halfway leaves each batch either replaced or untouched; running
it again finishes the job. Offsets stay exact: each one is in the table or the
dead-letter table, once.

Progress (records done of the total, rate, ETA): a bar on a terminal (the CLI
gives a console), ``progress`` log events otherwise.
"""

from __future__ import annotations

import datetime as dt
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from ingest.client.admin import source_topics, topic_partitions
from ingest.config import IngestConfig
from ingest.errors import ConfigError
from ingest.logs import event
from ingest.protocol.partition import Partition
from ingest.sink.batch import BatchResult
from ingest.sink.durable import txn_versions
from ingest.supervisor.engine.batches import BatchThread
from ingest.supervisor.engine.partitions import Change, PartitionState, range_done
from ingest.supervisor.engine.runtime import Engine
from ingest.supervisor.engine.source import RunOutcome
from ingest.supervisor.output.metrics import Metrics
from ingest.supervisor.output.progress import Progress
from ingest.worker import EndPosition, StartPosition, WorkerStarted
from ingest.worker.ends import end_offsets

__all__ = ["Position", "ReplaySource", "parse_partitions", "parse_position", "replay_run"]

log = logging.getLogger("ingest.supervisor.modes.replay")

PositionKind = Literal["earliest", "latest", "offset", "timestamp"]


@dataclass(frozen=True)
class Position:
    """A --from or --to value: one kind for every partition, or offsets per partition."""

    kind: PositionKind
    value: int | None = None
    offsets: tuple[tuple[Partition | int, int], ...] = ()

    def offset_for(self, partition: Partition) -> int | None:
        for key, offset in self.offsets:
            if key == partition or key == partition.partition:
                return offset
        return self.value if self.kind == "offset" else None


def parse_position(text: str, option: str) -> Position:
    """earliest | latest | OFFSET | [TOPIC:]P:OFFSET,... | @EPOCH_MS | ISO-8601 time."""
    text = text.strip()
    if text in ("earliest", "latest"):
        if (text == "earliest") != (option == "--from"):
            raise ConfigError(f"{text!r} is not a valid {option}", key=option)
        return Position(text)  # type: ignore[arg-type]
    if text.isdigit():
        return Position("offset", int(text))
    if text.startswith("@") and text[1:].isdigit():
        return Position("timestamp", int(text[1:]))
    moment = _iso_time(text)
    if moment is not None:
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=dt.UTC)
        return Position("timestamp", int(moment.timestamp() * 1000))
    if ":" in text and all(_is_offset_pair(part) for part in text.split(",")):
        pairs: list[tuple[Partition | int, int]] = []
        for part in text.split(","):
            *where, offset = part.strip().split(":")
            key: Partition | int = (
                int(where[0])
                if len(where) == 1
                else Partition(":".join(where[:-1]), int(where[-1]))
            )
            pairs.append((key, int(offset)))
        return Position("offset", None, tuple(pairs))
    raise ConfigError(
        f"{text!r}: expected earliest/latest, an offset, P:OFFSET pairs, @EPOCH_MS or an "
        "ISO-8601 time such as 2026-01-01T00:00:00Z",
        key=option,
    )


def _iso_time(text: str) -> dt.datetime | None:
    if not text[:4].isdigit() or "-" not in text:
        return None  # an offset pair such as 0:10 is not a time
    try:
        return dt.datetime.fromisoformat(text)
    except ValueError:
        return None


def _is_offset_pair(part: str) -> bool:
    pieces = part.strip().split(":")
    return len(pieces) >= 2 and pieces[-1].isdigit() and pieces[-2].isdigit()


def parse_partitions(
    text: str | None, topics: Sequence[str] | None
) -> list[Partition | int] | None:
    """``0,1,5`` (of every topic) or ``topic:3,...``; None: every partition. ``topics``
    None (a topic_pattern): a topic is checked at the start, against the cluster's."""
    if text is None or not text.strip():
        return None
    chosen: list[Partition | int] = []
    for part in text.split(","):
        part = part.strip()
        topic, _, index = part.rpartition(":")
        if not index.isdigit():
            raise ConfigError(
                f"{part!r}: expected a partition number or topic:N", key="--partitions"
            )
        if topic and topics is not None and topic not in topics:
            raise ConfigError(f"topic {topic!r} is not in source.topics", key="--partitions")
        chosen.append(Partition(topic, int(index)) if topic else int(index))
    return chosen


def replay_run(
    config: IngestConfig,
    *,
    start: Position,
    end: Position | None = None,
    partitions: Sequence[Partition | int] | None = None,
    overwrite: bool = False,
    spark: Any | None = None,
    metrics: Metrics | None = None,
    progress: Progress | None = None,
) -> Engine:
    """The engine of ``ingest replay``: ``[start, end)`` of the chosen partitions."""
    if overwrite and config.table.mode == "upsert":
        raise ConfigError(
            "applies to append mode; an upsert replay MERGEs, which already replaces rows",
            key="--overwrite",
        )
    if start.kind == "latest":
        raise ConfigError("'latest' is not a valid --from", key="--from")

    def source(engine: Engine) -> ReplaySource:
        return ReplaySource(
            engine, start=start, end=end, partitions=partitions, overwrite=overwrite,
            progress=progress,
        )  # fmt: skip

    return Engine(config, source, spark=spark, metrics=metrics, overwrite=overwrite)


class ReplaySource:
    """Replays ``[start, end)`` of the chosen partitions into the table."""

    mode = "replay"

    def __init__(
        self,
        engine: Engine,
        *,
        start: Position,
        end: Position | None,
        partitions: Sequence[Partition | int] | None,
        overwrite: bool,
        progress: Progress | None,
    ) -> None:
        self.engine = engine
        self.overwrite = overwrite
        self.start_spec = start
        self.end_spec = end or Position("latest")
        self.chosen = partitions
        self.progress = progress or Progress("replay")
        self.versions: dict[Partition, int | None] = {}

    def poll(self) -> None:
        """A replay's partitions are fixed at start."""

    def draining(self) -> bool:
        return self.engine.default_draining()

    def close(self, outcome_ok: bool) -> None:
        """No group to leave."""

    def start(self) -> None:
        assert self.engine.cluster is not None
        source = self.engine.config.source
        topics = source_topics(self.engine.cluster, source.topics, source.topic_pattern)
        every = topic_partitions(self.engine.cluster, topics)
        if self.chosen is None:
            partitions = every
        else:
            partitions = [p for p in every if p in self.chosen or p.partition in self.chosen]
            unknown = [c for c in self.chosen if not any(c == p or c == p.partition for p in every)]
            if unknown:
                raise ConfigError(f"no such partitions: {unknown}", key="--partitions")
        self.versions = txn_versions(self.engine.router, partitions)
        latest = (
            end_offsets(self.engine.cluster, partitions, self.engine.fetch)
            if self.end_spec.kind == "latest"
            else {}
        )
        for partition in partitions:
            start = self._start(partition)
            end = self._end(partition, latest)
            state = self.engine.new_state(partition, start, end)
            version = self.versions[partition]
            state.durable_next = None if version is None else version + 1
            self.engine.spawn(state)
        if partitions:
            self.engine.lander.warm()  # start the JVM while the workers fetch
        event(
            log,
            "replay_started",
            partitions=",".join(str(p) for p in partitions),
            start=self.start_spec.kind,
            end=self.end_spec.kind,
        )

    def _start(self, partition: Partition) -> StartPosition:
        spec = self.start_spec
        if spec.kind == "earliest":
            return StartPosition.earliest()
        if spec.kind == "timestamp":
            assert spec.value is not None
            return StartPosition.timestamp(spec.value)
        offset = spec.offset_for(partition)
        return StartPosition.earliest() if offset is None else StartPosition.offset(offset)

    def _end(self, partition: Partition, latest: dict[Partition, int]) -> EndPosition:
        spec = self.end_spec
        if spec.kind == "latest":
            return EndPosition.offset(latest[partition])
        if spec.kind == "timestamp":
            assert spec.value is not None
            return EndPosition.timestamp(spec.value)
        offset = spec.offset_for(partition)
        if offset is None:
            raise ConfigError(f"no end offset for {partition}", key="--to")
        return EndPosition.offset(offset)

    def on_worker_started(self, state: PartitionState, message: WorkerStarted) -> None:
        version = self.versions.get(state.partition)
        ends = message.end_offset
        if version is None or message.start_offset <= version + 1:
            return
        if ends is not None and message.start_offset >= ends:
            return  # an empty range: nothing would be written
        failure = (
            f"the range starts at offset {message.start_offset}, but the table holds "
            f"{state.partition} only up to offset {version}: landing it would skip "
            f"{version + 1}-{message.start_offset - 1}; replay from offset {version + 1} "
            "or earlier (or let ingest run catch up)"
        )
        state.change(Change.FAIL, failure=failure)
        event(
            log,
            "partition_refused",
            level=logging.ERROR,
            partition=str(state.partition),
            error=state.failed,
        )
        self.engine.retire(state)
        state.abandon = True
        self.engine.abandon_pending(state)

    def after_batch(self, batch: BatchThread, result: BatchResult) -> None:
        self._show_progress()

    def _show_progress(self, final: bool = False) -> None:
        batch = self.engine.batch
        in_batch = batch.partitions if batch is not None else frozenset()
        self.progress.update(*range_done(self.engine.states.values(), in_batch), final=final)

    def after_step(self) -> None:
        self._show_progress()

    def finished(self) -> bool:
        if self.engine.stopping:
            return self.engine.shutdown_done()
        if self.engine.batch is not None:
            return False
        return all(
            (s.finished or s.failed) and not len(s.pending) for s in self.engine.states.values()
        )

    def complete(self) -> RunOutcome:
        self._show_progress(final=True)
        outcome = self.engine.complete()
        event(
            log,
            "replay_done",
            batches=self.engine.batches,
            rows=self.engine.rows_written,
            exit_code=outcome.exit_code,
        )
        return outcome

    def status(self) -> dict[str, Any]:
        return {"group": self.engine.config.source.group_id, "replay": True}
