"""Who broke the group protocol: the other side (the coordinator's answer, another
member's bytes) is a RemoteProtocolError, this process (its driver, its own
assignor) a LocalProtocolError. The machine reports the first kind, and the
assignor's, as Fatal; the driver's misuse is raised at once."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from ingest.errors import (
    GroupError,
    GroupProtocolError,
    LocalProtocolError,
    RemoteProtocolError,
)
from ingest.group import (
    CooperativeStickyAssignor,
    Fatal,
    InvalidTransition,
    MemberAssignment,
    MemberState,
    MemberSubscription,
    MetadataUpdate,
    PartitionsLost,
    RevocationDone,
    SendRequest,
    Tick,
)
from ingest.protocol.consumer import ConsumerProtocolSubscription, encode_subscription
from ingest.protocol.messages import JoinGroupRequest, JoinGroupResponseMember, SyncGroupResponse
from ingest.protocol.partition import Partition
from tests.group.support import (
    COOPERATIVE,
    TOPIC,
    E,
    Script,
    config,
    events_of,
    heartbeat,
    join_ok,
    only_request,
    sync_ok,
    tp,
)

S = MemberState


def subscription(*topics: str, owned: tuple[int, ...] = ()) -> bytes:
    from ingest.group.requests import topic_partitions

    return encode_subscription(
        ConsumerProtocolSubscription(
            topics=topics,
            owned_partitions=topic_partitions(Partition(TOPIC, i) for i in owned),
            generation_id=1,
        )
    )


def only_fatal(outputs: list[object]) -> Fatal:
    (fatal,) = events_of(outputs, Fatal)  # type: ignore[arg-type]
    assert not any(isinstance(o, SendRequest) for o in outputs)
    return fatal  # type: ignore[no-any-return]


def test_a_members_unreadable_subscription_is_the_remote_sides_fault() -> None:
    s = Script()
    s.joining()
    s(MetadataUpdate({TOPIC: 2}))
    members = (
        JoinGroupResponseMember(member_id="member-1", metadata=subscription(TOPIC)),
        JoinGroupResponseMember(member_id="member-2", metadata=b"\x00"),
    )
    fatal = only_fatal(s(join_ok("member-1", leader="member-1", members=members)))
    assert s.state is S.FAILED
    assert (fatal.error_code, fatal.error_name) == (None, "REMOTE_PROTOCOL_ERROR")
    assert "member member-2 sent an unreadable subscription" in fatal.message
    assert "ConsumerProtocolSubscription.version" in fatal.message  # the decoder's field
    error = fatal.exception()
    assert isinstance(error, RemoteProtocolError) and error.remote
    assert str(error) == fatal.message


def test_an_unreadable_assignment_is_the_remote_sides_fault() -> None:
    s = Script()
    s.syncing()
    outputs = s(
        SyncGroupResponse(
            error_code=0, protocol_type="consumer", protocol_name=COOPERATIVE, assignment=b"\x00"
        )
    )
    fatal = only_fatal(outputs)
    assert (fatal.error_code, fatal.error_name) == (None, "REMOTE_PROTOCOL_ERROR")
    assert "the leader's SyncGroup assignment is unreadable" in fatal.message
    assert isinstance(fatal.exception(), RemoteProtocolError)
    assert s.state is S.FAILED and s.machine.assignment == frozenset()


class _Mover(CooperativeStickyAssignor):
    """A broken cooperative assignor: gives every partition to the first member, at once."""

    @property
    def name(self) -> str:
        return "mover"

    def assign(
        self,
        members: Mapping[str, MemberSubscription],
        partitions_per_topic: Mapping[str, int],
        *,
        generation_id: int = -1,
        retained_user_data: bytes | None = None,
    ) -> dict[str, MemberAssignment]:
        first = sorted(members)[0]
        everything = frozenset(
            Partition(t, i) for t, n in partitions_per_topic.items() for i in range(n)
        )
        return {
            m: MemberAssignment(partitions=everything if m == first else frozenset())
            for m in members
        }


def test_our_own_assignor_breaking_the_cooperative_rule_is_a_local_fault() -> None:
    s = Script(config(assignors=(_Mover(),)))
    s.joining()
    s(MetadataUpdate({TOPIC: 2}))
    members = (
        JoinGroupResponseMember(member_id="member-1", metadata=subscription(TOPIC)),
        JoinGroupResponseMember(member_id="member-2", metadata=subscription(TOPIC, owned=(0,))),
    )
    outputs = s(join_ok("member-1", leader="member-1", members=members, protocol="mover"))
    fatal = only_fatal(outputs)
    assert (fatal.error_code, fatal.error_name) == (None, "LOCAL_PROTOCOL_ERROR")
    assert fatal.message == (
        "assignor mover: orders-0 moves from member-2 to member-1 without being revoked first"
    )
    error = fatal.exception()
    assert isinstance(error, LocalProtocolError) and not error.remote
    assert s.state is S.FAILED


def test_a_coordinator_error_code_is_no_protocol_error() -> None:
    s = Script()
    s.syncing()
    fatal = only_fatal(
        s(SyncGroupResponse(error_code=E.GROUP_AUTHORIZATION_FAILED, assignment=b""))
    )
    error = fatal.exception()
    assert type(error) is GroupError and not isinstance(error, GroupProtocolError)
    assert str(error).startswith("GROUP_AUTHORIZATION_FAILED: SyncGroup failed")


def test_misusing_the_machine_is_a_local_error_raised_at_once() -> None:
    s = Script()
    with pytest.raises(LocalProtocolError) as raised:
        s(RevocationDone())
    assert isinstance(raised.value, InvalidTransition) and isinstance(raised.value, GroupError)
    assert not raised.value.remote
    assert "RevocationDone is not valid in state UNJOINED" in str(raised.value)
    s.stable()
    with pytest.raises(InvalidTransition, match="no such request is in flight"):
        s(sync_ok())


def test_partitions_lost_to_a_protocol_error_say_why() -> None:
    s = Script()
    s.stable(tp(TOPIC, 0))
    # Cooperative: the member keeps orders-0 while it rejoins, then the new
    # generation's assignment cannot be read.
    s(Tick(), after=1.0)
    only_request(s(heartbeat(E.REBALANCE_IN_PROGRESS)), JoinGroupRequest)
    s(join_ok("member-1", generation=2))
    outputs = s(
        SyncGroupResponse(
            error_code=0, protocol_type="consumer", protocol_name=COOPERATIVE, assignment=b"\x00"
        )
    )
    (lost,) = events_of(outputs, PartitionsLost)
    assert lost.partitions == tp(TOPIC, 0)
    assert lost.reason == only_fatal(outputs).message
