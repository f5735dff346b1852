"""Scripted handshakes: each coordinator answer leads where Kafka's consumer goes."""

from __future__ import annotations

import pytest

from ingest.group import (
    CooperativeStickyAssignor,
    CoordinatorFound,
    CoordinatorLost,
    CoordinatorVersions,
    Fatal,
    Fenced,
    FetchCommitted,
    FindCoordinator,
    GroupMachine,
    InvalidTransition,
    Leave,
    Left,
    MemberState,
    MetadataUpdate,
    NeedMetadata,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RangeAssignor,
    RequestFailed,
    RevocationDone,
    RoundRobinAssignor,
    Subscribe,
    Tick,
)
from ingest.protocol.consumer import (
    ConsumerProtocolSubscription,
    decode_assignment,
    decode_subscription,
    encode_subscription,
)
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupResponseMember,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetFetchRequest,
    SyncGroupRequest,
)
from ingest.protocol.partition import Partition
from tests.group.support import (
    COOPERATIVE,
    TOPIC,
    E,
    Script,
    config,
    coordinator_found,
    events_of,
    heartbeat,
    join_error,
    join_ok,
    only_request,
    requests_of,
    sync_error,
    sync_ok,
    tp,
)

S = MemberState


def owned_in(join: JoinGroupRequest) -> set[tuple[str, int]]:
    payload = decode_subscription(join.protocols[0].metadata)
    return {(t.topic, p) for t in payload.owned_partitions for p in t.partitions}


# -- the join handshake ---------------------------------------------------------------


def test_first_join_asks_for_the_coordinator_then_joins_with_an_empty_member_id() -> None:
    s = Script()
    assert events_of(s(Subscribe(frozenset({TOPIC}))), FindCoordinator)
    assert s.state is S.JOINING
    join = only_request(s(coordinator_found()), JoinGroupRequest)
    assert join.member_id == ""
    assert join.protocol_type == "consumer"
    assert [p.name for p in join.protocols] == [COOPERATIVE]
    payload = decode_subscription(join.protocols[0].metadata)
    assert payload.topics == (TOPIC,) and payload.generation_id == -1


def test_member_id_required_round_trip() -> None:
    s = Script()
    s.joining()
    outputs = s(join_error(E.MEMBER_ID_REQUIRED, "member-7"))
    rejoin = only_request(outputs, JoinGroupRequest)
    assert rejoin.member_id == "member-7"
    assert s.state is S.JOINING and s.machine.member_id == "member-7"


def test_follower_sends_an_empty_sync_and_applies_its_assignment() -> None:
    s = Script()
    s.joining()
    sync = only_request(s(join_ok("member-1", generation=5, leader="other")), SyncGroupRequest)
    assert (sync.generation_id, sync.member_id, sync.assignments) == (5, "member-1", ())
    assert sync.protocol_name == COOPERATIVE
    assert not s.machine.is_leader
    outputs = s(sync_ok(tp(TOPIC, 2, 3)))
    (assigned,) = events_of(outputs, PartitionsAssigned)
    assert assigned.added == assigned.assignment == tp(TOPIC, 2, 3)
    assert assigned.generation_id == 5
    assert s.state is S.STABLE and s.machine.assignment == tp(TOPIC, 2, 3)


def subscription_bytes(*topics: str, owned: tuple[tuple[str, int], ...] = ()) -> bytes:
    from ingest.group.requests import topic_partitions
    from ingest.protocol.partition import Partition

    return encode_subscription(
        ConsumerProtocolSubscription(
            topics=topics, owned_partitions=topic_partitions(Partition(*o) for o in owned)
        )
    )


def test_leader_asks_for_metadata_then_assigns_every_member() -> None:
    s = Script()
    s.joining()
    members = (
        JoinGroupResponseMember(member_id="member-1", metadata=subscription_bytes(TOPIC)),
        JoinGroupResponseMember(member_id="member-2", metadata=subscription_bytes(TOPIC, "audit")),
    )
    outputs = s(join_ok("member-1", leader="member-1", members=members))
    assert s.machine.is_leader
    assert events_of(outputs, NeedMetadata) == [NeedMetadata(frozenset({TOPIC, "audit"}))]
    assert not requests_of(outputs, SyncGroupRequest)
    sync = only_request(s(MetadataUpdate({TOPIC: 4, "audit": 2})), SyncGroupRequest)
    given = {a.member_id: decode_assignment(a.assignment) for a in sync.assignments}
    assert set(given) == {"member-1", "member-2"}
    everything = {
        (t.topic, p) for a in given.values() for t in a.assigned_partitions for p in t.partitions
    }
    assert everything == {(TOPIC, i) for i in range(4)} | {("audit", 0), ("audit", 1)}
    assert all(a.user_data for a in given.values()), "the sticky snapshot goes to every member"


