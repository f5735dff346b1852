"""Requests in flight to the coordinator, and the one check of whether an answer is stale.

The driver feeds back the answers of one API in the order their requests were
sent, so an answer belongs to the oldest request of its API still in flight.
Each request remembers the ``Epoch`` it was sent in: the join round (one attempt
to join and sync) and the generation and member id it spoke for. An answer is
stale when what it was sent for has since been abandoned; ``Sent.same_round``
and ``Sent.same_generation`` are the only places that decide it.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from ingest.group.events import Commit
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from ingest.protocol.partition import Partition

__all__ = [
    "COMMIT",
    "FETCH",
    "GROUP_API_KEYS",
    "HEARTBEAT",
    "JOIN",
    "LEAVE",
    "SYNC",
    "Epoch",
    "InFlight",
    "Sent",
]

JOIN = JoinGroupRequest.api_key
SYNC = SyncGroupRequest.api_key
HEARTBEAT = HeartbeatRequest.api_key
LEAVE = LeaveGroupRequest.api_key
COMMIT = OffsetCommitRequest.api_key
FETCH = OffsetFetchRequest.api_key
#: The coordinator APIs the machine sends, in the order a lost connection fails them.
GROUP_API_KEYS: tuple[int, ...] = (JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH)


@dataclass(frozen=True)
class Epoch:
    """What a request speaks for: the join round, and the generation and member id."""

    round: int
    generation_id: int
    member_id: str


@dataclass(frozen=True)
class Sent:
    """One request in flight and what its answer needs to be read."""

    api_key: int
    epoch: Epoch
    commit: Commit | None = None  # OffsetCommit: the command it carries
    partitions: frozenset[Partition] = frozenset()  # OffsetFetch: what was asked for
    sent_at: float = -math.inf  # Heartbeat: the session counts from the send

    def same_round(self, now: Epoch) -> bool:
        """Sent in the join round still in progress (JoinGroup, SyncGroup)."""
        return self.epoch.round == now.round

    def same_generation(self, now: Epoch) -> bool:
        """Sent for the generation and member id the member still holds."""
        then = self.epoch
        return then.generation_id == now.generation_id and then.member_id == now.member_id


@dataclass
class InFlight:
    """The requests of each group API awaiting an answer, oldest first."""

    queues: dict[int, deque[Sent]] = field(
        default_factory=lambda: {key: deque() for key in GROUP_API_KEYS}
    )

    def add(self, sent: Sent) -> None:
        self.queues[sent.api_key].append(sent)

    def count(self, api_key: int) -> int:
        queue = self.queues.get(api_key)
        return len(queue) if queue is not None else 0

    def take(self, api_key: int) -> Sent | None:
        """The oldest request of ``api_key``, now answered; None (nothing taken) if none."""
        queue = self.queues.get(api_key)
        return queue.popleft() if queue else None

    def drain(self) -> Iterator[Sent]:
        """Take every request, API by API (``GROUP_API_KEYS`` order), oldest first.

        Lazy: each is taken when the caller asks for it, so the caller's view of the
        round and generation is that after the previous one was handled.
        """
        for queue in self.queues.values():
            while queue:
                yield queue.popleft()
