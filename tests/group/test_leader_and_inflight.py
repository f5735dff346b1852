"""The two pure parts of the machine on their own: the leader's assignment
(``leader.py``) and the matching of answers to requests in flight (``inflight.py``)."""

from __future__ import annotations

import pytest

from ingest.errors import LocalProtocolError, RemoteProtocolError
from ingest.group import (
    Commit,
    CooperativeStickyAssignor,
    MemberAssignment,
    MemberSubscription,
    RangeAssignor,
    RebalanceProtocol,
)
from ingest.group.classic.leader import (
    Assignments,
    Leadership,
    NeedsMetadata,
    assign_group,
    cooperative_violation,
    read_subscriptions,
)
from ingest.group.inflight import (
    COMMIT,
    GROUP_API_KEYS,
    HEARTBEAT,
    JOIN,
    SYNC,
    Epoch,
    InFlight,
    Sent,
)
from ingest.group.requests import topic_partitions
from ingest.protocol.consumer import (
    ConsumerProtocolSubscription,
    decode_assignment,
    encode_subscription,
)
from ingest.protocol.messages import JoinGroupResponse, JoinGroupResponseMember
from ingest.protocol.partition import Partition
from tests.group.support import TOPIC, tp


def member(member_id: str, *topics: str, instance: str | None = None) -> JoinGroupResponseMember:
    metadata = encode_subscription(ConsumerProtocolSubscription(topics=topics, generation_id=3))
    return JoinGroupResponseMember(
        member_id=member_id, group_instance_id=instance, metadata=metadata
    )


def leader_join(*members: JoinGroupResponseMember) -> JoinGroupResponse:
    return JoinGroupResponse(
        error_code=0,
        generation_id=4,
        protocol_type="consumer",
        protocol_name="range",
        leader="m-1",
        member_id="m-1",
        members=members,
    )


# -- leader.py ---------------------------------------------------------------------------


def test_subscriptions_are_read_with_their_instance_ids() -> None:
    read = read_subscriptions([member("m-1", TOPIC), member("m-2", TOPIC, "audit", instance="h")])
    assert read["m-1"] == MemberSubscription(topics=frozenset({TOPIC}), generation_id=3)
    assert read["m-2"].topics == {TOPIC, "audit"} and read["m-2"].group_instance_id == "h"


def test_an_unreadable_subscription_names_its_member() -> None:
    bad = JoinGroupResponseMember(member_id="m-9", metadata=b"\x00\x03\x00")
    with pytest.raises(RemoteProtocolError, match="member m-9 sent an unreadable subscription"):
        read_subscriptions([member("m-1", TOPIC), bad])


def test_the_leader_asks_for_missing_counts_then_assigns_every_member() -> None:
    join = leader_join(member("m-1", TOPIC), member("m-2", TOPIC, "audit"))
    needs = assign_group(
        join,
        RangeAssignor(),
        RebalanceProtocol.EAGER,
        {TOPIC: 2},
        generation_id=4,
        retained_user_data=None,
    )
    assert needs == NeedsMetadata(frozenset({"audit"}))
    done = assign_group(
        join,
        RangeAssignor(),
        RebalanceProtocol.EAGER,
        {TOPIC: 2, "audit": 1, "other": 5},
        generation_id=4,
        retained_user_data=None,
    )
    assert isinstance(done, Assignments)
    assert done.counts == {"audit": 1, TOPIC: 2}  # only the group's topics
    given = {
        m: {(t.topic, p) for t in decode_assignment(data).assigned_partitions for p in t.partitions}
        for m, data in done.encoded.items()
    }
    assert given == {"m-1": {(TOPIC, 0)}, "m-2": {(TOPIC, 1), ("audit", 0)}}


def _claiming(member_id: str, *indexes: int) -> JoinGroupResponseMember:
    """A member whose subscription claims ``indexes`` of TOPIC as its own."""
    subscription = ConsumerProtocolSubscription(
        topics=(TOPIC,),
        owned_partitions=topic_partitions(Partition(TOPIC, i) for i in indexes),
        generation_id=3,
    )
    return JoinGroupResponseMember(member_id=member_id, metadata=encode_subscription(subscription))