def test_leader_uses_the_assignor_the_coordinator_picked() -> None:
    s = Script(config(assignors=(RangeAssignor(), RoundRobinAssignor())))
    assert s.machine.protocol.value == "eager"
    join = only_request(s.joining(), JoinGroupRequest)
    assert [p.name for p in join.protocols] == ["range", "roundrobin"]
    s(MetadataUpdate({TOPIC: 3, "b": 3}))
    members = tuple(
        JoinGroupResponseMember(member_id=m, metadata=subscription_bytes(TOPIC, "b"))
        for m in ("member-1", "member-2")
    )
    sync = only_request(
        s(join_ok("member-1", leader="member-1", members=members, protocol="roundrobin")),
        SyncGroupRequest,
    )
    given = {
        a.member_id: {
            (t.topic, p)
            for t in decode_assignment(a.assignment).assigned_partitions
            for p in t.partitions
        }
        for a in sync.assignments
    }
    # roundrobin, not range: the topics are dealt alternately (range would give b-0 and b-1 to member-1).
    assert given["member-1"] == {("b", 0), ("b", 2), (TOPIC, 1)}
    assert given["member-2"] == {("b", 1), (TOPIC, 0), (TOPIC, 2)}


def test_unknown_protocol_or_type_is_inconsistent() -> None:
    s = Script()
    s.joining()
    outputs = s(join_ok("member-1", protocol="range"))
    (fatal,) = events_of(outputs, Fatal)
    assert fatal.error_name == "INCONSISTENT_GROUP_PROTOCOL" and s.state is S.FAILED
    s = Script()
    s.syncing()
    bad = sync_ok(tp(TOPIC, 0))
    outputs = s(
        type(bad)(
            error_code=0,
            protocol_type="connect",
            protocol_name=COOPERATIVE,
            assignment=bad.assignment,
        )
    )
    assert events_of(outputs, Fatal)[0].error_name == "INCONSISTENT_GROUP_PROTOCOL"


def test_static_leader_with_skip_assignment_sends_an_empty_sync() -> None:
    s = Script(config(group_instance_id="host-1"))
    s.joining()
    member = JoinGroupResponseMember(member_id="member-1", metadata=subscription_bytes(TOPIC))
    outputs = s(join_ok("member-1", leader="member-1", members=(member,), skip_assignment=True))
    assert only_request(outputs, SyncGroupRequest).assignments == ()


# -- JoinGroup errors -------------------------------------------------------------------


@pytest.mark.parametrize("code", [E.REBALANCE_IN_PROGRESS, E.MEMBER_ID_REQUIRED])
def test_join_errors_that_rejoin_at_once_keep_the_member_id(code: int) -> None:
    s = Script()
    s.joining()
    s(join_error(E.MEMBER_ID_REQUIRED, "member-1"))
    rejoin = only_request(s(join_error(code, "member-1")), JoinGroupRequest)
    assert rejoin.member_id == "member-1"


def test_join_unknown_member_id_resets_the_member_id_and_loses_partitions() -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)
    s(heartbeat(E.REBALANCE_IN_PROGRESS))  # cooperative: keeps its partitions
    assert s.machine.assignment == tp(TOPIC, 0, 1)
    outputs = s(join_error(E.UNKNOWN_MEMBER_ID, "member-1"))
    assert events_of(outputs, PartitionsLost)[0].partitions == tp(TOPIC, 0, 1)
    rejoin = only_request(outputs, JoinGroupRequest)
    assert rejoin.member_id == "" and owned_in(rejoin) == set()
    assert s.machine.assignment == frozenset()


def test_coordinator_loading_backs_off_before_rejoining() -> None:
    s = Script()
    s.joining()
    assert not requests_of(s(join_error(E.COORDINATOR_LOAD_IN_PROGRESS)), JoinGroupRequest)
    assert s.machine.next_deadline() == pytest.approx(s.now + 0.1)
    assert not requests_of(s(Tick(), after=0.05), JoinGroupRequest)
    only_request(s(Tick(), after=0.05), JoinGroupRequest)


