"""``ingest run``'s offset commits: what is durable in Delta, committed to the group after
the Delta commit, asynchronously. At most one OffsetCommit is in flight; the loop goes on
while it is (its outcome comes from the member's poll), and revocations wait for it."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ingest.errors import GroupError
from ingest.faults import fault_point
from ingest.group import CommitFailed, OffsetsCommitted
from ingest.logs import event
from ingest.membership.member import GroupMember, check_commit
from ingest.protocol.partition import Partition
from ingest.supervisor.engine.partitions import PartitionState
from ingest.supervisor.engine.runtime import Engine

__all__ = ["OffsetCommits"]

log = logging.getLogger("ingest.supervisor")

_COMMIT_RETRY_AFTER = 2.0
_STOP_COMMIT_RETRY_AFTER = 0.2


@dataclass(frozen=True)
class _CommitInFlight:
    offsets: Mapping[Partition, int]
    table_version: int | None


class OffsetCommits:
    """The group's commits of one run: the one in flight, and when a failed one is retried."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.in_flight: _CommitInFlight | None = None
        self.after = 0.0  # a failed commit: no new one before then

    def target(self, state: PartitionState) -> int | None:
        batch = self.engine.batch
        return state.commit_target(
            in_flight=batch is not None and state.partition in batch.partitions
        )

    def send(
        self,
        member: GroupMember,
        owned: frozenset[Partition],
        generation: int | None,
        only: Iterable[Partition] | None = None,
    ) -> bool:
        """Sends an OffsetCommit of what is durable and not yet committed of ``owned``
        (``only`` of it, if given), unless one is in flight; returns whether it sent one.
        ``generation``: the generation (classic) or member epoch (consumer protocol) of the
        assignment the loop last handled: the member refuses the commit if it joined
        again since."""
        if self.in_flight is not None:
            return False
        offsets: dict[Partition, int] = {}
        for partition in only if only is not None else list(self.engine.states):
            state = self.engine.states.get(partition)
            if state is None or partition not in owned:
                continue
            target = self.target(state)
            if target is not None and (state.committed is None or target > state.committed):
                offsets[partition] = target
        if not offsets:
            return False
        metadata = (
            None if self.engine.last_table_version is None else str(self.engine.last_table_version)
        )
        epochs = {
            p: self.engine.states[p].landed_epoch
            for p in offsets
            if self.engine.states[p].landed_epoch >= 0
        }
        member.commit_async(offsets, metadata, epochs, generation=generation)
        self.in_flight = _CommitInFlight(offsets, self.engine.last_table_version)
        return True

    def done(self, outcome: OffsetsCommitted | CommitFailed) -> None:
        """The outcome of the OffsetCommit in flight (the member answers them in order)."""
        sent, self.in_flight = self.in_flight, None
        offsets = outcome.offsets
        version = sent.table_version if sent is not None else None
        try:
            check_commit(outcome)
        except GroupError as exc:
            self.engine.metrics.inc("ingest_offset_commits_total", outcome="failed")
            # Stopping, the run waits for its commits (``finished``): retry soon.
            wait = _STOP_COMMIT_RETRY_AFTER if self.engine.stopping else _COMMIT_RETRY_AFTER
            self.after = time.monotonic() + wait
            # Fenced: the partitions are revoked or lost next; never resent as it was.
            event(
                log,
                "commit_failed",
                level=logging.WARNING,
                offsets={str(p): o for p, o in sorted(offsets.items())},
                error=str(exc) or type(exc).__name__,
            )
            return
        self.engine.metrics.inc("ingest_offset_commits_total", outcome="ok")
        for partition, offset in offsets.items():
            state = self.engine.states.get(partition)
            if state is not None:
                state.committed = max(offset, state.committed or 0)
        event(
            log,
            "offsets_committed",
            table_version=version,
            offsets={str(p): o for p, o in sorted(offsets.items())},
        )
        # Fault injection (a no-op unless INGEST_FAULT_POINT is set; ingest/faults.py).
        fault_point("after_offset_commit")