def test_the_cooperative_rule_is_checked_and_blamed_on_our_assignor() -> None:
    owned = {
        "m-1": MemberSubscription(topics=frozenset({TOPIC})),
        "m-2": MemberSubscription(topics=frozenset({TOPIC}), owned_partitions=tp(TOPIC, 0)),
    }
    moved = {"m-1": MemberAssignment(partitions=tp(TOPIC, 0)), "m-2": MemberAssignment()}
    assert cooperative_violation(owned, moved) == (
        "orders-0 moves from m-2 to m-1 without being revoked first"
    )
    kept = {"m-1": MemberAssignment(), "m-2": MemberAssignment(partitions=tp(TOPIC, 0))}
    assert cooperative_violation(owned, kept) == ""

    class Mover(CooperativeStickyAssignor):
        def assign(self, members, partitions_per_topic, **_):  # type: ignore[no-untyped-def]
            return moved

    join = leader_join(member("m-1", TOPIC), _claiming("m-2", 0))
    with pytest.raises(LocalProtocolError, match="assignor cooperative-sticky: orders-0 moves"):
        assign_group(
            join,
            Mover(),
            RebalanceProtocol.COOPERATIVE,
            {TOPIC: 1},
            generation_id=4,
            retained_user_data=None,
        )
    # An eager rebalance revokes everything first: nothing to check.
    eager = assign_group(
        join, Mover(), RebalanceProtocol.EAGER, {TOPIC: 1}, generation_id=4, retained_user_data=None
    )
    assert isinstance(eager, Assignments) and set(eager.encoded) == {"m-1", "m-2"}


def test_leadership_keeps_the_sticky_user_data_per_assignor() -> None:
    lead = Leadership()
    assert lead.retained_for("cooperative-sticky") is None
    lead.retain(b"snapshot", "cooperative-sticky")
    assert lead.retained_for("cooperative-sticky") == b"snapshot"
    assert lead.retained_for("range") is None  # another assignor's bytes are not ours to read
    assert lead.changed_counts() == []  # never assigned
    lead.assigned_counts = {TOPIC: 2, "audit": 1}
    lead.metadata.update({TOPIC: 2})
    assert lead.changed_counts() == []  # unknown counts have not changed
    lead.metadata.update({TOPIC: 3, "audit": 1})
    assert lead.changed_counts() == [TOPIC]


# -- inflight.py -------------------------------------------------------------------------


def test_answers_match_the_oldest_request_of_their_api() -> None:
    flight = InFlight()
    first = Sent(COMMIT, Epoch(1, 1, "m"), commit=Commit({Partition(TOPIC, 0): 1}))
    second = Sent(COMMIT, Epoch(1, 1, "m"), commit=Commit({Partition(TOPIC, 0): 2}))
    beat = Sent(HEARTBEAT, Epoch(1, 1, "m"), sent_at=5.0)
    for sent in (first, beat, second):
        flight.add(sent)
    assert (flight.count(COMMIT), flight.count(HEARTBEAT), flight.count(3)) == (2, 1, 0)
    assert flight.take(COMMIT) is first and flight.take(COMMIT) is second
    assert flight.take(COMMIT) is None and flight.take(3) is None
    assert flight.take(HEARTBEAT) is beat


def test_a_lost_connection_fails_requests_api_by_api_as_asked() -> None:
    flight = InFlight()
    sync, join = Sent(SYNC, Epoch(2, 1, "m")), Sent(JOIN, Epoch(1, -1, ""))
    flight.add(sync)
    flight.add(join)
    drained = flight.drain()
    assert next(drained) is join  # GROUP_API_KEYS order: JoinGroup first
    assert flight.count(JOIN) == 0 and flight.count(SYNC) == 1  # lazily: one at a time
    assert list(drained) == [sync]
    assert all(flight.count(k) == 0 for k in GROUP_API_KEYS)


def test_the_one_stale_check() -> None:
    sent = Sent(HEARTBEAT, Epoch(round=3, generation_id=7, member_id="m"))
    assert sent.same_round(Epoch(3, 8, "other")) and not sent.same_round(Epoch(4, 7, "m"))
    assert sent.same_generation(Epoch(9, 7, "m"))
    assert not sent.same_generation(Epoch(3, 8, "m"))
    assert not sent.same_generation(Epoch(3, 7, "n"))