@pytest.mark.parametrize("code", [E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR])
def test_join_coordinator_errors_rediscover_the_coordinator(code: int) -> None:
    s = Script()
    s.joining()
    outputs = s(join_error(code))
    assert events_of(outputs, FindCoordinator) and not requests_of(outputs, JoinGroupRequest)
    assert s.machine.coordinator is None and s.state is S.JOINING
    only_request(s(coordinator_found()), JoinGroupRequest)


@pytest.mark.parametrize(
    "code",
    [
        E.GROUP_AUTHORIZATION_FAILED,
        E.INCONSISTENT_GROUP_PROTOCOL,
        E.INVALID_SESSION_TIMEOUT,
        E.INVALID_GROUP_ID,
        E.GROUP_MAX_SIZE_REACHED,
        E.UNSUPPORTED_VERSION,
        E.UNKNOWN_SERVER_ERROR,
    ],
)
def test_fatal_join_errors(code: int) -> None:
    s = Script()
    s.joining()
    (fatal,) = events_of(s(join_error(code)), Fatal)
    assert s.state is S.FAILED
    assert fatal.error_code == code and fatal.error_name == error_for(code).name
    assert s.machine.next_deadline() is None
    assert s(Tick(), after=60) == []


def test_group_authorization_failure_names_the_group() -> None:
    s = Script(config(group_id="payments"))
    s.joining()
    (fatal,) = events_of(s(join_error(E.GROUP_AUTHORIZATION_FAILED)), Fatal)
    assert "not authorized" in fatal.message and "'payments'" in fatal.message


def test_fenced_instance_id_on_join_is_terminal() -> None:
    s = Script(config(group_instance_id="host-1"))
    s.joining()
    (fenced,) = events_of(s(join_error(E.FENCED_INSTANCE_ID)), Fenced)
    assert "host-1" in fenced.reason and s.state is S.FENCED
    with pytest.raises(InvalidTransition, match="Subscribe is not valid in state FENCED"):
        s(Subscribe(frozenset({TOPIC})))


# -- SyncGroup errors -------------------------------------------------------------------


def test_sync_rebalance_in_progress_rejoins_with_the_same_identity() -> None:
    s = Script()
    s(Subscribe(frozenset({TOPIC})))
    first = only_request(s(coordinator_found()), JoinGroupRequest)
    s(join_ok(s.member_id, generation=3))
    rejoin = only_request(s(sync_error(E.REBALANCE_IN_PROGRESS)), JoinGroupRequest)
    assert rejoin.member_id == "member-1" and s.state is S.JOINING
    # Nothing is owned yet, so the subscription claims no generation and is byte-identical.
    assert decode_subscription(rejoin.protocols[0].metadata).generation_id == -1
    assert rejoin.protocols == first.protocols


def test_the_subscription_carries_the_generation_of_what_is_owned() -> None:
    """A failed sync in a later generation leaves the claim, and the bytes, unchanged.

    A broker that starts a new generation for every changed subscription (Tansu 0.6.0)
    would otherwise be pushed into a new generation by every rejoin.
    """
    s = Script()
    s.stable()  # generation 1 owns orders-0/1
    s(Tick(), after=1.0)
    first = only_request(s(heartbeat(E.REBALANCE_IN_PROGRESS)), JoinGroupRequest)
    s(join_ok(s.member_id, generation=2))
    rejoin = only_request(s(sync_error(E.REBALANCE_IN_PROGRESS)), JoinGroupRequest)
    claim = decode_subscription(rejoin.protocols[0].metadata)
    assert claim.generation_id == 1
    assert rejoin.protocols == first.protocols
    s(join_ok(s.member_id, generation=5))
    s(sync_ok(tp(TOPIC, 0, 1)))
    s(Tick(), after=1.0)
    later = only_request(s(heartbeat(E.REBALANCE_IN_PROGRESS)), JoinGroupRequest)
    assert decode_subscription(later.protocols[0].metadata).generation_id == 5


@pytest.mark.parametrize(
    ("code", "member_id_after"),
    [(E.UNKNOWN_MEMBER_ID, ""), (E.ILLEGAL_GENERATION, "member-1")],
)
def test_sync_generation_errors_reset_and_rejoin(code: int, member_id_after: str) -> None:
    s = Script()
    s.syncing(generation=3)
    rejoin = only_request(s(sync_error(code)), JoinGroupRequest)
    assert rejoin.member_id == member_id_after
    assert decode_subscription(rejoin.protocols[0].metadata).generation_id == -1


