"""The batcher: when a batch is due (the triggers), and the batch thread that lands it
through the Spark job. One batch runs at a time; its outcome is typed (``BatchThread``).

With a ``{topic}`` table uri or [[route]]s (``Router``), a batch lands in each of its
topics' tables in turn, one Delta commit per table (``merged``); a failure after some tables committed fails the
batch, and its retry finds those tables' txn versions and lands only the rest. A table
met for the first time is checked first (``on_new_table``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from ingest.config import TriggerSection
from ingest.engines.landing import LandingEngine
from ingest.faults import fault_point
from ingest.handoff import HandoffStore
from ingest.logs import event
from ingest.protocol.partition import Partition
from ingest.sink.batch import BatchResult
from ingest.sink.durable import lowest_durable
from ingest.sink.table_config import Router, TableConfig
from ingest.supervisor.engine.backpressure import GlobalBufferCap
from ingest.supervisor.engine.batches import BatchThread, Selection, select
from ingest.supervisor.engine.partitions import PartitionState
from ingest.supervisor.engine.retries import BatchRetry

__all__ = [
    "Batcher",
    "age_trigger",
    "expected_seconds",
    "merged",
    "next_means",
    "owner_of",
    "record_cap",
]

log = logging.getLogger("ingest.supervisor")


def age_trigger(max_age: float, lead: float) -> float:
    """The age of the oldest pending record at which a batch starts: ``max_age`` less the
    time the batch is expected to take to land (``lead``), so that it is visible about when
    its oldest record is ``max_age`` old, not ``max_age`` plus the batch's own time; the
    lead is at most half of ``max_age`` (batches at most twice as frequent)."""
    return max_age - min(max(lead, 0.0), max_age / 2)


def next_means(means: tuple[float, float] | None, seconds: float, size: int) -> tuple[float, float]:
    """(seconds, bytes) of the last batches, each a moving average (half the batch that
    landed in ``seconds`` with ``size`` bytes, half the earlier ones)."""
    if means is None:
        return seconds, float(size)
    return (means[0] + seconds) / 2, (means[1] + size) / 2


def expected_seconds(means: tuple[float, float] | None, size: int) -> float:
    """How long ``size`` bytes would take to land at the last batches' rate: their mean
    seconds over their mean bytes, so a small batch (a warm-up, a trickle) moves the rate
    little; before any batch, 0."""
    if means is None or means[1] <= 0:
        return 0.0
    return means[0] / means[1] * size


def record_cap(trigger: TriggerSection, router: Router) -> int:
    """A batch's records at most: ``trigger.max_records``, or ``upsert_max_records`` when
    smaller and a table (the default's or a route's) is in mode "upsert"."""
    cap = int(trigger.max_records)
    if any(table.mode == "upsert" for table in router.tables()):
        cap = min(cap, int(trigger.upsert_max_records))
    return max(cap, 1)


class Batcher:
    """The batch in flight (``running``), the count of batches, and the triggers."""

    def __init__(
        self,
        trigger: TriggerSection,
        table: Router,
        lander: LandingEngine,
        store: HandoffStore,
        cap: GlobalBufferCap,
        on_done: Callable[[], None] | None = None,
        on_new_table: Callable[[str], None] | None = None,
    ) -> None:
        self.trigger = trigger
        self.on_done = on_done  # called on the batch's thread when it ends
        self.table = table
        self.lander = lander
        self.store = store
        self.cap = cap
        self.running: BatchThread | None = None
        self.count = 0
        self.retry = BatchRetry(float(trigger.retry_for))  # failures in a row, backoff
        self.flush = False  # land what is pending at the next chance
        self.on_new_table = on_new_table  # with a {topic} uri: a topic's table, first met
        self.topics_seen: set[str] = set()
        self.means: tuple[float, float] | None = None  # batches' seconds, bytes (next_means)
        self.max_records = record_cap(trigger, table)

    def due(self, states: Mapping[Partition, PartitionState], *, draining: bool) -> bool:
        """Whether a batch should start now: none runs, and something pending is due
        (flush asked, the cap paused the workers, draining, or a trigger reached)."""
        if self.running is not None:
            return False
        now = time.monotonic()
        if now < self.retry.next_at:
            return False
        pending = [s.pending for s in states.values() if len(s.pending)]
        if not pending:
            self.flush = False
            return False
        if self.lander.starting:
            # The batch would only wait for the session; planned later, it takes
            # everything sealed meanwhile (fewer, fuller batches).
            return False
        trigger = self.trigger
        if self.flush or self.cap.paused or draining:
            return True
        size = sum(p.bytes for p in pending)
        if size >= int(trigger.max_bytes):
            return True
        if sum(p.records for p in pending) >= self.max_records:
            return True
        oldest = min(p.oldest() or now for p in pending)
        lead = expected_seconds(self.means, size)  # landing what is pending
        return now - oldest >= age_trigger(float(trigger.max_age), lead)

    def landed(self, seconds: float, size: int) -> None:
        """A batch of ``size`` bytes landed in ``seconds``: failures in a row start over,
        and the age trigger's estimate follows (``next_means``)."""
        self.retry.landed()
        self.means = next_means(self.means, seconds, size)

    def start(self, states: Mapping[Partition, PartitionState], *, overwrite: bool) -> None:
        """Starts a batch of what is pending, on its own thread."""
        from ingest.sink.batch import Batch

        trigger = self.trigger
        selection = select(
            {p: s.pending for p, s in states.items() if len(s.pending)},
            max_bytes=max(int(trigger.max_bytes), 1),
            max_records=self.max_records,
        )
        self.flush = False
        batches = [
            Batch(
                table,
                part.segments(),
                # A partition in several tables: its corrupt ranges are dead letters of
                # the first only (the one no earlier route's condition skips).
                part.corrupt() if table.select is None or not table.select.skip else (),
                segment_storage_options=self.store.config.storage_options,
                overwrite=overwrite,
            )
            for table, part in self._by_table(selection)
        ]
        lander = self.lander

        def work() -> Any:
            results = []
            for number, batch in enumerate(batches):
                if number:
                    fault_point("between_table_commits")
                results.append(lander.land(batch))
            return merged(results)

        self.count += 1
        incarnations = {p: states[p].incarnation for p in selection.items}
        self.running = BatchThread(self.count, selection, incarnations, work, self.on_done)
        event(
            log,
            "batch_started",
            batch=self.count,
            partitions=len(selection.items),
            tables=len(batches),
            segments=sum(len(b.segments) for b in batches),
            corrupt=sum(len(b.corrupt) for b in batches),
            records=selection.records,
            bytes=selection.bytes,
        )

    def _by_table(self, selection: Selection) -> list[tuple[TableConfig, Selection]]:
        """The selection split by the table each partition lands in (one part, the
        table, without a ``{topic}`` uri); with routes by header or field, a partition
        is in each part whose table takes some of its records (``Router.tables_for``)."""
        if not self.table.per_topic:
            return [(self.table.default, selection)]
        topics = sorted({p.topic for p in selection.items})
        for topic in topics:
            if topic not in self.topics_seen:
                if self.on_new_table is not None:
                    self.on_new_table(topic)
                self.topics_seen.add(topic)
        parts: dict[tuple[Any, ...], tuple[TableConfig, dict[Partition, Any]]] = {}
        for topic in topics:
            for table in self.table.tables_for(topic):
                # The topics of one table and route land together, in one commit.
                key = (table.uri, table.route, table.refuse, table.select)
                items = parts.setdefault(key, (table, {}))[1]
                items.update({p: i for p, i in selection.items.items() if p.topic == topic})
        return [(table, Selection(items)) for table, items in parts.values()]


