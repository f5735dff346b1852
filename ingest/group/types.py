"""Small value types shared by the group state machine and the assignors.

``Partition`` is ``ingest.protocol.partition.Partition``, re-exported.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from ingest.errors import LocalProtocolError
from ingest.protocol.partition import Partition

__all__ = [
    "InvalidTransition",
    "MemberState",
    "Partition",
    "RebalanceProtocol",
    "java_order",
    "partitions_by_topic",
]


class MemberState(Enum):
    """Where a member stands in the group protocol.

    UNJOINED   not a member (initial state, and after leaving)
    JOINING    a JoinGroup is in flight or due (after coordinator lookup or backoff)
    SYNCING    joined a generation; the SyncGroup is in flight (or the leader awaits metadata)
    STABLE     synced: holds its assignment and heartbeats
    REVOKING   waits for the driver to confirm PartitionsRevoked before rejoining or leaving
    LEAVING    a LeaveGroup is in flight
    FENCED     terminal: another instance took our group.instance.id
    FAILED     terminal: a fatal error (authorization, inconsistent protocol, ...)
    """

    UNJOINED = "unjoined"
    JOINING = "joining"
    SYNCING = "syncing"
    STABLE = "stable"
    REVOKING = "revoking"
    LEAVING = "leaving"
    FENCED = "fenced"
    FAILED = "failed"


class RebalanceProtocol(Enum):
    """EAGER revokes everything before each rebalance; COOPERATIVE (KIP-429) only what moves."""

    EAGER = "eager"
    COOPERATIVE = "cooperative"


class InvalidTransition(LocalProtocolError):
    """The machine got an input its transition table does not accept in its current state.

    A local error: the driver fed an input the protocol does not allow now (a
    RevocationDone with no revocation pending, an answer to no request in flight).
    The machine is left exactly as it was.
    """

    def __init__(self, state: Enum, input_type: type, detail: str = "") -> None:
        """``state``: a ``MemberState``, or the consumer protocol's ``ConsumerState``."""
        self.state = state
        self.input_type = input_type
        message = f"{input_type.__name__} is not valid in state {state.name}"
        super().__init__(f"{message}: {detail}" if detail else message)


def java_order(text: str) -> bytes:
    """Sort key equal to Java's ``String.compareTo`` (UTF-16 code units), as Kafka sorts."""
    return text.encode("utf-16-be")


def partitions_by_topic(partitions: Iterable[Partition]) -> dict[str, list[int]]:
    """Group partitions per topic, topics and partitions sorted."""
    grouped: dict[str, list[int]] = {}
    for topic, index in sorted(partitions, key=lambda p: (java_order(p.topic), p.partition)):
        grouped.setdefault(topic, []).append(index)
    return grouped