def test_sync_coordinator_error_rediscovers_then_rejoins() -> None:
    s = Script()
    s.syncing()
    outputs = s(sync_error(E.NOT_COORDINATOR))
    assert events_of(outputs, FindCoordinator) and s.state is S.JOINING
    assert only_request(s(coordinator_found()), JoinGroupRequest).member_id == "member-1"


@pytest.mark.parametrize(
    ("code", "state"),
    [(E.FENCED_INSTANCE_ID, S.FENCED), (E.GROUP_AUTHORIZATION_FAILED, S.FAILED)],
)
def test_sync_terminal_errors(code: int, state: MemberState) -> None:
    s = Script(config(group_instance_id="host-1"))
    s.syncing()
    s(sync_error(code))
    assert s.state is state


def test_stale_sync_response_after_leaving_is_ignored() -> None:
    s = Script()
    s.syncing()
    s(Leave())
    assert s.state is S.LEAVING
    assert s(sync_ok(tp(TOPIC, 0))) == []
    assert s.machine.assignment == frozenset()


# -- heartbeats and the session -----------------------------------------------------------


def test_heartbeats_are_due_every_interval_one_at_a_time() -> None:
    s = Script()
    s.stable()
    assert s.machine.next_deadline() == pytest.approx(s.now + 1.0)
    assert s(Tick(), after=0.5) == []
    hb = only_request(s(Tick(), after=0.5), HeartbeatRequest)
    assert (hb.generation_id, hb.member_id, hb.group_instance_id) == (1, "member-1", None)
    assert s(heartbeat(), after=0.25) == []
    assert s(Tick(), after=0.5) == []
    only_request(s(Tick(), after=0.25), HeartbeatRequest)
    assert s(Tick(), after=1.5) == [], "one heartbeat in flight at a time"
    # An answer that comes after the interval lets the next heartbeat go at once.
    only_request(s(heartbeat()), HeartbeatRequest)


def test_heartbeats_run_while_syncing() -> None:
    s = Script()
    s.syncing()
    only_request(s(Tick(), after=1.0), HeartbeatRequest)
    # A rebalance notice while syncing is expected and ignored, as in Kafka.
    assert s(heartbeat(E.REBALANCE_IN_PROGRESS)) == []
    assert s.state is S.SYNCING


def test_cooperative_rebalance_keeps_partitions_while_rejoining() -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)
    outputs = s(heartbeat(E.REBALANCE_IN_PROGRESS))
    assert not events_of(outputs, PartitionsRevoked)
    rejoin = only_request(outputs, JoinGroupRequest)
    assert owned_in(rejoin) == {(TOPIC, 0), (TOPIC, 1)}
    assert s.state is S.JOINING and s.machine.assignment == tp(TOPIC, 0, 1)
    # The new generation keeps orders-0, drops orders-1 and adds orders-2: only the difference moves.
    s(join_ok("member-1", generation=2))
    outputs = s(sync_ok(tp(TOPIC, 0, 2)))
    assert events_of(outputs, PartitionsRevoked) == [PartitionsRevoked(tp(TOPIC, 1))]
    (assigned,) = events_of(outputs, PartitionsAssigned)
    assert assigned.added == tp(TOPIC, 2) and assigned.assignment == tp(TOPIC, 0, 2)
    assert s.state is S.REVOKING
    # The revoked partition stays committable until the driver is done with it.
    assert s.machine.assignment == tp(TOPIC, 0, 1, 2)
    rejoin = only_request(s(RevocationDone()), JoinGroupRequest)
    assert owned_in(rejoin) == {(TOPIC, 0), (TOPIC, 2)}
    assert s.machine.assignment == tp(TOPIC, 0, 2)


def test_eager_rebalance_revokes_everything_before_rejoining() -> None:
    s = Script(config(assignors=(CooperativeStickyAssignor(), RangeAssignor())))
    s.stable()
    s(Tick(), after=1.0)
    outputs = s(heartbeat(E.REBALANCE_IN_PROGRESS))
    assert events_of(outputs, PartitionsRevoked) == [PartitionsRevoked(tp(TOPIC, 0, 1))]
    assert not requests_of(outputs, JoinGroupRequest) and s.state is S.REVOKING
    rejoin = only_request(s(RevocationDone()), JoinGroupRequest)
    assert owned_in(rejoin) == set()