def merged(results: list[BatchResult]) -> BatchResult:
    """One batch's outcome over its tables' landings (the last table's versions)."""
    if len(results) == 1:
        return results[0]
    stages: dict[str, float] = {}
    for result in results:
        for stage, spent in result.stage_seconds.items():
            stages[stage] = stages.get(stage, 0.0) + spent
    paths = sorted({r.path for r in results} - {"none"}) or ["none"]
    last = results[-1]
    return BatchResult(
        table_version=last.table_version,
        dead_letter_version=last.dead_letter_version,
        durable_offsets=lowest_durable(r.durable_offsets for r in results),
        rows_written=sum(r.rows_written for r in results),
        dead_letters=sum(r.dead_letters for r in results),
        stage_seconds=stages,
        path="+".join(paths),
        files=sum(r.files for r in results),
        attempts=max(r.attempts for r in results),
        replaced_rows=sum(r.replaced_rows for r in results),
        deleted_rows=sum(r.deleted_rows for r in results),
    )


def owner_of(
    states: Mapping[Partition, PartitionState], batch: BatchThread, partition: Partition
) -> PartitionState | None:
    """The state the batch was started for, if it is still the current one."""
    state = states.get(partition)
    if state is None or state.incarnation != batch.incarnations.get(partition):
        return None
    return state
