"""The consumer-protocol member (KIP-848), outcome by outcome: joining, heartbeat fields,
incremental reconciliation, topic ids, fencing, leaving (static and dynamic), regex
subscriptions, commits with the member epoch, and each heartbeat error as Kafka's
consumer handles it."""

from __future__ import annotations

import pytest

from ingest.errors import ConfigError, GroupError
from ingest.group import (
    Commit,
    CommitFailed,
    CoordinatorLost,
    Fatal,
    Fenced,
    FindCoordinator,
    Leave,
    Left,
    OffsetsCommitted,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RequestFailed,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import (
    GroupWarning,
    NeedTopicNames,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_machine import ConsumerMachine
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    OffsetCommitRequest,
    TopicPartitions,
)
from ingest.protocol.partition import Partition
from tests.group.consumer_support import (
    IDS,
    MEMBER_ID,
    TOPIC,
    E,
    Member,
    S,
    config,
    coordinator,
    error,
    heartbeats,
    names,
    ok,
    only_heartbeat,
    tp,
)
from tests.group.support import commit_response, events_of, requests_of

HEARTBEAT = ConsumerGroupHeartbeatRequest.api_key


# -- joining and heartbeat fields ------------------------------------------------------


def test_joins_at_epoch_0_with_every_field_and_its_own_member_id() -> None:
    m = Member(config(group_instance_id="host-1", rack_id="r1", server_assignor="range"))
    m(Subscribe(frozenset({"orders", "audit"})))
    assert m.state is S.JOINING
    found = m(coordinator())
    join = only_heartbeat(found)
    assert join == ConsumerGroupHeartbeatRequest(
        group_id="g",
        member_id=MEMBER_ID,
        member_epoch=0,
        instance_id="host-1",
        rack_id="r1",
        rebalance_timeout_ms=300_000,
        subscribed_topic_names=("audit", "orders"),
        server_assignor="range",
        topic_partitions=(),  # the coordinator requires an empty list when (re)joining
    )


def test_later_heartbeats_carry_only_what_changed_at_the_coordinators_interval() -> None:
    m = Member(config(rack_id="r1", server_assignor="uniform"))
    m.joining()
    m(names("orders"))
    ack = only_heartbeat(m(ok(1, {TOPIC: (0,)}, interval_ms=2_500)))  # acknowledged at once
    assert ack.topic_partitions == (TopicPartitions(topic_id=IDS[TOPIC], partitions=(0,)),)
    assert ack.subscribed_topic_names is None and ack.rebalance_timeout_ms == -1
    assert ack.rack_id is None and ack.server_assignor is None
    m(ok(1))
    assert heartbeats(m(Tick(), after=2.4)) == []  # the coordinator's 2.5 s, not our 1 s
    plain = only_heartbeat(m(Tick(), after=0.1))
    assert plain == ConsumerGroupHeartbeatRequest(group_id="g", member_id=MEMBER_ID, member_epoch=1)
    m(ok(1))
    changed = only_heartbeat(m(Subscribe(frozenset({TOPIC, "audit"}))))  # out at once
    assert changed.subscribed_topic_names == ("audit", TOPIC)
    assert changed.topic_partitions is None


def test_after_an_error_the_next_heartbeat_carries_every_field() -> None:
    m = Member(config(server_assignor="uniform"))
    m.stable()
    m.heartbeat(error(E.COORDINATOR_LOAD_IN_PROGRESS))
    assert heartbeats(m(Tick(), after=0.05)) == []  # backs off retry_backoff_ms
    again = only_heartbeat(m(Tick(), after=0.05))
    assert again.member_epoch == 1
    assert again.rebalance_timeout_ms == 300_000 and again.server_assignor == "uniform"
    assert again.subscribed_topic_names == (TOPIC,)
    assert again.topic_partitions == (TopicPartitions(topic_id=IDS[TOPIC], partitions=(0, 1)),)


def test_member_id_must_come_from_the_driver() -> None:
    with pytest.raises(ConfigError, match="member_id"):
        ConsumerMachine(config(), member_id="")
    with pytest.raises(ConfigError, match="server_assignor"):
        ConsumerGroupConfig(group_id="g", server_assignor="sticky")


# -- incremental reconciliation ----------------------------------------------------------


def test_reconciliation_revokes_first_then_adds_and_leaves_kept_partitions_alone() -> None:
    """3 kept, 1 revoked, 2 added: one revocation of the 1, one assignment naming the 2."""
    m = Member()
    m.stable({TOPIC: (0, 1, 2, 3)})
    events: list[object] = []
    events += m.heartbeat(ok(2, {TOPIC: (0, 1, 2), "audit": (0, 1)}))
    assert m.state is S.REVOKING
    assert m.machine.assignment == tp(TOPIC, 0, 1, 2, 3)  # orders-3 committable until acked
    # While the driver stops orders-3, heartbeats still report it as owned.
    during = only_heartbeat(m(Tick(), after=1.0))
    assert during.topic_partitions is None  # unchanged since the last one sent
    m(ok(2))
    done = m(RevocationDone())
    events += done
    assert m.state is S.STABLE
    revoked = events_of(events, PartitionsRevoked)
    assigned = events_of(events, PartitionsAssigned)
    assert [e.partitions for e in revoked] == [tp(TOPIC, 3)]
    assert [e.added for e in assigned] == [tp("audit", 0, 1)]
    assert assigned[0].assignment == tp(TOPIC, 0, 1, 2) | tp("audit", 0, 1)
    assert assigned[0].generation_id == 2  # the member epoch
    assert events_of(events, PartitionsLost) == []
    # The acknowledgement goes at once: orders-3 gone, audit-0/1 owned.
    ack = only_heartbeat(done)
    assert sorted((t.topic_id, t.partitions) for t in ack.topic_partitions or ()) == sorted(
        [(IDS[TOPIC], (0, 1, 2)), (IDS["audit"], (0, 1))]
    )


def test_a_target_that_only_adds_is_applied_at_once() -> None:
    m = Member()
    m.stable()
    out = m.heartbeat(ok(2, {TOPIC: (0, 1, 2)}))
    assert m.state is S.STABLE
    assert [e.added for e in events_of(out, PartitionsAssigned)] == [tp(TOPIC, 2)]
    assert events_of(out, PartitionsRevoked) == []
    assert only_heartbeat(out).topic_partitions == (
        TopicPartitions(topic_id=IDS[TOPIC], partitions=(0, 1, 2)),
    )


def test_a_newer_target_while_revoking_is_reconciled_once_the_revocation_is_done() -> None:
    m = Member()
    m.revoking()  # orders-1 being revoked, target orders-0
    m.heartbeat(ok(3, {"audit": (5,)}))  # now orders-0 must go too
    assert m.state is S.REVOKING
    out = m(RevocationDone())
    assert [e.partitions for e in events_of(out, PartitionsRevoked)] == [tp(TOPIC, 0)]
    out = m(RevocationDone())
    assert m.state is S.STABLE and m.machine.assignment == tp("audit", 5)
    assert [e.added for e in events_of(out, PartitionsAssigned)] == [tp("audit", 5)]


def test_unknown_topic_ids_are_asked_for_and_the_rest_is_owned_meanwhile() -> None:
    m = Member()
    out = m.reconciling()
    assert events_of(out, NeedTopicNames) == [NeedTopicNames(frozenset({IDS["mystery"]}))]
    assert events_of(out, PartitionsAssigned) == []  # orders-0/1 kept, nothing added yet
    assert m.machine.assignment == tp(TOPIC, 0, 1)
    # An answer that does not name it: still reconciling, not asked again.
    assert m(TopicNames({IDS["mystery"]: None})) == []
    assert m.state is S.RECONCILING
    out = m(names("mystery"))
    assert m.state is S.STABLE
    assert [e.added for e in events_of(out, PartitionsAssigned)] == [tp("mystery", 0)]


# -- losing the partitions -------------------------------------------------------------


@pytest.mark.parametrize("code", [E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID])
def test_a_fenced_member_loses_its_partitions_and_rejoins_at_epoch_0(code: int) -> None:
    m = Member(config(server_assignor="range"))
    m.stable()
    out = m.heartbeat(error(code))
    assert m.state is S.JOINING
    lost = events_of(out, PartitionsLost)
    assert [e.partitions for e in lost] == [tp(TOPIC, 0, 1)]
    assert events_of(out, PartitionsRevoked) == []
    rejoin = only_heartbeat(out)  # at once, no backoff
    assert rejoin.member_epoch == 0 and rejoin.member_id == MEMBER_ID
    assert rejoin.topic_partitions == () and rejoin.server_assignor == "range"
    assert m.machine.assignment == frozenset()


def test_fenced_while_revoking_rejoins_once_the_revocation_is_acknowledged() -> None:
    m = Member()
    m.revoking()
    out = m.heartbeat(error(E.FENCED_MEMBER_EPOCH))
    assert m.state is S.REVOKING
    assert [e.partitions for e in events_of(out, PartitionsLost)] == [tp(TOPIC, 0, 1)]
    assert heartbeats(m(Tick(), after=5.0)) == []  # no epoch: no heartbeat
    out = m(RevocationDone())
    assert m.state is S.JOINING and only_heartbeat(out).member_epoch == 0


def test_no_heartbeat_answer_within_the_session_loses_the_partitions() -> None:
    m = Member()
    m.stable()
    m(Tick(), after=1.0)  # a heartbeat goes and is never answered
    out = m(Tick(), after=9.5)
    assert m.state is S.JOINING
    assert [e.partitions for e in events_of(out, PartitionsLost)] == [tp(TOPIC, 0, 1)]
    assert any(isinstance(o, FindCoordinator) for o in out)


def test_the_members_session_is_never_shorter_than_two_coordinator_intervals() -> None:
    """A 2 s session against the broker's default 5 s heartbeat interval: the member keeps
    its partitions between answered heartbeats, and loses them only after two intervals
    without an answer."""
    m = Member(config(session_timeout_ms=2_000))
    m.joining()
    m(ok(1, {TOPIC: (0, 1)}, interval_ms=5_000))
    m(ok(1, interval_ms=5_000))
    for _ in range(3):  # answered heartbeats, 5 s apart
        assert not events_of(m(Tick(), after=4.9), PartitionsLost)
        only_heartbeat(m(Tick(), after=0.1))
        assert not events_of(m(ok(1, interval_ms=5_000)), PartitionsLost)
    assert m.state is S.STABLE
    m(Tick(), after=5.0)  # a heartbeat goes and is never answered
    assert not events_of(m(Tick(), after=4.9), PartitionsLost)
    out = m(Tick(), after=0.2)  # 10.1 s after the last answered one was sent
    assert [e.partitions for e in events_of(out, PartitionsLost)] == [tp(TOPIC, 0, 1)]


# -- leaving ---------------------------------------------------------------------------


def _leave(m: Member, leave: Leave | None = None) -> ConsumerGroupHeartbeatRequest:
    out = m(leave or Leave())
    assert m.state is S.LEAVING
    assert [e.partitions for e in events_of(out, PartitionsRevoked)] == [tp(TOPIC, 0, 1)]
    assert m.machine.assignment == tp(TOPIC, 0, 1)  # committable until RevocationDone
    return only_heartbeat(m(RevocationDone()))


def test_a_dynamic_member_leaves_with_epoch_minus_1() -> None:
    m = Member()
    m.stable()
    leave = _leave(m)
    assert (leave.member_epoch, leave.instance_id) == (-1, None)
    assert m(ok(-1)) == [Left()]
    assert m.state is S.UNJOINED and m.machine.assignment == frozenset()


def test_a_static_member_leaves_with_epoch_minus_2_to_keep_its_assignment() -> None:
    m = Member(config(group_instance_id="host-1"))
    m.stable()
    leave = _leave(m)
    assert (leave.member_epoch, leave.instance_id) == (-2, "host-1")
    assert m(ok(-2)) == [Left()]


def test_a_static_member_leaves_for_good_when_forced() -> None:
    m = Member(config(group_instance_id="host-1"))
    m.stable()
    assert _leave(m, Leave(force=True)).member_epoch == -1


def test_a_session_can_end_without_leaving() -> None:
    m = Member(config(group_instance_id="host-1", leave_on_close=False))
    m.stable()
    m(Leave())
    out = m(RevocationDone())
    assert heartbeats(out) == [] and out == [Left()]  # the coordinator expires the session
    assert m.state is S.UNJOINED


def test_the_leaving_heartbeat_may_fail_and_older_answers_are_stale() -> None:
    m = Member()
    m.stable()
    m(Tick(), after=1.0)  # a heartbeat in flight
    m(Leave())
    only_heartbeat(m(RevocationDone()))  # the leaving one goes beside it
    assert m(ok(1, {TOPIC: (0, 1, 2)})) == []  # the older answer: stale
    assert m(RequestFailed(HEARTBEAT, "timeout")) == [Left(error_name="REQUEST_FAILED")]


def test_leaving_while_fenced_during_the_revocation_sends_nothing() -> None:
    m = Member()
    m.stable()
    m(Leave())
    m(Tick(), after=1.0)  # still heartbeating while the driver revokes
    m(error(E.UNKNOWN_MEMBER_ID))
    assert m(RevocationDone()) == [Left()]


# -- regex subscriptions -----------------------------------------------------------------


def test_a_regex_subscription_goes_in_v1() -> None:
    m = Member()
    m(SubscribeRegex("^orders-.*"))
    join = only_heartbeat(m(coordinator(heartbeat=1)))
    assert join.subscribed_topic_regex == "^orders-.*"
    assert join.subscribed_topic_names is None
    m(TopicNames({IDS[TOPIC]: TOPIC}))
    m(ok(1, {TOPIC: (0,)}))
    m(ok(1))
    back = only_heartbeat(m(Subscribe(frozenset({TOPIC}))))  # the regex is cleared with ""
    assert back.subscribed_topic_regex == "" and back.subscribed_topic_names == (TOPIC,)


def test_a_regex_subscription_is_refused_by_a_v0_coordinator() -> None:
    m = Member()
    m(SubscribeRegex("^orders-.*"))
    out = m(coordinator(heartbeat=0))
    assert m.state is S.FAILED and heartbeats(out) == []
    (fatal,) = events_of(out, Fatal)
    assert fatal.error_name == "UNSUPPORTED_VERSION"
    assert "needs ConsumerGroupHeartbeat v1" in fatal.message
    assert isinstance(fatal.exception(), GroupError)
    # And when the v0 coordinator is already known:
    m = Member()
    m.joining(heartbeat=0)
    out = m(SubscribeRegex("^x"))
    assert m.state is S.FAILED and events_of(out, Fatal)[0].error_name == "UNSUPPORTED_VERSION"


# -- coordinators and versions -----------------------------------------------------------


def test_a_coordinator_without_the_consumer_protocol_is_fatal() -> None:
    m = Member()
    m(Subscribe(frozenset({TOPIC})))
    (fatal,) = events_of(m(coordinator(heartbeat=None)), Fatal)
    assert m.state is S.FAILED and "use the classic protocol" in fatal.message
    m = Member()
    m(Subscribe(frozenset({TOPIC})))
    (fatal,) = events_of(m(coordinator(offset_commit=8)), Fatal)
    assert "OffsetCommit v9" in fatal.message


@pytest.mark.parametrize("code", [E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE])
def test_a_moved_coordinator_is_looked_up_and_heartbeated_at_once(code: int) -> None:
    m = Member()
    m.stable()
    out = m.heartbeat(error(code))
    assert m.state is S.STABLE and m.machine.assignment == tp(TOPIC, 0, 1)
    assert [type(o) for o in out] == [FindCoordinator]
    assert only_heartbeat(m(coordinator())).topic_partitions is not None  # every field


@pytest.mark.parametrize(
    "code",
    [
        E.UNRELEASED_INSTANCE_ID,
        E.GROUP_MAX_SIZE_REACHED,
        E.UNSUPPORTED_ASSIGNOR,
        E.INVALID_REQUEST,
        E.GROUP_AUTHORIZATION_FAILED,
        E.UNSUPPORTED_VERSION,
        E.INVALID_REGULAR_EXPRESSION,
        E.GROUP_ID_NOT_FOUND,
    ],
)
def test_fatal_heartbeat_errors(code: int) -> None:
    m = Member()
    m.stable()
    out = m.heartbeat(error(code, "the coordinator's words"))
    assert m.state is S.FAILED
    (fatal,) = events_of(out, Fatal)
    assert fatal.error_code == code
    assert [e.partitions for e in events_of(out, PartitionsLost)] == [tp(TOPIC, 0, 1)]
    assert heartbeats(m(Tick(), after=10.0)) == []


def test_fenced_instance_id_is_terminal() -> None:
    m = Member(config(group_instance_id="host-1"))
    m.stable()
    out = m.heartbeat(error(E.FENCED_INSTANCE_ID))
    assert m.state is S.FENCED and len(events_of(out, Fenced)) == 1


def test_retriable_errors_back_off_and_topic_authorization_is_a_warning() -> None:
    m = Member()
    m.stable()
    for code in (E.COORDINATOR_LOAD_IN_PROGRESS, E.REQUEST_TIMED_OUT):
        assert m.heartbeat(error(code)) == []
        assert m.state is S.STABLE
    out = m.heartbeat(error(E.TOPIC_AUTHORIZATION_FAILED, "no READ on audit"))
    assert out == [GroupWarning(E.TOPIC_AUTHORIZATION_FAILED, "TOPIC_AUTHORIZATION_FAILED",
                                "ConsumerGroupHeartbeat: no READ on audit")]  # fmt: skip
    assert m.state is S.STABLE and m.machine.assignment == tp(TOPIC, 0, 1)


def test_a_lost_connection_fails_what_was_in_flight() -> None:
    m = Member()
    m.stable()
    m(Tick(), after=1.0)
    m(Commit({Partition(TOPIC, 0): 7}))
    out = m(CoordinatorLost("reset"))
    assert [type(o) for o in out] == [CommitFailed, FindCoordinator]
    assert m.state is S.STABLE and m.machine.inflight(HEARTBEAT) == 0


# -- commits ---------------------------------------------------------------------------


def test_commits_carry_the_member_epoch_at_offset_commit_v9() -> None:
    m = Member(config(group_instance_id="host-1"))
    m.stable()
    m.heartbeat(ok(4))
    out = m(Commit({Partition(TOPIC, 1): 42}, "delta-7"))
    (request,) = requests_of(out, OffsetCommitRequest)
    assert (request.generation_id_or_member_epoch, request.member_id) == (4, MEMBER_ID)
    assert request.group_instance_id == "host-1"
    assert [o.version for o in out if isinstance(o, SendRequest)] == [9]
    (done,) = events_of(m(commit_response(request)), OffsetsCommitted)
    assert done.offsets == {Partition(TOPIC, 1): 42}


def test_a_commit_made_before_the_membership_began_is_refused_unsent() -> None:
    """The caller's books of an earlier membership (held while its member was fenced and
    joined again, host-cut-consumer) must not pass the coordinator's epoch check in the
    new one; within one membership the epoch moves on with the group's assignments, and a
    commit made at an earlier epoch of it still goes."""
    m = Member()
    m.stable()  # epoch 1
    m.heartbeat(ok(3))  # the group's epoch moved on: the same membership
    (request,) = requests_of(m(Commit({Partition(TOPIC, 1): 5}, generation=1)), OffsetCommitRequest)
    assert request.generation_id_or_member_epoch == 3
    m(commit_response(request))
    m.heartbeat(error(E.FENCED_MEMBER_EPOCH))  # fenced: lost, and joining at epoch 0
    out = m(ok(6, {TOPIC: (0, 1)}))  # the new membership, the same partitions back
    assert [e.generation_id for e in events_of(out, PartitionsAssigned)] == [6]
    (refused,) = events_of(m(Commit({Partition(TOPIC, 1): 2}, generation=3)), CommitFailed)
    assert refused.error_name == "FENCED_MEMBER_EPOCH" and refused.error_code is None
    assert "epoch 3" in refused.message and "(epoch 6)" in refused.message
    assert not requests_of(m(Tick()), OffsetCommitRequest)
    (request,) = requests_of(m(Commit({Partition(TOPIC, 1): 7}, generation=6)), OffsetCommitRequest)
    assert request.generation_id_or_member_epoch == 6


def test_commits_are_refused_for_partitions_not_owned_and_allowed_while_revoking() -> None:
    m = Member()
    m.revoking()  # orders-1 being revoked
    (refused,) = m(Commit({Partition(TOPIC, 7): 1}))
    assert isinstance(refused, CommitFailed) and refused.error_name == "NOT_ASSIGNED"
    (request,) = requests_of(m(Commit({Partition(TOPIC, 1): 3})), OffsetCommitRequest)
    (stale,) = m(commit_response(request, E.STALE_MEMBER_EPOCH))
    assert isinstance(stale, CommitFailed) and stale.error_name == "STALE_MEMBER_EPOCH"
    assert m.state is S.REVOKING  # the heartbeat, not the commit, decides the membership


def test_a_topic_id_keeps_the_first_name_it_was_given() -> None:
    """Found by Hypothesis: a second name for a known id must not orphan owned partitions."""
    m = Member()
    m.reconciling()
    out = m(TopicNames({IDS[TOPIC]: "audit"}))
    assert m.state is S.RECONCILING and out == []
    assert m.machine.assignment == tp(TOPIC, 0, 1)
    ack = only_heartbeat(m(names("mystery")))  # reconciled: acknowledged at once
    assert {t.topic_id for t in ack.topic_partitions or ()} == {IDS[TOPIC], IDS["mystery"]}


def test_a_regex_is_cleared_only_where_the_version_has_the_field() -> None:
    """Found by Hypothesis: back to names, then a v0 coordinator: no empty regex at v0."""
    m = Member()
    m(SubscribeRegex("^orders$"))
    m(names(TOPIC))
    m(coordinator(heartbeat=1))
    m(ok(1, {TOPIC: (0,)}))  # the acknowledgement is in flight
    assert heartbeats(m(Subscribe(frozenset({TOPIC})))) == []  # waits for it
    m(coordinator(heartbeat=0))  # the driver now speaks v0 with the coordinator
    again = only_heartbeat(m(ok(1)))  # encodes at v0 (Member checks every request)
    assert again.subscribed_topic_regex is None and again.subscribed_topic_names == (TOPIC,)
