"""One owned partition as the supervisor sees it: its lifecycle, as a table, and its books.

The lifecycle is one ``Phase``, changed only by ``PartitionState.change``, which looks the
row up in ``LIFECYCLE``: reading a row tells the outcome. A pair that is not in the table
is a bug, and raises.

::

                 SPAWN                  FINISH
    IDLE ───────────────▶ RUNNING ────────────────▶ FINISHED
      │                  │  ▲   │ CRASH
      │ STOP             │  │   └──────▶ RESTARTING ──SPAWN──▶ RUNNING
      ▼                  │  └─────────────────┘
    STOPPING ◀───STOP────┘   (RESTARTING, STOP) → STOPPING
      │ FINISH → FINISHED
    FAIL from IDLE, RUNNING, RESTARTING or STOPPING → FAILED; STOP leaves FINISHED
    and FAILED as they are (a shutdown stops everything).

``status()`` shows the phase, with a stopping partition whose worker still runs shown as
``running`` and one whose worker is gone as ``stopped``.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ingest.handoff import SegmentSealed
from ingest.protocol.partition import Partition
from ingest.supervisor.engine.batches import Item, PendingItems
from ingest.worker import EndPosition, StartPosition, WorkerHandle

__all__ = ["LIFECYCLE", "Change", "PartitionState", "Phase", "already_durable", "range_done"]


class Phase(enum.Enum):
    IDLE = "idle"  # owned; no worker started yet
    RUNNING = "running"  # a worker fetches it
    RESTARTING = "restarting"  # its worker crashed; a restart is due at ``restart_at``
    STOPPING = "stopping"  # told to stop (shutdown, revocation, refusal): never restarted
    FINISHED = "finished"  # its worker reached the end
    FAILED = "failed"  # given up: ``failure`` says why


class Change(enum.Enum):
    SPAWN = "spawn"  # a worker was started for it
    CRASH = "crash"  # its worker died unasked; it will be restarted
    STOP = "stop"  # its worker is told to stop, or is gone for good
    FINISH = "finish"  # its worker reached the end (or it starts at its end)
    FAIL = "fail"  # given up (too many crashes, a broker fault, a refused range)


P, C = Phase, Change
LIFECYCLE: dict[tuple[Phase, Change], Phase] = {
    (P.IDLE, C.SPAWN): P.RUNNING,
    (P.IDLE, C.STOP): P.STOPPING,
    (P.IDLE, C.FINISH): P.FINISHED,
    (P.IDLE, C.FAIL): P.FAILED,
    (P.RUNNING, C.CRASH): P.RESTARTING,
    (P.RUNNING, C.STOP): P.STOPPING,
    (P.RUNNING, C.FINISH): P.FINISHED,
    (P.RUNNING, C.FAIL): P.FAILED,
    (P.RESTARTING, C.SPAWN): P.RUNNING,
    (P.RESTARTING, C.STOP): P.STOPPING,
    (P.RESTARTING, C.FAIL): P.FAILED,
    (P.STOPPING, C.STOP): P.STOPPING,
    (P.STOPPING, C.FINISH): P.FINISHED,  # stopped after sealing, and that was the end
    (P.STOPPING, C.FAIL): P.FAILED,
    (P.FINISHED, C.STOP): P.FINISHED,
    (P.FAILED, C.STOP): P.FAILED,
    (P.FAILED, C.FINISH): P.FAILED,  # its last worker still reached the end: failed stays
}
del P, C


@dataclass(eq=False)
class PartitionState:
    """The supervisor's view of one owned partition (one incarnation of its ownership).

    Every offset here is a *next* offset, Kafka's convention for committed offsets: the
    offset after the last one it speaks of (``end_offset`` is exclusive, ``committed`` is
    the group's committed offset, ``durable_next`` is the table's txn version + 1).
    """

    partition: Partition
    incarnation: int
    start: StartPosition
    end: EndPosition | None
    phase: Phase = Phase.IDLE
    failure: str | None = None
    pending: PendingItems = field(default_factory=PendingItems)
    handle: WorkerHandle | None = None
    # Where a restarted worker starts: after the last item received.
    resume_offset: int | None = None
    first_offset: int | None = None
    end_offset: int | None = None
    finished_next: int | None = None
    committed: int | None = None
    durable_next: int | None = None  # next offset after the last one durable in the table
    landed_next: int | None = None  # next offset after the last released (durable) item
    # The leader epoch of the last segment landed (-1: unknown): an OffsetCommit of what
    # is durable carries it as committed_leader_epoch (KIP-320).
    landed_epoch: int = -1
    crashes: dict[int, int] = field(default_factory=dict)
    # (offset, when) the worker first failed on unreachable storage or network at that
    # offset (``worker.retry_for`` counts from there); None after any other failure.
    transient_since: tuple[int, float] | None = None
    restart_at: float | None = None  # when RESTARTING: the restart is due then
    abandon: bool = False  # revoked: new segments are dropped, not batched
    records: int = 0
    bytes: int = 0

    def change(self, change: Change, *, failure: str | None = None) -> Phase:
        """The row of ``LIFECYCLE`` for (phase, change); a missing row is a bug."""
        try:
            phase = LIFECYCLE[(self.phase, change)]
        except KeyError:
            raise AssertionError(
                f"{self.partition}: no lifecycle row for {self.phase.value} + {change.value}"
            ) from None
        self.phase = phase
        if phase is Phase.FAILED and self.failure is None:
            self.failure = failure or "failed"
        if phase is not Phase.RESTARTING:
            self.restart_at = None
        return phase

    def commit_target(self, *, in_flight: bool) -> int | None:
        """The offset an OffsetCommit may carry now: after the last durable one; or,
        once the worker reached the end and everything it sealed landed (nothing pending,
        nothing in the batch in flight), its end: past the last data record only control
        records (no rows) lie. Not for a revoked partition (``abandon``): its pending
        segments were dropped, not landed (an ``--until-end`` worker that had fetched to
        the end before the revocation would otherwise commit its end over records the
        table never took)."""
        target = self.durable_next
        if (
            self.finished
            and self.finished_next is not None
            and not len(self.pending)
            and not in_flight
            and not self.abandon
        ):
            target = max(target or 0, self.finished_next)
        return target

    @property
    def live(self) -> bool:
        return self.handle is not None

    @property
    def finished(self) -> bool:
        return self.phase is Phase.FINISHED

    @property
    def failed(self) -> str | None:
        return self.failure if self.phase is Phase.FAILED else None

    @property
    def stopping(self) -> bool:
        return self.phase is Phase.STOPPING

    @property
    def settled_phase(self) -> bool:
        """No worker will run for it again in this incarnation."""
        return self.phase in (Phase.STOPPING, Phase.FINISHED, Phase.FAILED)

    def row(self) -> dict[str, Any]:
        """This partition's row of ``Engine.status()`` (and ``/status``)."""
        return {
            "topic": self.partition.topic,
            "partition": self.partition.partition,
            "state": self.status(),
            "pid": None if self.handle is None else self.handle.pid,
            "committed": self.committed,
            "durable": None if self.durable_next is None else self.durable_next - 1,
            "position": self.resume_offset,
            "end": self.end_offset,
            "pending_items": len(self.pending),
            "records": self.records,
            "error": self.failed,
        }

    def status(self) -> str:
        if self.phase in (Phase.FAILED, Phase.FINISHED):
            return str(self.phase.value)
        if self.handle is not None:
            return "running"
        if self.phase is Phase.RESTARTING:
            return "restarting"
        return "stopped" if self.phase is Phase.STOPPING else "idle"


def already_durable(item: Item, durable_next: int | None) -> bool:
    """Whether the table's txn version already covers every offset of ``item``."""
    if durable_next is None:
        return False
    if isinstance(item, SegmentSealed):
        return item.next_offset <= durable_next
    last = item.first_offset if item.last_offset is None else item.last_offset
    return last < durable_next


def range_done(
    states: Iterable[PartitionState], in_batch: frozenset[Partition] = frozenset()
) -> tuple[int, int]:
    """Records landed and records in the range, over partitions whose range is known."""
    done = total = 0
    for state in states:
        first, end = state.first_offset, state.end_offset
        if first is None or end is None:
            continue
        size = max(end - first, 0)
        total += size
        if state.finished and not len(state.pending) and state.partition not in in_batch:
            done += size
        elif state.landed_next is not None:
            done += min(max(state.landed_next - first, 0), size)
    return done, total
