"""Partition assignors: ``range``, ``roundrobin`` and ``cooperative-sticky``.

An assignor is pure: the group leader hands it every member's subscription
and the partition count of each subscribed topic, and gets each member's
assignment back. ``range`` and ``roundrobin`` give the same results as
Kafka's RangeAssignor and RoundRobinAssignor (without rack awareness): members
are ordered by group.instance.id when they have one (static members first),
then by member id, compared as Java compares strings.

``cooperative-sticky`` follows KIP-429: the assignment is balanced and keeps
each member's previous partitions where balance allows; a partition moving
between members is left out of both assignments until its owner has revoked
it and rejoined, so no partition is ever consumed by two members at once.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from ingest.group.snapshot import AssignmentSnapshot, decode_snapshot, encode_snapshot
from ingest.group.types import RebalanceProtocol, java_order
from ingest.protocol.partition import Partition

__all__ = [
    "Assignor",
    "CooperativeStickyAssignor",
    "MemberAssignment",
    "MemberSubscription",
    "RangeAssignor",
    "RoundRobinAssignor",
    "member_order",
]

_INT32 = struct.Struct(">i")
_Validity = Callable[[str, Partition], bool]


@dataclass(frozen=True, kw_only=True)
class MemberSubscription:
    """What one member sent in JoinGroup, as the leader sees it."""

    topics: frozenset[str]
    owned_partitions: frozenset[Partition] = frozenset()
    generation_id: int = -1
    group_instance_id: str | None = None
    user_data: bytes | None = None


@dataclass(frozen=True, kw_only=True)
class MemberAssignment:
    partitions: frozenset[Partition] = field(default_factory=frozenset)
    user_data: bytes | None = None


def member_order(member_id: str, group_instance_id: str | None) -> tuple[int, bytes, bytes]:
    """Kafka's MemberInfo order: static members first by instance id, then dynamic by member id."""
    if group_instance_id is not None:
        return (0, java_order(group_instance_id), java_order(member_id))
    return (1, java_order(member_id), b"")


def _sorted_members(members: Mapping[str, MemberSubscription]) -> list[str]:
    return sorted(members, key=lambda m: member_order(m, members[m].group_instance_id))


