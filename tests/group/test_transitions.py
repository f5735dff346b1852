"""Every (state, input) pair: the table names it and the machine stays well-formed,
or the machine raises InvalidTransition and changes nothing. Never anything else."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.group import (
    INPUT_TYPES,
    OUTPUT_TYPES,
    TRANSITIONS,
    Commit,
    CooperativeStickyAssignor,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    CoordinatorVersions,
    FetchCommitted,
    FindCoordinator,
    InvalidTransition,
    Leave,
    MemberState,
    MetadataUpdate,
    PartitionsAssigned,
    RangeAssignor,
    RequestFailed,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.protocol.consumer import ConsumerProtocolSubscription, encode_subscription
from ingest.protocol.messages import (
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
    OffsetFetchResponsePartition,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
    SyncGroupRequest,
    SyncGroupResponse,
)
from ingest.protocol.partition import Partition
from tests.group.support import (
    TOPIC,
    E,
    Script,
    assert_encodable,
    assignment_bytes,
    config,
    coordinator_found,
    heartbeat,
    join_error,
    join_ok,
    sync_ok,
    tp,
)

S = MemberState
GROUP_APIS = [
    JoinGroupRequest.api_key,
    SyncGroupRequest.api_key,
    HeartbeatRequest.api_key,
    LeaveGroupRequest.api_key,
    OffsetCommitRequest.api_key,
    OffsetFetchRequest.api_key,
]

# -- starting points: every state, with and without requests in flight -----------------


def _leader(s: Script) -> None:
    s.joining()
    member = JoinGroupResponseMember(member_id="member-1", metadata=_subscription((TOPIC,)))
    s(join_ok("member-1", leader="member-1", members=(member,)))


def _stable_busy(s: Script) -> None:
    s.stable()
    s(Tick(), after=1.0)
    s(Commit({Partition(TOPIC, 0): 5}, "v1"))
    s(FetchCommitted(frozenset({Partition(TOPIC, 1)})))


def _leaving_revoking(s: Script) -> None:
    s.stable()
    s(Leave())


def _leaving_sent(s: Script) -> None:
    s.stable()
    s(Leave())
    s(RevocationDone())


def _eager(s: Script) -> None:
    s.machine = type(s.machine)(config(assignors=(CooperativeStickyAssignor(), RangeAssignor())))
    s.stable()


def _eager_revoking(s: Script) -> None:
    _eager(s)
    s(Tick(), after=1.0)
    s(heartbeat(E.REBALANCE_IN_PROGRESS))


def _static_stable(s: Script) -> None:
    s.machine = type(s.machine)(config(group_instance_id="host-1"))
    s.stable()


SCENARIOS: dict[str, Callable[[Script], object]] = {
    "unjoined": lambda s: None,
    "unjoined-known-coordinator": lambda s: s(coordinator_found()),
    "joining-lookup": lambda s: s(Subscribe(frozenset({TOPIC}))),
    "joining": Script.joining,
    "syncing": Script.syncing,
    "syncing-leader-needs-metadata": _leader,
    "stable": Script.stable,
    "stable-busy": _stable_busy,
    "stable-static": _static_stable,
    "stable-eager": _eager,
    "revoking": Script.revoking,
    "revoking-eager": _eager_revoking,
    "leaving-revoking": _leaving_revoking,
    "leaving-sent": _leaving_sent,
    "fenced": lambda s: (s.joining(), s(join_error(E.FENCED_INSTANCE_ID))),
    "failed": lambda s: (s.joining(), s(join_error(E.GROUP_AUTHORIZATION_FAILED))),
}


def start(name: str) -> Script:
    s = Script()
    SCENARIOS[name](s)
    return s


def test_scenarios_reach_every_state() -> None:
    assert {start(name).state for name in SCENARIOS} == set(MemberState)


# -- inputs --------------------------------------------------------------------------------

CODES = [0, -1, 3, 7, 12, 14, 15, 16, 22, 23, 24, 25, 26, 27, 29, 30, 35, 79, 81, 82, 88]
codes = st.sampled_from(CODES)
topics = st.sampled_from([TOPIC, "audit"])
partitions = st.builds(Partition, topics, st.integers(0, 3))
members = st.sampled_from(["member-1", "member-2", ""])


def _subscription(names: tuple[str, ...], owned: frozenset[Partition] = frozenset()) -> bytes:
    from ingest.group.requests import topic_partitions

    return encode_subscription(
        ConsumerProtocolSubscription(
            topics=names, owned_partitions=topic_partitions(owned), generation_id=1
        )
    )


metadata_bytes = st.one_of(
    st.builds(
        _subscription,
        st.lists(topics, min_size=1, unique=True).map(tuple),
        st.frozensets(partitions, max_size=3),
    ),
    st.binary(max_size=8),
)
join_members = st.lists(
    st.builds(
        JoinGroupResponseMember,
        member_id=members,
        group_instance_id=st.none() | st.just("host-2"),
        metadata=metadata_bytes,
    ),
    max_size=3,
).map(tuple)
assignment_data = st.one_of(
    st.builds(
        assignment_bytes, st.frozensets(partitions, max_size=4), st.none() | st.binary(max_size=8)
    ),
    st.just(b""),
    st.binary(max_size=6),
)
versions = st.sampled_from(
    [
        CoordinatorVersions(),
        CoordinatorVersions(
            join_group=4, sync_group=2, heartbeat=2, leave_group=2, offset_commit=2, offset_fetch=1
        ),
        CoordinatorVersions(
            join_group=5, sync_group=3, heartbeat=3, leave_group=3, offset_commit=7, offset_fetch=7
        ),
    ]
)


def _commit_response(rows: list[tuple[str, int, int]]) -> OffsetCommitResponse:
    by_topic: dict[str, list[OffsetCommitResponsePartition]] = {}
    for topic, index, code in rows:
        by_topic.setdefault(topic, []).append(
            OffsetCommitResponsePartition(partition_index=index, error_code=code)
        )
    return OffsetCommitResponse(
        topics=tuple(
            OffsetCommitResponseTopic(name=t, partitions=tuple(ps)) for t, ps in by_topic.items()
        )
    )


def _fetch_response(
    rows: list[tuple[str, int, int, int]], group_error: int, v8: bool
) -> OffsetFetchResponse:
    if v8:
        group = OffsetFetchResponseGroup(
            group_id="g",
            error_code=group_error,
            topics=tuple(
                OffsetFetchResponseTopics(
                    name=t,
                    partitions=(
                        OffsetFetchResponsePartitions(
                            partition_index=i, committed_offset=o, metadata=None, error_code=c
                        ),
                    ),
                )
                for t, i, o, c in rows
            ),
        )
        return OffsetFetchResponse(groups=(group,))
    return OffsetFetchResponse(
        error_code=group_error,
        topics=tuple(
            OffsetFetchResponseTopic(
                name=t,
                partitions=(
                    OffsetFetchResponsePartition(
                        partition_index=i, committed_offset=o, metadata="m", error_code=c
                    ),
                ),
            )
            for t, i, o, c in rows
        ),
    )


row_codes = st.sampled_from([0, 0, 0, 3, 14, 16, 22, 25, 27, 29, 30, 82, 88])
inputs = st.one_of(
    st.builds(Subscribe, st.frozensets(topics, min_size=1)),
    st.builds(Leave, st.booleans()),
    st.builds(
        Commit,
        st.dictionaries(partitions, st.integers(0, 100), max_size=3),
        st.none() | st.text(max_size=3),
    ),
    st.builds(FetchCommitted, st.frozensets(partitions, max_size=3)),
    st.just(RevocationDone()),
    st.just(Tick()),
    st.builds(MetadataUpdate, st.dictionaries(topics, st.integers(0, 4))),
    st.builds(CoordinatorFound, st.just(1), st.just("h"), st.just(9092), versions),
    st.builds(CoordinatorLookupFailed, st.sampled_from([None, 15, 30])),
    st.just(CoordinatorLost("test")),
    st.builds(RequestFailed, st.sampled_from([*GROUP_APIS, 3])),
    st.builds(
        JoinGroupResponse,
        error_code=codes,
        generation_id=st.integers(0, 5),
        protocol_type=st.sampled_from([None, "consumer", "connect"]),
        protocol_name=st.sampled_from([None, "cooperative-sticky", "range"]),
        leader=members,
        member_id=members,
        members=join_members,
        skip_assignment=st.booleans(),
    ),
    st.builds(
        SyncGroupResponse,
        error_code=codes,
        protocol_type=st.sampled_from([None, "consumer"]),
        protocol_name=st.sampled_from([None, "cooperative-sticky", "range"]),
        assignment=assignment_data,
    ),
    st.builds(HeartbeatResponse, error_code=codes),
    st.builds(
        LeaveGroupResponse,
        error_code=codes,
        members=st.lists(
            st.builds(
                MemberResponse, member_id=members, group_instance_id=st.none(), error_code=codes
            ),
            max_size=1,
        ).map(tuple),
    ),
    st.builds(
        _commit_response, st.lists(st.tuples(topics, st.integers(0, 3), row_codes), max_size=3)
    ),
    st.builds(
        _fetch_response,
        st.lists(st.tuples(topics, st.integers(0, 3), st.integers(-1, 9), row_codes), max_size=3),
        st.sampled_from([0, 0, 16, 14, 30]),
        st.booleans(),
    ),
)

# -- the property ------------------------------------------------------------------------------


def _state_of(machine: Any) -> dict[str, Any]:
    return copy.deepcopy({k: v for k, v in vars(machine).items() if k != "config"})


def apply_and_check(s: Script, event: Any, now: float) -> None:
    machine = s.machine
    before = machine.state
    named = (before, type(event)) in TRANSITIONS
    snapshot = _state_of(machine)
    try:
        outputs = machine.handle(event, now)
    except InvalidTransition as exc:
        assert exc.state is before and exc.input_type is type(event)
        assert _state_of(machine) == snapshot, "a refused input must change nothing"
        return
    assert named, f"({before.name}, {type(event).__name__}) is not in the table but was accepted"
    after = machine.state
    assert isinstance(after, MemberState)
    assert after in TRANSITIONS[(before, type(event))].targets
    for output in outputs:
        assert isinstance(output, OUTPUT_TYPES), output
    assert_encodable(outputs)
    if after in (S.FENCED, S.FAILED):
        assert not any(isinstance(o, SendRequest | FindCoordinator) for o in outputs)
    if after in (S.UNJOINED, S.FENCED, S.FAILED):
        assert machine.assignment == frozenset()
    for output in outputs:
        if isinstance(output, PartitionsAssigned):
            assert output.added <= output.assignment
    assert machine.inflight(JoinGroupRequest.api_key) <= 1
    assert machine.inflight(HeartbeatRequest.api_key) <= 1
    deadline = machine.next_deadline()
    assert deadline is None or isinstance(deadline, float)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(SCENARIOS)),
    st.lists(
        st.tuples(inputs, st.sampled_from([0.0, 0.05, 0.5, 1.0, 4.0, 11.0])),
        min_size=1,
        max_size=12,
    ),
)
def test_random_inputs_from_every_state(scenario: str, steps: list[tuple[Any, float]]) -> None:
    s = start(scenario)
    for event, advance in steps:
        s.now += advance
        apply_and_check(s, event, s.now)


def _typical_inputs() -> list[Any]:
    return [
        Subscribe(frozenset({TOPIC, "audit"})),
        Leave(),
        Leave(force=True),
        Commit({Partition(TOPIC, 0): 1}),
        FetchCommitted(frozenset({Partition(TOPIC, 0)})),
        RevocationDone(),
        Tick(),
        MetadataUpdate({TOPIC: 3}),
        coordinator_found(),
        CoordinatorLookupFailed(15),
        CoordinatorLost(),
        *(RequestFailed(api) for api in GROUP_APIS),
        join_ok("member-1", generation=2),
        join_error(E.UNKNOWN_MEMBER_ID, "member-1"),
        sync_ok(tp(TOPIC, 0)),
        heartbeat(),
        heartbeat(E.ILLEGAL_GENERATION),
        LeaveGroupResponse(error_code=0),
        _commit_response([(TOPIC, 0, 0)]),
        _commit_response([(TOPIC, 0, E.UNKNOWN_MEMBER_ID)]),
        _fetch_response([(TOPIC, 0, 4, 0)], 0, True),
    ]


def test_typical_inputs_cover_every_input_type() -> None:
    assert {type(e) for e in _typical_inputs()} == set(INPUT_TYPES)


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_input_type_in_every_scenario(scenario: str) -> None:
    for event in _typical_inputs():
        s = start(scenario)
        apply_and_check(s, event, s.now + 0.5)
        # And the same input a little later, after whatever the first one caused.
        apply_and_check(s, event, s.now + 1.0)


def test_unnamed_pairs_raise_naming_state_and_input() -> None:
    s = start("stable")
    assert (S.STABLE, RevocationDone) not in TRANSITIONS
    with pytest.raises(InvalidTransition) as raised:
        s.machine.handle(RevocationDone(), s.now)
    assert raised.value.state is S.STABLE and raised.value.input_type is RevocationDone
    assert "RevocationDone is not valid in state STABLE" in str(raised.value)
    with pytest.raises(InvalidTransition):
        s.machine.handle(object(), s.now)  # type: ignore[arg-type]


def test_table_only_names_known_states_inputs_and_targets() -> None:
    for (state, input_type), transition in TRANSITIONS.items():
        assert isinstance(state, MemberState)
        assert input_type in INPUT_TYPES
        assert transition.targets and transition.targets <= set(MemberState)