@pytest.mark.parametrize(
    ("code", "member_id_after"),
    [(E.ILLEGAL_GENERATION, "member-1"), (E.UNKNOWN_MEMBER_ID, "")],
)
def test_heartbeat_generation_errors_lose_partitions_and_rejoin(
    code: int, member_id_after: str
) -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)
    outputs = s(heartbeat(code))
    assert events_of(outputs, PartitionsLost)[0].partitions == tp(TOPIC, 0, 1)
    assert not events_of(outputs, PartitionsRevoked)
    rejoin = only_request(outputs, JoinGroupRequest)
    assert rejoin.member_id == member_id_after and owned_in(rejoin) == set()


def test_heartbeat_fenced_instance_id_is_terminal() -> None:
    s = Script(config(group_instance_id="host-1"))
    s.stable()
    s(Tick(), after=1.0)
    outputs = s(heartbeat(E.FENCED_INSTANCE_ID))
    assert events_of(outputs, PartitionsLost) and events_of(outputs, Fenced)
    assert s.state is S.FENCED


def test_stale_heartbeat_errors_are_ignored() -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)  # heartbeat for generation 1 in flight
    s(Leave())
    s(RevocationDone())
    assert s.state is S.LEAVING
    assert s(heartbeat(E.UNKNOWN_MEMBER_ID)) == []


def test_heartbeat_coordinator_error_rediscovers_and_keeps_the_assignment() -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)
    outputs = s(heartbeat(E.NOT_COORDINATOR))
    assert events_of(outputs, FindCoordinator) and s.state is S.STABLE
    assert s.machine.assignment == tp(TOPIC, 0, 1)
    s(coordinator_found())
    only_request(s(Tick(), after=0.1), HeartbeatRequest)


def test_session_expiry_loses_partitions_and_rejoins() -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)  # heartbeat sent, never answered
    assert s(Tick(), after=8.0) == []
    outputs = s(Tick(), after=1.0)  # 10 s without an answer
    assert events_of(outputs, PartitionsLost)[0].partitions == tp(TOPIC, 0, 1)
    assert events_of(outputs, FindCoordinator)
    assert s.state is S.JOINING and s.machine.assignment == frozenset()


def test_the_session_runs_from_when_the_heartbeat_was_sent() -> None:
    # A driver stalled between sending a heartbeat and reading its answer must
    # not count the stall as contact: the coordinator saw us last at the send.
    s = Script()
    s.stable()
    only_request(s(Tick(), after=1.0), HeartbeatRequest)
    s(heartbeat(), after=9.5)  # answered "ok", read 9.5 s after it was sent
    outputs = s(Tick(), after=0.5)  # 10 s (the session timeout) after the send
    assert events_of(outputs, PartitionsLost)[0].partitions == tp(TOPIC, 0, 1)
    assert s.state is S.JOINING


def test_request_failures_mark_the_coordinator_unknown() -> None:
    s = Script()
    s.stable()
    s(Tick(), after=1.0)
    outputs = s(RequestFailed(HeartbeatRequest.api_key, "timeout"))
    assert events_of(outputs, FindCoordinator) and s.state is S.STABLE
    with pytest.raises(InvalidTransition, match="no such request is in flight"):
        s(RequestFailed(HeartbeatRequest.api_key))


def test_join_answered_without_a_coordinator_after_a_subscription_change_revokes_first() -> None:
    """Cooperative: the JoinGroup is answered after a failed request made the coordinator
    unknown, and the subscription dropped a topic meanwhile. No SyncGroup can go, so the
    member rejoins, and first revokes the dropped topic's partitions.

    Before issue 15 this crashed the machine (its handler chose REVOKING, which the
    table did not allow for a JoinGroup answer).
    """
    s = Script()
    s.joining(topics=(TOPIC, "audit"))
    s(join_ok("member-1"))
    s(sync_ok(tp(TOPIC, 0) | tp("audit", 0)))
    s(Tick(), after=1.0)
    only_request(s(heartbeat(E.REBALANCE_IN_PROGRESS)), JoinGroupRequest)
    assert s(Subscribe(frozenset({TOPIC}))) == []  # the JoinGroup in flight has the old topics
    s(FetchCommitted(frozenset({Partition(TOPIC, 0)})))
    assert events_of(s(RequestFailed(OffsetFetchRequest.api_key, "timeout")), FindCoordinator)
    outputs = s(join_ok("member-1", generation=2))
    assert events_of(outputs, PartitionsRevoked) == [PartitionsRevoked(tp("audit", 0))]
    assert not requests_of(outputs, SyncGroupRequest)
    assert s.state is S.REVOKING and s.machine.assignment == tp(TOPIC, 0) | tp("audit", 0)
    s(coordinator_found())
    rejoin = only_request(s(RevocationDone()), JoinGroupRequest)
    assert decode_subscription(rejoin.protocols[0].metadata).topics == (TOPIC,)
    assert owned_in(rejoin) == {(TOPIC, 0)}


