"""Commits from a generation the group has left behind never land, and are never resent.

* Our member on its own, real broker: a member whose process was stopped past
  its session timeout declares its partitions lost and refuses the commit
  before any request goes out.
* The broker, real broker: a commit from a generation the group has left
  behind is refused (crafted: our member cannot be made to miss a rebalance
  on cue). Tansu still accepts one while the next generation is syncing: a
  strict xfail.
* Our reaction to Kafka's refusal (ILLEGAL_GENERATION to our own commit):
  against a scripted coordinator that fences as Kafka does, over real
  sockets. The commit fails with a clear error, is never resent, the
  partitions are lost and the member rejoins.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from ingest.client import BrokerConnection
from ingest.errors import FencedError
from ingest.group import CommitFailed, GroupConfig, MemberState, PartitionsAssigned, PartitionsLost
from ingest.group.requests import commit_error, offset_commit_request
from ingest.membership.member import GroupMember, check_commit
from ingest.protocol.error_codes import ErrorCode
from ingest.protocol.headers import RequestHeader
from ingest.protocol.messages import (
    Coordinator,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    JoinGroupResponseMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    MetadataRequest,
    MetadataResponse,
    MetadataResponseBroker,
    MetadataResponsePartition,
    MetadataResponseTopic,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    SyncGroupRequest,
    SyncGroupResponse,
)
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, create_topic, unique_name
from tests.brokers import BROKERS, server_for, tansu_deviates
from tests.client.peer import PeerConnection, ScriptedPeer, kafka_script
from tests.supervisor.member_process import MemberProcess
from tests.supervisor.support import (
    REBALANCE_WAIT,
    Recorder,
    client_config,
    group_config,
    partitions,
    pump_until,
)
from tests.supervisor.test_membership import committed_by_another_client

PARTITIONS = 4


@pytest.mark.slow
def test_a_stalled_member_commits_nothing_once_its_session_expired(
    broker: KafkaCluster, topic: str, group: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    everything = partitions(topic, PARTITIONS)
    stalled = MemberProcess({"bootstrap": broker.bootstrap, "group": group, "topic": topic})
    other = Recorder(GroupMember(client_config(broker.bootstrap), group_config(group)), "other")
    other.member.subscribe([topic])
    try:
        pump_until(
            [other],
            lambda: (
                other.stable and len(other.owned) == 2 and stalled.owned == everything - other.owned
            ),
            REBALANCE_WAIT,
            "the two members to split the partitions",
        )
        believed = stalled.owned
        stalled.signal(signal.SIGSTOP)  # the whole process stalls, membership thread included
        # The group moves on without it: its session expires and the other member takes over.
        pump_until(
            [other],
            lambda: other.stable and other.owned == everything,
            REBALANCE_WAIT,
            "the other member to take over",
        )
        # Resumed, it is asked to commit what it still believes it owns.
        stalled.send({"commit": [[p.topic, p.partition, 42] for p in sorted(believed)]})
        stalled.signal(signal.SIGCONT)
        stalled.wait_for(
            lambda: bool(stalled.of("commit") and stalled.of("lost")), 10, "the refusal"
        )
        (outcome,) = stalled.of("commit")
        assert not outcome["ok"]
        assert outcome["error_code"] is None, "refused by the member, not by the broker"
        assert outcome["error_name"] in ("REBALANCE_IN_PROGRESS", "NOT_A_MEMBER")
        assert not outcome["retriable"]
        assert outcome["offset_commits_sent"] == 0
        (lost,) = stalled.of("lost")
        assert {Partition(t, p) for t, p in lost["partitions"]} == believed
        assert committed_by_another_client(broker.bootstrap, group, topic) == {}
    finally:
        stalled.stop()
        other.member.close()


def stale_commit_error(
    broker: KafkaCluster,
    config: GroupConfig,
    generation: int,
    member_id: str,
    offsets: dict[Partition, int],
) -> int:
    """The broker's answer to the OffsetCommit a member that missed a rebalance would send.

    Crafted on a connection of its own: our member never sends one for a
    generation it knows is over, and cannot be made to miss one on cue.
    """
    with BrokerConnection("127.0.0.1", broker.port, client_config(broker.bootstrap)) as connection:
        connection.connect()
        version = connection.version_for(OffsetCommitRequest.api_key)
        request = offset_commit_request(
            config,
            generation_id=generation,
            member_id=member_id,
            offsets=offsets,
            metadata="delta-v1",
            version=version,
        )
        response = connection.request(request, version=version)
    assert isinstance(response, OffsetCommitResponse)
    return commit_error(response)


@dataclass
class MissedRebalance:
    """What the broker answered the commits of a member that missed a rebalance."""

    mid_rebalance: int  # sent once the newer generation's JoinGroup was answered
    after_rebalance: int  # sent once the newer generation is synced
    committed: dict[int, int]  # the group's committed offsets afterwards, per partition


@pytest.fixture(scope="module", params=BROKERS)
def missed_rebalance(request: pytest.FixtureRequest) -> Iterator[MissedRebalance]:
    """A owns every partition in generation g; B joins; A's generation-g commits are crafted.
    On Apache Kafka, then on Tansu."""
    broker = server_for(request)
    topic, group = unique_name("t-fencing"), unique_name("g-fencing")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    everything = partitions(topic, PARTITIONS)
    config = group_config(group)
    a, b = (Recorder(GroupMember(client_config(broker.bootstrap), config), n) for n in "ab")
    try:
        a.member.subscribe([topic])
        pump_until([a], lambda: a.stable and a.owned == everything, REBALANCE_WAIT, "a alone")
        generation, member_id = a.member.generation_id, a.member.member_id
        b.member.subscribe([topic])
        # B's JoinGroup answered: the group is in a newer generation, not synced yet.
        pump_until([a, b], lambda: b.member.generation_id > generation, REBALANCE_WAIT, "b")
        partition_0, others = Partition(topic, 0), sorted(everything - {Partition(topic, 0)})
        mid = stale_commit_error(broker, config, generation, member_id, {partition_0: 41})
        pump_until(
            [a, b],
            lambda: a.stable and b.stable and a.owned | b.owned == everything and bool(b.owned),
            REBALANCE_WAIT,
            "the rebalance",
        )
        assert a.member.generation_id > generation
        after = stale_commit_error(broker, config, generation, member_id, dict.fromkeys(others, 42))
        committed = committed_by_another_client(broker.bootstrap, group, topic)
        yield MissedRebalance(mid, after, committed)
    finally:
        a.member.close()
        b.member.close()


@pytest.mark.slow
def test_the_broker_refuses_a_commit_from_a_generation_it_left_behind(
    missed_rebalance: MissedRebalance,
) -> None:
    assert missed_rebalance.after_rebalance == ErrorCode.ILLEGAL_GENERATION
    assert set(missed_rebalance.committed) <= {0}, "the refused commit landed"


@pytest.mark.slow
def test_the_broker_refuses_a_commit_from_the_previous_generation_mid_rebalance(
    missed_rebalance: MissedRebalance, request: pytest.FixtureRequest
) -> None:
    tansu_deviates(
        request,
        reason="Tansu 0.6.0 accepts an OffsetCommit from the previous generation while the "
        "next one syncs (its JoinGroup already answered); Kafka answers ILLEGAL_GENERATION",
        raises=AssertionError,
    )
    assert missed_rebalance.mid_rebalance == ErrorCode.ILLEGAL_GENERATION
    assert missed_rebalance.committed == {}


class FencingCoordinator:
    """A scripted broker and group coordinator for one member, fencing as Kafka does.

    Topic "t" has two partitions. ``move_on()`` starts a generation the member
    did not join (as when a rebalance completed without it); from then on
    its heartbeats and commits for the old generation get ILLEGAL_GENERATION.
    """

    MEMBER_ID = "member-1"

    def __init__(self) -> None:
        self.generation = 1
        self.commits: list[OffsetCommitRequest] = []
        self.joins: list[JoinGroupRequest] = []
        self._lock = threading.Lock()
        handlers = {
            FindCoordinatorRequest.api_key: self.find_coordinator,
            MetadataRequest.api_key: self.metadata,
            JoinGroupRequest.api_key: self.join,
            SyncGroupRequest.api_key: self.sync,
            HeartbeatRequest.api_key: self.heartbeat,
            OffsetCommitRequest.api_key: self.commit,
            LeaveGroupRequest.api_key: self.leave,
        }
        self.peer = ScriptedPeer(kafka_script(handlers))

    def move_on(self) -> None:
        with self._lock:
            self.generation += 1

    def current(self) -> int:
        with self._lock:
            return self.generation

    def find_coordinator(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        port = self.peer.port
        if header.request_api_version >= 4:
            return FindCoordinatorResponse(
                coordinators=tuple(
                    Coordinator(key=k, node_id=1, host="127.0.0.1", port=port, error_code=0)
                    for k in request.coordinator_keys
                )
            )
        return FindCoordinatorResponse(error_code=0, node_id=1, host="127.0.0.1", port=port)

    def metadata(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        partitions = tuple(
            MetadataResponsePartition(
                partition_index=i, leader_id=1, replica_nodes=(1,), isr_nodes=(1,)
            )
            for i in (0, 1)
        )
        return MetadataResponse(
            brokers=(MetadataResponseBroker(node_id=1, host="127.0.0.1", port=self.peer.port),),
            topics=(MetadataResponseTopic(name="t", partitions=partitions),),
        )

    def join(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        self.joins.append(request)
        protocol = request.protocols[0]
        return JoinGroupResponse(
            error_code=0,
            generation_id=self.current(),
            protocol_type="consumer",
            protocol_name=protocol.name,
            leader=self.MEMBER_ID,
            member_id=self.MEMBER_ID,
            members=(
                JoinGroupResponseMember(
                    member_id=self.MEMBER_ID,
                    group_instance_id=request.group_instance_id,
                    metadata=protocol.metadata,
                ),
            ),
        )

    def sync(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        mine = next(a.assignment for a in request.assignments if a.member_id == self.MEMBER_ID)
        return SyncGroupResponse(
            error_code=self._fence(request.generation_id),
            protocol_type="consumer",
            protocol_name=request.protocol_name,
            assignment=mine,
        )

    def heartbeat(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        return HeartbeatResponse(error_code=self._fence(request.generation_id))

    def commit(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        self.commits.append(request)
        code = self._fence(request.generation_id_or_member_epoch)
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

    def leave(self, peer: PeerConnection, header: RequestHeader, request: Any) -> Any:
        return LeaveGroupResponse(error_code=0)

    def _fence(self, generation: int) -> int:
        return 0 if generation == self.current() else ErrorCode.ILLEGAL_GENERATION


def test_a_fenced_commit_fails_clearly_and_is_never_resent() -> None:
    coordinator = FencingCoordinator()
    with coordinator.peer:
        config = group_config(
            "g",
            group_instance_id="instance-1",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=4_000,  # no heartbeat between move_on() and the commit
        )
        with GroupMember(client_config(coordinator.peer.address), config) as member:
            recorder = Recorder(member, "member")
            member.subscribe(["t"])
            both = frozenset({Partition("t", 0), Partition("t", 1)})
            pump_until([recorder], lambda: recorder.owned == both and recorder.stable, 10, "join")
            assert member.generation_id == 1

            coordinator.move_on()
            outcome = member.commit({Partition("t", 0): 10}, "delta-v3")

            assert isinstance(outcome, CommitFailed)
            assert (outcome.error_code, outcome.error_name) == (22, "ILLEGAL_GENERATION")
            assert not outcome.retriable
            with pytest.raises(
                FencedError, match=r"OffsetCommit of t-0 failed: ILLEGAL_GENERATION"
            ):
                check_commit(outcome)
            (sent,) = coordinator.commits
            assert (sent.generation_id_or_member_epoch, sent.member_id) == (1, "member-1")
            assert sent.group_instance_id == "instance-1"
            partition = sent.topics[0].partitions[0]
            assert (partition.committed_offset, partition.committed_metadata) == (10, "delta-v3")

            # Its partitions are lost and it rejoins, in the new generation.
            pump_until(
                [recorder],
                lambda: recorder.stable and member.generation_id == 2,
                10,
                "the rejoin",
            )
            lost = recorder.of(PartitionsLost)
            assert len(lost) == 1 and isinstance(lost[0], PartitionsLost)
            assert lost[0].partitions == both
            assigned = recorder.of(PartitionsAssigned)
            assert isinstance(assigned[-1], PartitionsAssigned) and assigned[-1].generation_id == 2
            assert len(coordinator.joins) == 2 and coordinator.joins[1].member_id == "member-1"
            time.sleep(0.2)
            assert len(coordinator.commits) == 1, "the fenced commit was resent"

            # Committing again (what is still owned, in the new generation) succeeds.
            check_commit(member.commit({Partition("t", 0): 10}, "delta-v3"))
            assert coordinator.commits[-1].generation_id_or_member_epoch == 2
            assert member.state is MemberState.STABLE
