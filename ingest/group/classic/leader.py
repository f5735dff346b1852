"""The leader's half of a rebalance: every member's subscription in, SyncGroup assignments out.

Pure. ``assign_group`` reads the members' subscriptions from the JoinGroup answer,
asks for the partition counts it lacks, runs the assignor the coordinator chose and
checks the cooperative rule; ``Leadership`` is what a member keeps for the times
it leads: the partition counts it knows, the JoinGroup answer waiting for metadata,
the counts its last assignment was made with, and the sticky user_data of its own
last assignment (``retained``; the cooperative-sticky snapshot, ``snapshot.py``).

A member's unreadable subscription is the other side's fault (``RemoteProtocolError``);
an assignment that moves a partition without revoking it first is our own assignor's
(``LocalProtocolError``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from ingest.errors import DecodeError, LocalProtocolError, RemoteProtocolError
from ingest.group.assignors import Assignor, MemberAssignment, MemberSubscription
from ingest.group.classic.classic_requests import encode_member_assignment
from ingest.group.types import RebalanceProtocol
from ingest.protocol.consumer import decode_subscription
from ingest.protocol.messages import JoinGroupResponse, JoinGroupResponseMember
from ingest.protocol.partition import Partition

__all__ = [
    "Assignments",
    "Leadership",
    "NeedsMetadata",
    "assign_group",
    "cooperative_violation",
    "read_subscriptions",
]


@dataclass(frozen=True)
class NeedsMetadata:
    """The assignor needs the partition counts of these topics first."""

    topics: frozenset[str]


@dataclass(frozen=True)
class Assignments:
    """Every member's encoded assignment, and the partition counts it was made with."""

    encoded: dict[str, bytes]
    counts: dict[str, int]


@dataclass
class Leadership:
    """What a member keeps for leading: see the module docstring."""

    metadata: dict[str, int] = field(default_factory=dict)  # partition counts known
    pending: JoinGroupResponse | None = None  # the JoinGroup answer awaiting metadata
    assigned_counts: dict[str, int] | None = None  # what our last assignment was made with
    retained: bytes | None = None  # user_data of our own last assignment
    retained_protocol: str | None = None  # the assignor it came from

    def retain(self, user_data: bytes | None, protocol: str | None) -> None:
        self.retained = user_data
        self.retained_protocol = protocol

    def retained_for(self, protocol: str) -> bytes | None:
        """The retained user_data, if it came from ``protocol``'s assignor."""
        return self.retained if self.retained_protocol == protocol else None

    def changed_counts(self) -> list[str]:
        """Topics whose partition count moved since our last assignment, sorted."""
        if self.assigned_counts is None:
            return []
        known = self.metadata
        return sorted(t for t, n in self.assigned_counts.items() if known.get(t, n) != n)


def read_subscriptions(
    members: Iterable[JoinGroupResponseMember],
) -> dict[str, MemberSubscription]:
    """Each member's subscription; ``RemoteProtocolError`` names the first unreadable one."""
    subscriptions: dict[str, MemberSubscription] = {}
    for member in members:
        try:
            payload = decode_subscription(member.metadata)
        except DecodeError as exc:
            raise RemoteProtocolError(
                f"member {member.member_id} sent an unreadable subscription: {exc}"
            ) from exc
        subscriptions[member.member_id] = MemberSubscription(
            topics=frozenset(payload.topics),
            owned_partitions=frozenset(
                Partition(tp.topic, i) for tp in payload.owned_partitions for i in tp.partitions
            ),
            generation_id=payload.generation_id,
            group_instance_id=member.group_instance_id,
            user_data=payload.user_data,
        )
    return subscriptions


def assign_group(
    join: JoinGroupResponse,
    assignor: Assignor,
    protocol: RebalanceProtocol,
    metadata: Mapping[str, int],
    *,
    generation_id: int,
    retained_user_data: bytes | None,
) -> NeedsMetadata | Assignments:
    """Assign generation ``generation_id`` of ``join`` (the leader's JoinGroup answer).

    Raises ``RemoteProtocolError`` for a member's unreadable subscription and
    ``LocalProtocolError`` when a cooperative assignment moves a partition that its
    owner has not revoked.
    """
    subscriptions = read_subscriptions(join.members)
    group_topics = {t for s in subscriptions.values() for t in s.topics}
    missing = frozenset(t for t in group_topics if t not in metadata)
    if missing:
        return NeedsMetadata(missing)
    counts = {t: metadata[t] for t in sorted(group_topics)}
    result = assignor.assign(
        subscriptions,
        counts,
        generation_id=generation_id,
        retained_user_data=retained_user_data,
    )
    assignments = {m: result.get(m, MemberAssignment()) for m in subscriptions}
    if protocol is RebalanceProtocol.COOPERATIVE:
        problem = cooperative_violation(subscriptions, assignments)
        if problem:
            raise LocalProtocolError(f"assignor {assignor.name}: {problem}")
    encoded = {m: encode_member_assignment(a) for m, a in assignments.items()}
    return Assignments(encoded, counts)


def cooperative_violation(
    subscriptions: Mapping[str, MemberSubscription], assignments: Mapping[str, MemberAssignment]
) -> str:
    """Kafka's validateCooperativeAssignment: nothing moves owner within one rebalance."""
    owners: dict[Partition, str] = {}
    for member, subscription in subscriptions.items():
        for partition in subscription.owned_partitions:
            owners[partition] = member
    for member, assignment in assignments.items():
        for partition in assignment.partitions:
            owner = owners.get(partition)
            if owner is not None and owner != member:
                return f"{partition} moves from {owner} to {member} without being revoked first"
    return ""
