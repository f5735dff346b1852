"""Shared pieces of the membership tests against the real broker (Apache Kafka; some
also on Tansu).

Times come from the session timeout: Tansu holds each JoinGroup for
max(1 s, session_timeout / 2) (docs/kafka-compat.md), so a short session keeps
rebalances short, and every wait is a deadline on a condition, never a sleep
that has to be long enough.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence

from ingest.client import ClientConfig
from ingest.group import (
    Assignor,
    CooperativeStickyAssignor,
    GroupConfig,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RangeAssignor,
    RoundRobinAssignor,
)
from ingest.membership.member import Event, GroupMember
from ingest.protocol.partition import Partition

SESSION_MS = 2_000
HEARTBEAT_MS = 300
SESSION = SESSION_MS / 1000
# A rebalance: on Tansu a JoinGroup held ~1 s, a SyncGroup, and maybe a second round.
REBALANCE_WAIT = 15 * SESSION

ASSIGNORS: dict[str, Callable[[], Assignor]] = {
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
    "cooperative-sticky": CooperativeStickyAssignor,
}


def client_config(bootstrap: str) -> ClientConfig:
    return ClientConfig(bootstrap_servers=bootstrap, request_timeout=15.0, retry_timeout=15.0)


def group_config(
    group: str, *, assignor: str = "cooperative-sticky", **overrides: object
) -> GroupConfig:
    settings: dict[str, object] = {
        "group_id": group,
        "session_timeout_ms": SESSION_MS,
        "heartbeat_interval_ms": HEARTBEAT_MS,
        "rebalance_timeout_ms": 10_000,
        "assignors": (ASSIGNORS[assignor](),),
    }
    settings.update(overrides)
    return GroupConfig(**settings)  # type: ignore[arg-type]


def partitions(topic: str, count: int) -> frozenset[Partition]:
    return frozenset(Partition(topic, i) for i in range(count))


class Recorder:
    """One member as the supervisor's main loop sees it: its events, with when they came.

    It acknowledges every PartitionsRevoked at once, as a supervisor with
    nothing to commit would.
    """

    def __init__(self, member: GroupMember, name: str) -> None:
        self.member = member
        self.name = name
        self.events: list[tuple[float, Event]] = []

    def pump(self, timeout: float = 0.0) -> list[Event]:
        batch = self.member.poll(timeout)
        now = time.monotonic()
        for event in batch:
            self.events.append((now, event))
            if isinstance(event, PartitionsRevoked):
                self.member.revocation_done()
        return batch

    def of(self, kind: type | tuple[type, ...], since: float = 0.0) -> list[Event]:
        return [e for at, e in self.events if at >= since and isinstance(e, kind)]

    def revoked(self, since: float = 0.0) -> frozenset[Partition]:
        """Everything revoked from it since ``since``."""
        revoked: frozenset[Partition] = frozenset()
        for at, event in self.events:
            if at >= since and isinstance(event, PartitionsRevoked):
                revoked |= event.partitions
        return revoked

    @property
    def owned(self) -> frozenset[Partition]:
        """What the events handed to the application say it owns now."""
        owned: frozenset[Partition] = frozenset()
        for _, event in self.events:
            if isinstance(event, PartitionsAssigned):
                owned = event.assignment
            elif isinstance(event, PartitionsRevoked | PartitionsLost):
                owned -= event.partitions
        return owned

    @property
    def stable(self) -> bool:
        """Stable, and this generation's PartitionsAssigned handed over: the member turns
        STABLE before the event is polled."""
        assigned = [e for _, e in self.events if isinstance(e, PartitionsAssigned)]
        return (
            self.member.state is MemberState.STABLE
            and bool(assigned)
            and assigned[-1].generation_id == self.member.generation_id
            and self.owned == self.member.assignment
        )


def pump_until(
    recorders: Sequence[Recorder], condition: Callable[[], bool], timeout: float, what: str
) -> float:
    """Poll every member (on this, the main, thread) until ``condition``; the time it took."""
    start = time.monotonic()
    end = start + timeout
    while True:
        for recorder in recorders:
            recorder.pump(0.02)
        if condition():
            return time.monotonic() - start
        if time.monotonic() > end:
            states = {r.name: (r.member.state.name, sorted(r.owned)) for r in recorders}
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}: {states}")


def split_evenly(recorders: Iterable[Recorder], everything: frozenset[Partition]) -> bool:
    """Every member stable, together owning ``everything``, no partition twice, balanced."""
    members = list(recorders)
    if not all(r.stable for r in members):
        return False
    owned = [r.owned for r in members]
    sizes = [len(o) for o in owned]
    union: frozenset[Partition] = frozenset().union(*owned)
    return union == everything and sum(sizes) == len(everything) and max(sizes) - min(sizes) <= 1


def close_all(recorders: Iterable[Recorder]) -> None:
    for recorder in recorders:
        if recorder.member.alive:
            recorder.member.close()
