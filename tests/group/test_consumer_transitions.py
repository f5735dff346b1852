"""Every (state, input) pair of the consumer-protocol machine (KIP-848): the table names it
and the machine stays well-formed, or the machine raises InvalidTransition and changes
nothing. Random answer sequences from every state raise nothing else."""

from __future__ import annotations

import contextlib
import copy
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.group import (
    Commit,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    FindCoordinator,
    InvalidTransition,
    Leave,
    PartitionsAssigned,
    RequestFailed,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.group.consumer.consumer_events import (
    CONSUMER_INPUT_TYPES,
    CONSUMER_OUTPUT_TYPES,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_machine import ConsumerMachine
from ingest.group.consumer.consumer_transitions import ROWS, TERMINAL, TRANSITIONS, Outcome
from ingest.group.engine import TableEngine
from ingest.protocol.messages import (
    Assignment,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetFetchRequest,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    TopicPartitions,
)
from ingest.protocol.partition import Partition
from tests.group.consumer_support import (
    IDS,
    TOPIC,
    E,
    Member,
    S,
    config,
    coordinator,
    error,
    names,
    ok,
)
from tests.group.support import assert_encodable

HEARTBEAT = ConsumerGroupHeartbeatRequest.api_key
APIS = [HEARTBEAT, OffsetCommitRequest.api_key, OffsetFetchRequest.api_key]

# -- starting points: every state, with and without requests in flight -----------------


def _stable_busy(m: Member) -> None:
    m.stable()
    m(Tick(), after=1.0)
    m(Commit({Partition(TOPIC, 0): 5}, "v1"))
    m(FetchCommitted(frozenset({Partition(TOPIC, 1)})))


def _leaving_revoking(m: Member) -> None:
    m.stable()
    m(Leave())


def _leaving_sent(m: Member) -> None:
    m.stable()
    m(Leave())
    m(RevocationDone())


def _revoking_fenced(m: Member) -> None:
    m.revoking()
    m.heartbeat(error(E.FENCED_MEMBER_EPOCH))


def _static(m: Member) -> None:
    m.machine = type(m.machine)(config(group_instance_id="host-1"), member_id="m-static")
    m.stable()


def _regex(m: Member) -> None:
    m(SubscribeRegex("^orders$"))
    m(names("orders"))
    m(coordinator())
    m(ok(1, {TOPIC: (2,)}))


def _busy(path: Callable[[Member], object]) -> Callable[[Member], object]:
    """``path``, then a heartbeat in flight."""

    def go(m: Member) -> None:
        path(m)
        m(Tick(), after=1.0)
        assert m.machine.inflight(HEARTBEAT) >= 1

    return go


def _reconciling_empty(m: Member) -> None:
    """Joined, assigned only a partition of a topic id nobody named: owns nothing."""
    m.joining()
    m(ok(1, {"mystery": (0,)}))


def _stable_empty(m: Member) -> None:
    m.joining()
    m(ok(1, {}))


def _revoking_unknown(m: Member) -> None:
    m.stable()
    m.heartbeat(ok(2, {TOPIC: (0,), "mystery": (0,)}))


def _revoking_retargeted(m: Member) -> None:
    m.revoking()
    m.heartbeat(ok(3, {"audit": (5,)}))


def _lost_coordinator(path: Callable[[Member], object]) -> Callable[[Member], object]:
    """``path``, then the coordinator connection lost."""

    def go(m: Member) -> None:
        path(m)
        m(CoordinatorLost())

    return go


def _leaving_fenced(m: Member) -> None:
    _busy(_leaving_revoking)(m)
    m(error(E.UNKNOWN_MEMBER_ID))


SCENARIOS: dict[str, Callable[[Member], object]] = {
    "unjoined": lambda m: None,
    "unjoined-known-coordinator": lambda m: m(coordinator()),
    "joining-lookup": lambda m: m(Subscribe(frozenset({TOPIC}))),
    "joining": Member.joining,
    "stable": Member.stable,
    "stable-busy": _stable_busy,
    "stable-static": _static,
    "stable-regex": _regex,
    "reconciling": Member.reconciling,
    "revoking": Member.revoking,
    "revoking-fenced": _revoking_fenced,
    "leaving-revoking": _leaving_revoking,
    "leaving-sent": _leaving_sent,
    "reconciling-busy": _busy(Member.reconciling),
    "reconciling-empty": _reconciling_empty,
    "reconciling-empty-lost": _lost_coordinator(_reconciling_empty),
    "stable-empty": _stable_empty,
    "stable-empty-lost": _lost_coordinator(_stable_empty),
    "revoking-busy": _busy(Member.revoking),
    "revoking-unknown": _revoking_unknown,
    "revoking-retargeted": _revoking_retargeted,
    "leaving-revoking-busy": _busy(_leaving_revoking),
    "leaving-fenced": _leaving_fenced,
    "fenced": lambda m: (m.stable(), m.heartbeat(error(E.FENCED_INSTANCE_ID))),
    "failed": lambda m: (m.joining(), m(error(E.GROUP_AUTHORIZATION_FAILED))),
}


def start(name: str) -> Member:
    m = Member()
    SCENARIOS[name](m)
    return m


def test_scenarios_reach_every_state() -> None:
    assert {start(name).state for name in SCENARIOS} == set(S)


# -- inputs --------------------------------------------------------------------------------

CODES = [0, 0, 0, -1, 7, 14, 15, 16, 25, 29, 30, 35, 42, 69, 81, 82, 110, 111, 112, 113, 128]
codes = st.sampled_from(CODES)
topic_names = st.sampled_from(sorted(IDS))
topic_ids = st.sampled_from([*IDS.values(), uuid.UUID(int=7)])
partitions = st.builds(Partition, st.sampled_from([TOPIC, "audit"]), st.integers(0, 3))
assignments = st.none() | st.builds(
    Assignment,
    topic_partitions=st.lists(
        st.builds(
            TopicPartitions,
            topic_id=topic_ids,
            partitions=st.lists(st.integers(0, 4), max_size=3, unique=True).map(tuple),
        ),
        max_size=3,
    ).map(tuple),
)
heartbeat_answers = st.builds(
    ConsumerGroupHeartbeatResponse,
    error_code=codes,
    error_message=st.none() | st.just("why"),
    member_id=st.none() | st.sampled_from(["", "4Ug3xYlCQvqJbLXZCI0mVw", "other"]),
    member_epoch=st.integers(-2, 6),
    heartbeat_interval_ms=st.sampled_from([0, 500, 1_000, 5_000]),
    assignment=assignments,
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


inputs = st.one_of(
    st.builds(Subscribe, st.frozensets(st.sampled_from([TOPIC, "audit"]), min_size=1)),
    st.builds(SubscribeRegex, st.sampled_from(["^orders$", ".*"])),
    st.builds(Leave, st.booleans()),
    st.builds(Commit, st.dictionaries(partitions, st.integers(0, 100), max_size=3)),
    st.builds(FetchCommitted, st.frozensets(partitions, max_size=2)),
    st.just(RevocationDone()),
    st.just(Tick()),
    st.builds(TopicNames, st.dictionaries(topic_ids, st.none() | topic_names, max_size=3)),
    st.builds(
        lambda h, c: coordinator(heartbeat=h, offset_commit=c),
        st.sampled_from([0, 1, 1, None]),
        st.sampled_from([9, 9, 8]),
    ),
    st.builds(CoordinatorLookupFailed, st.sampled_from([None, 15, 30])),
    st.just(CoordinatorLost("test")),
    st.builds(RequestFailed, st.sampled_from([*APIS, 11])),
    heartbeat_answers,
    heartbeat_answers,  # the answer that matters most, drawn twice as often
    st.builds(
        _commit_response,
        st.lists(st.tuples(st.sampled_from([TOPIC]), st.integers(0, 3), codes), max_size=2),
    ),
    st.builds(
        lambda code: OffsetFetchResponse(
            groups=(OffsetFetchResponseGroup(group_id="g", error_code=code),)
        ),
        st.sampled_from([0, 16, 30]),
    ),
)

# -- the property ------------------------------------------------------------------------------


def _state_of(machine: Any) -> dict[str, Any]:
    return copy.deepcopy({k: v for k, v in vars(machine).items() if k != "config"})


def apply_and_check(m: Member, event: Any, now: float) -> None:
    machine = m.machine
    before = machine.state
    named = (before, type(event)) in TRANSITIONS
    snapshot = _state_of(machine)
    try:
        outputs = machine.handle(event, now)
    except InvalidTransition as exc:  # the one error the machine documents
        assert exc.state is before and exc.input_type is type(event)
        assert _state_of(machine) == snapshot, "a refused input must change nothing"
        return
    assert named, f"({before.name}, {type(event).__name__}) is not in the table but was accepted"
    after = machine.state
    assert after in TRANSITIONS[(before, type(event))].targets
    for output in outputs:
        assert isinstance(output, CONSUMER_OUTPUT_TYPES), output
    assert_encodable(outputs)
    if after in TERMINAL:
        assert not any(isinstance(o, SendRequest | FindCoordinator) for o in outputs)
    if after in (S.UNJOINED, S.JOINING, *TERMINAL):
        assert machine.assignment == frozenset()
    for output in outputs:
        if isinstance(output, PartitionsAssigned):
            assert output.added <= output.assignment
            assert not output.added & snapshot["_m"].owned, "a kept partition was announced"
        if isinstance(output, SendRequest) and isinstance(
            output.request, ConsumerGroupHeartbeatRequest
        ):
            request = output.request
            if request.member_epoch == 0:
                assert request.topic_partitions == ()  # joining: owns nothing
                assert request.rebalance_timeout_ms > 0
    assert machine.inflight(HEARTBEAT) <= 2  # a regular one, and the leaving one beside it
    deadline = machine.next_deadline()
    assert deadline is None or isinstance(deadline, float)


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(sorted(SCENARIOS)),
    st.lists(
        st.tuples(inputs, st.sampled_from([0.0, 0.05, 0.5, 1.0, 4.0, 11.0])),
        min_size=1,
        max_size=14,
    ),
)
def test_random_inputs_from_every_state(scenario: str, steps: list[tuple[Any, float]]) -> None:
    m = start(scenario)
    for event, advance in steps:
        m.now += advance
        apply_and_check(m, event, m.now)


def _typical_inputs() -> list[Any]:
    return [
        Subscribe(frozenset({TOPIC, "audit"})),
        SubscribeRegex("^orders$"),
        Leave(),
        Leave(force=True),
        Commit({Partition(TOPIC, 0): 1}),
        FetchCommitted(frozenset({Partition(TOPIC, 0)})),
        RevocationDone(),
        Tick(),
        names("mystery"),
        coordinator(),
        CoordinatorLookupFailed(15),
        CoordinatorLost(),
        *(RequestFailed(api) for api in APIS),
        TopicNames({IDS["mystery"]: None}),
        coordinator(heartbeat=None),
        ok(3, {TOPIC: (1, 2)}),
        ok(3, {TOPIC: (0, 1), "mystery": (1,)}),
        ok(3, {TOPIC: (0,), "mystery": (0,)}),
        ok(1, {"mystery": (0,)}),
        ok(3),
        error(E.FENCED_MEMBER_EPOCH),
        error(E.FENCED_INSTANCE_ID),
        error(E.GROUP_AUTHORIZATION_FAILED),
        error(E.NOT_COORDINATOR),
        _commit_response([(TOPIC, 0, 0)]),
        OffsetFetchResponse(groups=(OffsetFetchResponseGroup(group_id="g"),)),
    ]


def test_typical_inputs_cover_every_input_type() -> None:
    assert {type(e) for e in _typical_inputs()} == set(CONSUMER_INPUT_TYPES)


AFTER = (0.5, 1.0, 11.0)  # the same input again, after whatever the last one caused


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_input_type_in_every_scenario(scenario: str) -> None:
    for event in _typical_inputs():
        m = start(scenario)
        for after in AFTER:
            apply_and_check(m, event, m.now + after)


def test_every_row_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each (state, outcome) row of ROWS is reached from some scenario by some input."""
    taken: set[tuple[S, Outcome]] = set()
    step = TableEngine._step

    def recording(engine: Any, machine: ConsumerMachine, named: Any, *args: Any) -> None:
        taken.add((machine.state, named.outcome))
        step(engine, machine, named, *args)

    monkeypatch.setattr(TableEngine, "_step", recording)
    for scenario in SCENARIOS:
        for event in _typical_inputs():
            m = start(scenario)
            for after in AFTER:
                with contextlib.suppress(InvalidTransition):
                    m.machine.handle(event, m.now + after)
    missing = set(ROWS) - taken
    assert not missing, sorted((s.name, o.name) for s, o in missing)


def test_every_accepted_pair_is_reached_by_the_scenarios() -> None:
    reached = set()
    for scenario in SCENARIOS:
        for event in _typical_inputs():
            m = start(scenario)
            if (m.state, type(event)) in TRANSITIONS:
                reached.add((m.state, type(event)))
    assert reached == set(TRANSITIONS), sorted(
        (s.name, i.__name__) for s, i in set(TRANSITIONS) - reached
    )


def test_unnamed_pairs_raise_naming_state_and_input() -> None:
    m = start("stable")
    assert (S.STABLE, RevocationDone) not in TRANSITIONS
    with pytest.raises(InvalidTransition, match="RevocationDone is not valid in state STABLE"):
        m.machine.handle(RevocationDone(), m.now)
    with pytest.raises(InvalidTransition, match="no such request is in flight"):
        m.machine.handle(ok(2), m.now)  # an answer to nothing
    with pytest.raises(InvalidTransition):
        m.machine.handle(object(), m.now)  # type: ignore[arg-type]