class Assignor(ABC):
    """A partition assignment strategy, advertised in JoinGroup under ``name``."""

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    def supported_protocols(self) -> tuple[RebalanceProtocol, ...]:
        return (RebalanceProtocol.EAGER,)

    def subscription_user_data(self, generation_id: int) -> bytes | None:
        """user_data for this member's subscription; ``generation_id`` is that of its owned set."""
        del generation_id
        return None

    @abstractmethod
    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        generation_id: int = -1,
        retained_user_data: bytes | None = None,
    ) -> dict[str, MemberAssignment]:
        """Assign every partition of the subscribed topics in ``partitions_per_topic``.

        ``generation_id`` is the generation being assigned; ``retained_user_data``
        is the user_data this (leader) member got with its own last assignment
        from the same assignor. Topics missing from ``partitions_per_topic`` or
        with 0 partitions are not assigned. Every member gets an entry.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RangeAssignor(Assignor):
    """Per topic, consecutive ranges of partitions; the first members get one extra."""

    @property
    def name(self) -> str:
        return "range"

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        generation_id: int = -1,
        retained_user_data: bytes | None = None,
    ) -> dict[str, MemberAssignment]:
        ordered = _sorted_members(members)
        assignment: dict[str, set[Partition]] = {m: set() for m in ordered}
        for topic, count in partitions_per_topic.items():
            consumers = [m for m in ordered if topic in members[m].topics]
            if count <= 0 or not consumers:
                continue
            per_consumer, extra = divmod(count, len(consumers))
            start = 0
            for index, member in enumerate(consumers):
                length = per_consumer + (1 if index < extra else 0)
                assignment[member].update(Partition(topic, i) for i in range(start, start + length))
                start += length
        return {m: MemberAssignment(partitions=frozenset(ps)) for m, ps in assignment.items()}


class RoundRobinAssignor(Assignor):
    """All partitions in topic order, dealt in turn to the members subscribed to each."""

    @property
    def name(self) -> str:
        return "roundrobin"

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        generation_id: int = -1,
        retained_user_data: bytes | None = None,
    ) -> dict[str, MemberAssignment]:
        ordered = _sorted_members(members)
        assignment: dict[str, set[Partition]] = {m: set() for m in ordered}
        topics = sorted({t for m in ordered for t in members[m].topics}, key=java_order)
        turn = 0
        for topic in topics:
            for index in range(max(partitions_per_topic.get(topic, 0), 0)):
                # Skip members not subscribed to the topic; someone is, since it is listed.
                while topic not in members[ordered[turn % len(ordered)]].topics:
                    turn += 1
                assignment[ordered[turn % len(ordered)]].add(Partition(topic, index))
                turn += 1
        return {m: MemberAssignment(partitions=frozenset(ps)) for m, ps in assignment.items()}


class CooperativeStickyAssignor(Assignor):
    """Balanced, sticky and incremental (KIP-429); see the module docstring.

    Previous ownership comes from each member's ``owned_partitions`` (claims;
    on conflicting claims the higher generation wins, equal generations void
    the claim) and, for members that claim nothing, from the leader's retained
    snapshot (``ingest.group.snapshot``), which the leader then rewrites into
    every member's user_data.
    """

    @property
    def name(self) -> str:
        return "cooperative-sticky"

    @property
    def supported_protocols(self) -> tuple[RebalanceProtocol, ...]:
        return (RebalanceProtocol.COOPERATIVE, RebalanceProtocol.EAGER)

    def subscription_user_data(self, generation_id: int) -> bytes | None:
        # Kafka's layout (an int32 generation), read by peers on subscription v0/v1.
        return _INT32.pack(generation_id)

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        generation_id: int = -1,
        retained_user_data: bytes | None = None,
    ) -> dict[str, MemberAssignment]:
        ordered = _sorted_members(members)
        counts = {t: n for t, n in partitions_per_topic.items() if n > 0}
        topics_of = {m: frozenset(t for t in members[m].topics if t in counts) for m in ordered}

        def valid(member: str, partition: Partition) -> bool:
            return partition.topic in topics_of[member] and 0 <= partition.partition < counts.get(
                partition.topic, 0
            )

        previous = _previous_owners(ordered, members, valid, decode_snapshot(retained_user_data))
        target = _balanced(ordered, topics_of, counts, previous)

        # A partition new to a member is held back while anyone else still claims
        # it: the owner revokes it first and assigns it by rejoining.
        claimed = {p for m in ordered for p in members[m].owned_partitions}
        final = {
            m: frozenset(
                p for p in target[m] if p in members[m].owned_partitions or p not in claimed
            )
            for m in ordered
        }
        snapshot = encode_snapshot(
            AssignmentSnapshot.build(
                generation_id,
                final,
                {m: members[m].group_instance_id for m in ordered},
                pending={m: target[m] - final[m] for m in ordered},
            )
        )
        return {m: MemberAssignment(partitions=final[m], user_data=snapshot) for m in ordered}


def _previous_owners(
    ordered: list[str],
    members: Mapping[str, MemberSubscription],
    valid: _Validity,
    snapshot: AssignmentSnapshot | None,
) -> dict[str, set[Partition]]:
    owner: dict[Partition, str | None] = {}
    owner_generation: dict[Partition, int] = {}
    for member in ordered:
        subscription = members[member]
        generation = _claim_generation(subscription)
        for partition in sorted(subscription.owned_partitions):
            if not valid(member, partition):
                continue
            if partition not in owner or generation > owner_generation[partition]:
                owner[partition] = member
                owner_generation[partition] = generation
            elif generation == owner_generation[partition]:
                owner[partition] = None  # two claims in one generation: trust neither
    previous: dict[str, set[Partition]] = {m: set() for m in ordered}
    for partition, claimant in owner.items():
        if claimant is not None:
            previous[claimant].add(partition)
    if snapshot is None:
        return previous

    by_instance = {e.group_instance_id: e for e in snapshot.members if e.group_instance_id}
    by_member = {e.member_id: e for e in snapshot.members}
    newest_claim = max(owner_generation.values(), default=-1)
    taken = set(owner)
    for member in ordered:
        subscription = members[member]
        instance = subscription.group_instance_id
        entry = by_instance.get(instance) if instance is not None else by_member.get(member)
        if entry is None:
            continue
        inherited: frozenset[Partition] = frozenset()
        if not subscription.owned_partitions:  # claims are what a member really consumes
            inherited = entry.partition_set()
        if snapshot.generation_id >= newest_claim:
            # Finish the handoffs the last leader started (Kafka's transferring ownership).
            inherited |= entry.pending_set()
        for partition in sorted(inherited):
            if valid(member, partition) and partition not in taken:
                previous[member].add(partition)
                taken.add(partition)
    return previous


def _claim_generation(subscription: MemberSubscription) -> int:
    if subscription.generation_id >= 0:
        return subscription.generation_id
    data = subscription.user_data
    if data is not None and len(data) == _INT32.size:
        return int(_INT32.unpack(data)[0])
    return -1


def _balanced(
    ordered: list[str],
    topics_of: Mapping[str, frozenset[str]],
    counts: Mapping[str, int],
    previous: Mapping[str, Iterable[Partition]],
) -> dict[str, set[Partition]]:
    """Keep previous partitions, place the rest on the least loaded members, then even out.

    Balanced means no partition could move from a member to another member
    subscribed to its topic that holds at least two fewer partitions. With
    equal subscriptions that is "counts differ by at most one".
    """
    rank = {m: i for i, m in enumerate(ordered)}
    kept = {m: frozenset(previous[m]) for m in ordered}
    assignment = {m: set(kept[m]) for m in ordered}
    eligible = {t: [m for m in ordered if t in topics_of[m]] for t in counts}
    taken = {p for ps in assignment.values() for p in ps}
    free = [
        Partition(topic, index)
        for topic in sorted(counts, key=java_order)
        if eligible[topic]
        for index in range(counts[topic])
        if Partition(topic, index) not in taken
    ]
    # Place the partitions with the fewest candidates first.
    free.sort(key=lambda p: (len(eligible[p.topic]), java_order(p.topic), p.partition))
    for partition in free:
        target = min(eligible[partition.topic], key=lambda m: (len(assignment[m]), rank[m]))
        assignment[target].add(partition)

    while _move_one(ordered, rank, topics_of, kept, assignment):
        pass
    return assignment


def _move_one(
    ordered: list[str],
    rank: Mapping[str, int],
    topics_of: Mapping[str, frozenset[str]],
    kept: Mapping[str, frozenset[Partition]],
    assignment: dict[str, set[Partition]],
) -> bool:
    """Move one partition from the most to the least loaded member that can take it."""
    by_load = sorted(ordered, key=lambda m: (len(assignment[m]), rank[m]))
    for source in reversed(by_load):
        for target in by_load:
            if len(assignment[target]) + 2 > len(assignment[source]):
                break
            movable = [p for p in assignment[source] if p.topic in topics_of[target]]
            if movable:
                # Give away partitions the source did not have before first.
                choice = max(
                    movable,
                    key=lambda p: (p not in kept[source], java_order(p.topic), p.partition),
                )
                assignment[source].remove(choice)
                assignment[target].add(choice)
                return True
    return False