def test_coordinator_lost_during_sync_rejoins() -> None:
    s = Script()
    s.syncing()
    outputs = s(CoordinatorLost("connection reset"))
    assert events_of(outputs, FindCoordinator) and s.state is S.JOINING
    assert only_request(s(coordinator_found()), JoinGroupRequest).member_id == "member-1"


# -- subscriptions, leaving, static membership -------------------------------------------


def test_cooperative_subscription_change_revokes_only_dropped_topics() -> None:
    s = Script()
    s.joining(topics=(TOPIC, "audit"))
    s(join_ok("member-1"))
    s(sync_ok(tp(TOPIC, 0) | tp("audit", 0)))
    outputs = s(Subscribe(frozenset({TOPIC})))
    assert events_of(outputs, PartitionsRevoked) == [PartitionsRevoked(tp("audit", 0))]
    rejoin = only_request(s(RevocationDone()), JoinGroupRequest)
    assert decode_subscription(rejoin.protocols[0].metadata).topics == (TOPIC,)
    assert owned_in(rejoin) == {(TOPIC, 0)}


def test_subscription_change_mid_rebalance_rejoins_after_sync() -> None:
    s = Script()
    s.syncing()
    assert s(Subscribe(frozenset({TOPIC, "audit"}))) == []
    outputs = s(sync_ok(tp(TOPIC, 0)))
    assert events_of(outputs, PartitionsAssigned)
    join = only_request(outputs, JoinGroupRequest)
    assert decode_subscription(join.protocols[0].metadata).topics == ("audit", TOPIC)


def test_assignment_outside_the_subscription_is_not_applied() -> None:
    s = Script()
    s.syncing()
    outputs = s(sync_ok(tp("elsewhere", 0)))
    assert not events_of(outputs, PartitionsAssigned)
    only_request(outputs, JoinGroupRequest)


def test_dynamic_member_revokes_then_leaves() -> None:
    s = Script()
    s.stable()
    outputs = s(Leave())
    assert events_of(outputs, PartitionsRevoked) == [PartitionsRevoked(tp(TOPIC, 0, 1))]
    assert s.state is S.LEAVING and not requests_of(outputs, LeaveGroupRequest)
    leave = only_request(s(RevocationDone()), LeaveGroupRequest)
    assert leave.members[0].member_id == "member-1" and leave.members[0].group_instance_id is None
    assert events_of(s(LeaveGroupResponse(error_code=0)), Left) == [Left()]
    assert s.state is S.UNJOINED and s.machine.member_id == ""


def test_static_member_does_not_send_leave_group_unless_forced() -> None:
    s = Script(config(group_instance_id="host-1"))
    s.stable()
    s(Leave())
    outputs = s(RevocationDone())
    assert not requests_of(outputs, LeaveGroupRequest) and events_of(outputs, Left)
    assert s.state is S.UNJOINED

    forced = Script(config(group_instance_id="host-1"))
    forced.stable()
    forced(Leave(force=True))
    leave = only_request(forced(RevocationDone()), LeaveGroupRequest)
    assert leave.members[0].group_instance_id == "host-1"

    by_config = Script(config(group_instance_id="host-1", leave_on_close=True))
    by_config.stable()
    by_config(Leave())
    only_request(by_config(RevocationDone()), LeaveGroupRequest)


