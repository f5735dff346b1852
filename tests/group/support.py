"""Test support for the pure group layer: response builders, scripted paths to each
state, and a tiny in-process fake coordinator for multi-member simulations.

The fake coordinator exists only for these pure-layer tests of the membership
protocol; the driver is tested against the real broker.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ingest.group import (
    CoordinatorFound,
    FindCoordinator,
    GroupConfig,
    GroupMachine,
    MemberState,
    MetadataUpdate,
    NeedMetadata,
    Output,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.group.requests import topic_partitions
from ingest.protocol.codec import encode_request
from ingest.protocol.consumer import (
    ConsumerProtocolAssignment,
    decode_subscription,
    encode_assignment,
)
from ingest.protocol.error_codes import ErrorCode
from ingest.protocol.messages import (
    FindCoordinatorRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    JoinGroupResponseMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    MemberResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopics,
    SyncGroupRequest,
    SyncGroupResponse,
)
from ingest.protocol.partition import Partition
from ingest.protocol.schema import Request, Response

E = ErrorCode
TOPIC = "orders"
COOPERATIVE = "cooperative-sticky"


def config(**overrides: Any) -> GroupConfig:
    settings: dict[str, Any] = {
        "group_id": "g",
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        "retry_backoff_ms": 100,
    }
    settings.update(overrides)
    return GroupConfig(**settings)


def coordinator_found() -> CoordinatorFound:
    return CoordinatorFound(node_id=1, host="127.0.0.1", port=9092)


def requests_of(outputs: Iterable[object], kind: type[Request]) -> list[Any]:
    return [
        o.request for o in outputs if isinstance(o, SendRequest) and isinstance(o.request, kind)
    ]


def only_request(outputs: Iterable[object], kind: type[Request]) -> Any:
    found = requests_of(outputs, kind)
    assert len(found) == 1, f"expected one {kind.__name__} in {list(outputs)}"
    return found[0]


def events_of(outputs: Iterable[object], kind: type) -> list[Any]:
    return [o for o in outputs if isinstance(o, kind)]


def assert_encodable(outputs: Iterable[object]) -> None:
    """Every request the machine asks for must encode at the version it names."""
    for output in outputs:
        if isinstance(output, SendRequest):
            encode_request(output.request, version=output.version, correlation_id=1, client_id="t")


def tp(topic: str, *indexes: int) -> frozenset[Partition]:
    return frozenset(Partition(topic, i) for i in indexes)


def assignment_bytes(partitions: Iterable[Partition], user_data: bytes | None = None) -> bytes:
    return encode_assignment(
        ConsumerProtocolAssignment(
            assigned_partitions=topic_partitions(partitions), user_data=user_data
        )
    )


def join_ok(
    member_id: str,
    *,
    generation: int = 1,
    leader: str = "leader-0",
    members: Sequence[JoinGroupResponseMember] = (),
    protocol: str = COOPERATIVE,
    skip_assignment: bool = False,
) -> JoinGroupResponse:
    return JoinGroupResponse(
        error_code=0,
        generation_id=generation,
        protocol_type="consumer",
        protocol_name=protocol,
        leader=leader,
        member_id=member_id,
        members=tuple(members),
        skip_assignment=skip_assignment,
    )


def join_error(code: int, member_id: str = "") -> JoinGroupResponse:
    return JoinGroupResponse(
        error_code=code, generation_id=-1, protocol_name=None, leader="", member_id=member_id
    )


def sync_ok(
    partitions: Iterable[Partition] = (), user_data: bytes | None = None
) -> SyncGroupResponse:
    return SyncGroupResponse(
        error_code=0,
        protocol_type="consumer",
        protocol_name=COOPERATIVE,
        assignment=assignment_bytes(partitions, user_data),
    )


def sync_error(code: int) -> SyncGroupResponse:
    return SyncGroupResponse(error_code=code, assignment=b"")


def heartbeat(code: int = 0) -> HeartbeatResponse:
    return HeartbeatResponse(error_code=code)


def commit_response(request: OffsetCommitRequest, code: int = 0) -> OffsetCommitResponse:
    return OffsetCommitResponse(
        topics=tuple(
            OffsetCommitResponseTopic(
                name=t.name,
                partitions=tuple(
                    OffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=code
                    )
                    for p in t.partitions
                ),
            )
            for t in request.topics
        )
    )


class Script:
    """One machine driven by hand, with the clock in ``now``."""

    def __init__(self, cfg: GroupConfig | None = None, *, now: float = 100.0) -> None:
        self.machine = GroupMachine(cfg or config())
        self.now = now
        self.member_id = "member-1"

    @property
    def state(self) -> MemberState:
        return self.machine.state

    def __call__(self, event: Any, *, after: float = 0.0) -> list[Output]:
        self.now += after
        outputs = self.machine.handle(event, self.now)
        assert_encodable(outputs)
        return outputs

    # Scripted paths to each state (a follower of a leader called "leader-0").

    def joining(self, topics: Iterable[str] = (TOPIC,)) -> list[Output]:
        self(Subscribe(frozenset(topics)))
        outputs = self(coordinator_found())
        only_request(outputs, JoinGroupRequest)
        return outputs

    def syncing(self, generation: int = 1) -> list[Output]:
        if self.state is MemberState.UNJOINED:
            self.joining()
        outputs = self(join_ok(self.member_id, generation=generation))
        assert self.state is MemberState.SYNCING
        return outputs

    def stable(self, partitions: Iterable[Partition] = tp(TOPIC, 0, 1)) -> list[Output]:
        self.syncing()
        outputs = self(sync_ok(partitions))
        assert self.state is MemberState.STABLE, outputs
        return outputs

    def revoking(self) -> list[Output]:
        """Stable with orders-0/1, then a rebalance takes orders-1 away."""
        self.stable()
        self(Tick(), after=1.0)
        self(heartbeat(E.REBALANCE_IN_PROGRESS))
        assert self.state is MemberState.JOINING
        self(join_ok(self.member_id, generation=2))
        outputs = self(sync_ok(tp(TOPIC, 0)))
        assert self.state is MemberState.REVOKING, outputs
        return outputs


# -- the fake coordinator --------------------------------------------------------------


@dataclass
class _Member:
    client: str
    instance_id: str | None
    protocols: dict[str, bytes]
    protocol_order: list[str]


@dataclass
class FakeCoordinator:
    """Just enough of Kafka's classic group coordinator for in-process tests.

    Rebalances wait until every member has rejoined (``complete_join`` forces
    it, as the rebalance timeout would, dropping the members that did not).
    """

    group_id: str = "g"
    generation: int = 0
    phase: str = "Empty"  # Empty, PreparingRebalance, CompletingRebalance, Stable
    members: dict[str, _Member] = field(default_factory=dict)
    known_ids: set[str] = field(default_factory=set)
    leader: str | None = None
    protocol: str | None = None
    joins: dict[str, str] = field(default_factory=dict)  # member id -> client
    syncs: dict[str, str] = field(default_factory=dict)
    assignments: dict[str, bytes] | None = None
    offsets: dict[Partition, tuple[int, str | None]] = field(default_factory=dict)
    ids: itertools.count[int] = field(default_factory=itertools.count)

    def receive(self, client: str, request: Request) -> list[tuple[str, Response]]:
        if isinstance(request, JoinGroupRequest):
            return self._join(client, request)
        if isinstance(request, SyncGroupRequest):
            return self._sync(client, request)
        if isinstance(request, HeartbeatRequest):
            return [(client, HeartbeatResponse(error_code=self._check(request)))]
        if isinstance(request, LeaveGroupRequest):
            return self._leave(client, request)
        if isinstance(request, OffsetCommitRequest):
            return [(client, self._commit(request))]
        if isinstance(request, OffsetFetchRequest):
            return [(client, self._fetch(request))]
        raise AssertionError(f"unexpected {request}")

    def _check(self, request: HeartbeatRequest | SyncGroupRequest | OffsetCommitRequest) -> int:
        generation = (
            request.generation_id_or_member_epoch
            if isinstance(request, OffsetCommitRequest)
            else request.generation_id
        )
        if request.member_id not in self.members:
            return E.UNKNOWN_MEMBER_ID
        if generation != self.generation:
            return E.ILLEGAL_GENERATION
        if self.phase == "PreparingRebalance" and not isinstance(request, OffsetCommitRequest):
            return E.REBALANCE_IN_PROGRESS
        if self.phase == "CompletingRebalance" and isinstance(request, OffsetCommitRequest):
            return E.REBALANCE_IN_PROGRESS
        return 0

    def _join(self, client: str, request: JoinGroupRequest) -> list[tuple[str, Response]]:
        member_id = request.member_id
        if not member_id:
            member_id = f"{client}-{next(self.ids)}"
            self.known_ids.add(member_id)
            if request.group_instance_id is None:
                return [(client, join_error(E.MEMBER_ID_REQUIRED, member_id))]
            for old_id, old in list(self.members.items()):
                if old.instance_id == request.group_instance_id:
                    # A static member coming back replaces its old member id.
                    del self.members[old_id]
                    self.joins.pop(old_id, None)
                    if self.leader == old_id:
                        self.leader = member_id
        elif member_id not in self.members and member_id not in self.known_ids:
            return [(client, join_error(E.UNKNOWN_MEMBER_ID, member_id))]
        self.members[member_id] = _Member(
            client=client,
            instance_id=request.group_instance_id,
            protocols={p.name: p.metadata for p in request.protocols},
            protocol_order=[p.name for p in request.protocols],
        )
        self.joins[member_id] = client
        if self.phase != "PreparingRebalance":
            self.phase = "PreparingRebalance"
            self.assignments = None
        return self._maybe_complete_join()

    def _maybe_complete_join(self) -> list[tuple[str, Response]]:
        if set(self.joins) != set(self.members) or not self.members:
            return []
        return self.complete_join()

    def complete_join(self) -> list[tuple[str, Response]]:
        """End the join phase now; members that did not rejoin are removed."""
        for member_id in set(self.members) - set(self.joins):
            del self.members[member_id]
        if not self.members:
            self.phase = "Empty"
            return []
        self.generation += 1
        self.phase = "CompletingRebalance"
        if self.leader not in self.members:
            self.leader = sorted(self.joins)[0]
        leader = self.members[self.leader]
        self.protocol = next(
            p for p in leader.protocol_order if all(p in m.protocols for m in self.members.values())
        )
        everyone = tuple(
            JoinGroupResponseMember(
                member_id=m,
                group_instance_id=rec.instance_id,
                metadata=rec.protocols[self.protocol],
            )
            for m, rec in sorted(self.members.items())
        )
        replies: list[tuple[str, Response]] = []
        for member_id, client in sorted(self.joins.items()):
            replies.append(
                (
                    client,
                    join_ok(
                        member_id,
                        generation=self.generation,
                        leader=self.leader,
                        members=everyone if member_id == self.leader else (),
                        protocol=self.protocol,
                    ),
                )
            )
        self.joins = {}
        self.syncs = {}
        self.assignments = None
        return replies

    def _sync(self, client: str, request: SyncGroupRequest) -> list[tuple[str, Response]]:
        code = self._check(request)
        if code:
            return [(client, sync_error(code))]
        self.syncs[request.member_id] = client
        if request.member_id == self.leader:
            self.assignments = {a.member_id: a.assignment for a in request.assignments}
        if self.assignments is None:
            return []
        self.phase = "Stable"
        replies: list[tuple[str, Response]] = [
            (
                waiting,
                SyncGroupResponse(
                    error_code=0,
                    protocol_type="consumer",
                    protocol_name=self.protocol,
                    assignment=self.assignments.get(member_id, b""),
                ),
            )
            for member_id, waiting in sorted(self.syncs.items())
        ]
        self.syncs = {}
        return replies

    def _leave(self, client: str, request: LeaveGroupRequest) -> list[tuple[str, Response]]:
        ids = [request.member_id] if request.member_id else [m.member_id for m in request.members]
        for member_id in ids:
            self.members.pop(member_id, None)
            self.joins.pop(member_id, None)
        replies: list[tuple[str, Response]] = [
            (
                client,
                LeaveGroupResponse(
                    error_code=0,
                    members=tuple(
                        MemberResponse(member_id=m, group_instance_id=None, error_code=0)
                        for m in ids
                    ),
                ),
            )
        ]
        if self.members:
            self.phase = "PreparingRebalance"
            replies += self._maybe_complete_join()
        else:
            self.phase = "Empty"
        return replies

    def _commit(self, request: OffsetCommitRequest) -> OffsetCommitResponse:
        code = self._check(request)
        if not code:
            for t in request.topics:
                for p in t.partitions:
                    self.offsets[Partition(t.name, p.partition_index)] = (
                        p.committed_offset,
                        p.committed_metadata,
                    )
        return commit_response(request, code)

    def _fetch(self, request: OffsetFetchRequest) -> OffsetFetchResponse:
        group = request.groups[0]
        topics = []
        for t in group.topics or ():
            partitions = []
            for index in t.partition_indexes:
                offset, metadata = self.offsets.get(Partition(t.name, index), (-1, None))
                partitions.append(
                    OffsetFetchResponsePartitions(
                        partition_index=index,
                        committed_offset=offset,
                        metadata=metadata,
                        error_code=0,
                    )
                )
            topics.append(OffsetFetchResponseTopics(name=t.name, partitions=tuple(partitions)))
        return OffsetFetchResponse(
            groups=(OffsetFetchResponseGroup(group_id=group.group_id, topics=tuple(topics)),)
        )


class Simulation:
    """Several machines, one fake coordinator, and drivers that consume what they own.

    After every step it checks that no partition is consumed by two members.
    Revocations are acknowledged ``ack_delay`` deliveries later.
    """

    def __init__(self, partitions_per_topic: dict[str, int], *, ack_delay: int = 0) -> None:
        self.coordinator = FakeCoordinator()
        self.partitions_per_topic = partitions_per_topic
        self.machines: dict[str, GroupMachine] = {}
        self.consuming: dict[str, set[Partition]] = {}
        self.history: list[tuple[str, Output]] = []
        self.queue: deque[tuple[str, Any]] = deque()
        self.ack_delay = ack_delay
        self.now = 0.0

    def add(self, client: str, cfg: GroupConfig, topics: Iterable[str]) -> GroupMachine:
        machine = GroupMachine(cfg)
        self.machines[client] = machine
        self.consuming[client] = set()
        self.queue.append((client, Subscribe(frozenset(topics))))
        return machine

    def send(self, client: str, event: Any) -> None:
        self.queue.append((client, event))

    def _apply(self, client: str, event: Any) -> None:
        machine = self.machines[client]
        outputs = machine.handle(event, self.now)
        assert_encodable(outputs)
        for output in outputs:
            self.history.append((client, output))
            self._route(client, output)
        self._check_exclusive()

    def _route(self, client: str, output: Output) -> None:
        if isinstance(output, SendRequest):
            assert not isinstance(output.request, FindCoordinatorRequest)
            for target, response in self.coordinator.receive(client, output.request):
                self.queue.append((target, response))
        elif isinstance(output, FindCoordinator):
            self.queue.append((client, coordinator_found()))
        elif isinstance(output, NeedMetadata):
            counts = {t: self.partitions_per_topic.get(t, 0) for t in output.topics}
            self.queue.append((client, MetadataUpdate(counts)))
        elif isinstance(output, PartitionsAssigned):
            self.consuming[client] |= output.added
        elif isinstance(output, PartitionsRevoked):
            # The driver stops these partitions, then acknowledges (possibly later).
            self.queue.append((client, _DelayedAck(output.partitions, self.ack_delay)))
        elif isinstance(output, PartitionsLost):
            self.consuming[client] -= output.partitions

    def _check_exclusive(self) -> None:
        seen: dict[Partition, str] = {}
        for client, partitions in self.consuming.items():
            for partition in partitions:
                assert partition not in seen, (
                    f"{partition} consumed by {seen[partition]} and {client}"
                )
                seen[partition] = client

    def run(self, *, max_steps: int = 10_000) -> None:
        """Deliver everything queued, ticking the clock when the queue runs dry, until settled."""
        for _ in range(max_steps):
            if self.queue:
                client, event = self.queue.popleft()
                if client not in self.machines:
                    continue
                if isinstance(event, _DelayedAck):
                    if event.remaining > 0:
                        event.remaining -= 1
                        self.queue.append((client, event))
                        continue
                    self.consuming[client] -= event.partitions
                    event = RevocationDone()
                self._apply(client, event)
                continue
            if self.settled():
                return
            self.tick()
        raise AssertionError("the simulation did not settle")

    def tick(self, seconds: float = 0.5) -> None:
        self.now += seconds
        for client, machine in self.machines.items():
            if machine.state not in (MemberState.FENCED, MemberState.FAILED):
                self._apply(client, Tick())

    def settled(self) -> bool:
        return all(
            m.state in (MemberState.STABLE, MemberState.UNJOINED) for m in self.machines.values()
        ) and self.coordinator.phase in ("Stable", "Empty")

    def owned(self) -> dict[str, frozenset[Partition]]:
        return {c: m.assignment for c, m in self.machines.items()}

    def subscription_metadata(self) -> dict[str, Any]:
        return {
            m: decode_subscription(rec.protocols[COOPERATIVE])
            for m, rec in self.coordinator.members.items()
            if COOPERATIVE in rec.protocols
        }


@dataclass
class _DelayedAck:
    partitions: frozenset[Partition]
    remaining: int