def test_static_identity_in_every_request_the_versions_allow() -> None:
    s = Script(config(group_instance_id="host-1"))
    s(Subscribe(frozenset({TOPIC})))
    join = only_request(s(coordinator_found()), JoinGroupRequest)
    assert join.group_instance_id == "host-1"
    sync = only_request(s(join_ok("member-1")), SyncGroupRequest)
    assert sync.group_instance_id == "host-1"
    s(sync_ok(tp(TOPIC, 0)))
    assert only_request(s(Tick(), after=1.0), HeartbeatRequest).group_instance_id == "host-1"

    old = CoordinatorVersions(join_group=5, sync_group=2, heartbeat=2, leave_group=2)
    s = Script(config(group_instance_id="host-1"))
    s(Subscribe(frozenset({TOPIC})))
    s(CoordinatorFound(1, "h", 1, old))
    sync = only_request(s(join_ok("member-1")), SyncGroupRequest)
    assert sync.group_instance_id is None  # SyncGroup v2 cannot carry it
    s(sync_ok(tp(TOPIC, 0)))
    assert only_request(s(Tick(), after=1.0), HeartbeatRequest).group_instance_id is None
    s(Leave(force=True))
    leave = only_request(s(RevocationDone()), LeaveGroupRequest)
    assert leave.member_id == "member-1" and leave.members == ()


def test_static_membership_needs_join_group_v5() -> None:
    s = Script(config(group_instance_id="host-1"))
    s(Subscribe(frozenset({TOPIC})))
    outputs = s(CoordinatorFound(1, "h", 1, CoordinatorVersions(join_group=4)))
    (fatal,) = events_of(outputs, Fatal)
    assert fatal.error_name == "UNSUPPORTED_VERSION" and "v5" in fatal.message


def test_invalid_inputs_raise() -> None:
    s = Script()
    with pytest.raises(InvalidTransition, match="RevocationDone is not valid in state UNJOINED"):
        s(RevocationDone())
    s.stable()
    with pytest.raises(InvalidTransition, match="no such request is in flight"):
        s(sync_ok())
    with pytest.raises(InvalidTransition):
        s(LeaveGroupResponse(error_code=0))
    assert s.state is S.STABLE, "a refused input changes nothing"


def _stable_leader(m: GroupMachine, at: float = 0) -> None:
    """``m`` leads a group of one on TOPIC (2 partitions) and is stable, from ``at``."""
    m.handle(Subscribe(frozenset({TOPIC})), 0)
    m.handle(MetadataUpdate({TOPIC: 2}), 0)
    m.handle(coordinator_found(), 0)
    member = JoinGroupResponseMember(member_id="member-1", metadata=subscription_bytes(TOPIC))
    sync = only_request(
        m.handle(join_ok("member-1", leader="member-1", members=(member,)), 0), SyncGroupRequest
    )
    m.handle(
        sync_ok(tp(TOPIC, 0, 1), decode_assignment(sync.assignments[0].assignment).user_data), at
    )


def test_leader_rejoins_when_partition_counts_change() -> None:
    m = GroupMachine(config())
    _stable_leader(m)
    assert m.handle(MetadataUpdate({TOPIC: 2, "other": 5}), 0) == []
    only_request(m.handle(MetadataUpdate({TOPIC: 3}), 0), JoinGroupRequest)


def test_a_stable_leader_looks_again_at_its_topics_every_metadata_refresh() -> None:
    m = GroupMachine(config(metadata_refresh_ms=60_000, session_timeout_ms=600_000))
    _stable_leader(m, at=10)
    assert events_of(m.handle(Tick(), 69), NeedMetadata) == []  # 59 s after the assignment
    assert events_of(m.handle(Tick(), 70), NeedMetadata) == [NeedMetadata(frozenset({TOPIC}))]
    assert events_of(m.handle(Tick(), 71), NeedMetadata) == []  # the next one at 130
    assert m.handle(MetadataUpdate({TOPIC: 2}), 71) == []  # unchanged: nothing
    assert events_of(m.handle(Tick(), 130), NeedMetadata) == [NeedMetadata(frozenset({TOPIC}))]
    # Partitions were added: the leader rejoins, and the next assignment covers them.
    only_request(m.handle(MetadataUpdate({TOPIC: 4}), 130), JoinGroupRequest)


def test_a_follower_never_asks_for_metadata_on_its_own() -> None:
    m = GroupMachine(config(metadata_refresh_ms=1_000, session_timeout_ms=600_000))
    m.handle(Subscribe(frozenset({TOPIC})), 0)
    m.handle(coordinator_found(), 0)
    m.handle(join_ok("member-2", leader="member-1"), 0)
    m.handle(sync_ok(tp(TOPIC, 0)), 0)
    assert m.state is S.STABLE
    assert events_of(m.handle(Tick(), 500), NeedMetadata) == []
