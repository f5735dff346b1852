"""Committing and fetching offsets through the machine (the pure half)."""

from __future__ import annotations

import pytest

from ingest.group import (
    Commit,
    CommitFailed,
    CommittedOffset,
    CoordinatorFound,
    CoordinatorLost,
    CoordinatorVersions,
    Fatal,
    Fenced,
    FetchCommitted,
    FindCoordinator,
    Leave,
    MemberState,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    PartitionsLost,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.group.requests import commit_error
from ingest.protocol.codec import decode_request, encode_request
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import (
    JoinGroupRequest,
    LeaveGroupResponse,
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
)
from ingest.protocol.partition import Partition
from tests.group.support import (
    TOPIC,
    E,
    Script,
    commit_response,
    config,
    events_of,
    heartbeat,
    join_ok,
    only_request,
    requests_of,
    sync_ok,
    tp,
)

P0, P1 = Partition(TOPIC, 0), Partition(TOPIC, 1)
OFFSETS = {P0: 42, P1: 7}


def stable(**overrides: object) -> Script:
    s = Script(config(**overrides))
    s.stable()
    return s


def test_commit_carries_generation_member_instance_and_metadata() -> None:
    s = stable(group_instance_id="host-1")
    request = only_request(s(Commit(OFFSETS, metadata="delta-v12")), OffsetCommitRequest)
    assert (request.group_id, request.generation_id_or_member_epoch, request.member_id) == (
        "g",
        1,
        "member-1",
    )
    assert request.group_instance_id == "host-1"
    (topic,) = request.topics
    assert topic.name == TOPIC
    assert [
        (p.partition_index, p.committed_offset, p.committed_metadata) for p in topic.partitions
    ] == [
        (0, 42, "delta-v12"),
        (1, 7, "delta-v12"),
    ]
    (done,) = events_of(s(commit_response(request)), OffsetsCommitted)
    assert dict(done.offsets) == OFFSETS and done.metadata == "delta-v12"


def test_commit_before_v7_leaves_out_the_instance_id() -> None:
    s = Script(config(group_instance_id="host-1"))
    s(Subscribe(frozenset({TOPIC})))
    s(CoordinatorFound(1, "h", 1, CoordinatorVersions(offset_commit=6)))
    s(join_ok("member-1"))
    s(sync_ok(tp(TOPIC, 0, 1)))
    request = only_request(s(Commit({P0: 1})), OffsetCommitRequest)
    assert request.group_instance_id is None and request.member_id == "member-1"


def test_commit_carries_the_leader_epochs_given_and_minus_one_elsewhere() -> None:
    s = stable()
    request = only_request(s(Commit(OFFSETS, leader_epochs={P0: 5})), OffsetCommitRequest)
    (topic,) = request.topics
    assert [(p.partition_index, p.committed_leader_epoch) for p in topic.partitions] == [
        (0, 5),
        (1, -1),
    ]
    with pytest.raises(ValueError, match="not committed"):
        Commit({P0: 1}, leader_epochs={P1: 3})


def test_commit_before_v6_has_no_leader_epoch_to_carry() -> None:
    s = Script(config())
    s(Subscribe(frozenset({TOPIC})))
    s(CoordinatorFound(1, "h", 1, CoordinatorVersions(offset_commit=5)))
    s(join_ok("member-1"))
    s(sync_ok(tp(TOPIC, 0, 1)))
    out = s(Commit({P0: 1}, leader_epochs={P0: 5}))
    request = only_request(out, OffsetCommitRequest)
    # The field is there to build, and the codec leaves it out at v5 (it is ignorable).
    frame = encode_request(request, version=5, correlation_id=1, client_id="c")
    _, decoded = decode_request(frame[4:])
    assert decoded.topics[0].partitions[0].committed_leader_epoch == -1


@pytest.mark.parametrize("code", [E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID])
def test_commit_fenced_by_a_newer_generation_fails_and_rejoins(code: int) -> None:
    s = stable()
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    outputs = s(commit_response(request, code))
    (failed,) = events_of(outputs, CommitFailed)
    assert (failed.error_code, failed.retriable) == (code, False)
    assert dict(failed.offsets) == OFFSETS
    assert events_of(outputs, PartitionsLost)[0].partitions == tp(TOPIC, 0, 1)
    assert not requests_of(outputs, OffsetCommitRequest), "never retried blindly"
    only_request(outputs, JoinGroupRequest)


def test_commit_rejected_for_an_old_generation_only_fails() -> None:
    s = stable()
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    # The group moves on to generation 2 before the answer comes.
    s(Tick(), after=1.0)
    s(heartbeat(E.REBALANCE_IN_PROGRESS))
    s(join_ok("member-1", generation=2))
    s(sync_ok(tp(TOPIC, 0, 1)))
    outputs = s(commit_response(request, E.ILLEGAL_GENERATION))
    assert [type(o) for o in outputs] == [CommitFailed]
    assert s.state is MemberState.STABLE and s.machine.generation_id == 2


def test_commit_during_rebalance_fails_and_rejoins_keeping_partitions() -> None:
    s = stable()
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    outputs = s(commit_response(request, E.REBALANCE_IN_PROGRESS))
    (failed,) = events_of(outputs, CommitFailed)
    assert failed.error_name == "REBALANCE_IN_PROGRESS" and not failed.retriable
    only_request(outputs, JoinGroupRequest)
    assert s.machine.assignment == tp(TOPIC, 0, 1)


def test_commit_fenced_instance_is_terminal() -> None:
    s = stable(group_instance_id="host-1")
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    outputs = s(commit_response(request, E.FENCED_INSTANCE_ID))
    assert events_of(outputs, CommitFailed) and events_of(outputs, Fenced)
    assert s.state is MemberState.FENCED


@pytest.mark.parametrize(
    ("code", "retriable", "rediscover"),
    [
        (E.COORDINATOR_LOAD_IN_PROGRESS, True, False),
        (E.UNKNOWN_TOPIC_OR_PARTITION, True, False),
        (E.NOT_COORDINATOR, True, True),
        (E.COORDINATOR_NOT_AVAILABLE, True, True),
        (E.REQUEST_TIMED_OUT, True, True),
        (E.OFFSET_METADATA_TOO_LARGE, False, False),
        (E.INVALID_COMMIT_OFFSET_SIZE, False, False),
        (E.TOPIC_AUTHORIZATION_FAILED, False, False),
    ],
)
def test_other_commit_errors(code: int, retriable: bool, rediscover: bool) -> None:
    s = stable()
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    outputs = s(commit_response(request, code))
    (failed,) = events_of(outputs, CommitFailed)
    assert (failed.error_name, failed.retriable) == (error_for(code).name, retriable)
    assert bool(events_of(outputs, FindCoordinator)) is rediscover
    assert not requests_of(outputs, OffsetCommitRequest)
    assert s.state is MemberState.STABLE and s.machine.assignment == tp(TOPIC, 0, 1)


def test_group_authorization_failure_on_commit_is_fatal() -> None:
    s = stable()
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    outputs = s(commit_response(request, E.GROUP_AUTHORIZATION_FAILED))
    assert events_of(outputs, CommitFailed) and events_of(outputs, Fatal)
    assert s.state is MemberState.FAILED


def test_authorization_failure_of_a_commit_answered_after_leaving_only_fails_it() -> None:
    """The member left (no longer in a group to fail); the commit's failure is reported.

    Before issue 15 this answer crashed the machine (its handler chose FAILED, which
    the table did not allow from UNJOINED).
    """
    s = stable()
    request = only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    s(Leave())
    s(RevocationDone())
    s(LeaveGroupResponse(error_code=0))
    assert s.state is MemberState.UNJOINED
    outputs = s(commit_response(request, E.GROUP_AUTHORIZATION_FAILED))
    (failed,) = events_of(outputs, CommitFailed)
    assert failed.error_name == "GROUP_AUTHORIZATION_FAILED" and not failed.retriable
    assert outputs == [failed] and s.state is MemberState.UNJOINED


def test_first_failing_partition_decides_and_authorization_comes_last() -> None:
    def response(*codes: int) -> OffsetCommitResponse:
        return OffsetCommitResponse(
            topics=(
                OffsetCommitResponseTopic(
                    name="t",
                    partitions=tuple(
                        OffsetCommitResponsePartition(partition_index=i, error_code=c)
                        for i, c in enumerate(codes)
                    ),
                ),
            )
        )

    assert commit_error(response(0, 0)) == 0
    assert (
        commit_error(response(E.TOPIC_AUTHORIZATION_FAILED, E.NOT_COORDINATOR)) == E.NOT_COORDINATOR
    )
    assert commit_error(response(0, E.TOPIC_AUTHORIZATION_FAILED)) == E.TOPIC_AUTHORIZATION_FAILED


def test_commits_the_machine_refuses() -> None:
    s = Script()
    (failed,) = events_of(s(Commit({P0: 1})), CommitFailed)
    assert failed.error_name == "NOT_A_MEMBER" and failed.error_code is None
    s.joining()
    (failed,) = events_of(s(Commit({P0: 1})), CommitFailed)
    assert failed.error_name == "REBALANCE_IN_PROGRESS"
    s = stable()
    (failed,) = events_of(s(Commit({Partition(TOPIC, 9): 1, P0: 1})), CommitFailed)
    assert failed.error_name == "NOT_ASSIGNED" and "orders-9" in failed.message
    with pytest.raises(ValueError, match="negative"):
        Commit({P0: -1})
    assert events_of(s(Commit({})), OffsetsCommitted)


def test_revoked_partitions_stay_committable_until_revocation_is_done() -> None:
    s = Script()
    s.revoking()  # orders-1 is being revoked
    only_request(s(Commit({Partition(TOPIC, 1): 9})), OffsetCommitRequest)
    s(RevocationDone())
    (failed,) = events_of(s(Commit({Partition(TOPIC, 1): 10})), CommitFailed)
    assert failed.error_name == "REBALANCE_IN_PROGRESS"  # rejoining now


def test_final_commit_while_leaving() -> None:
    s = stable()
    s(Leave())
    assert s.state is MemberState.LEAVING
    only_request(s(Commit(OFFSETS, "final")), OffsetCommitRequest)
    s(RevocationDone())
    (failed,) = events_of(s(Commit(OFFSETS)), CommitFailed)
    assert failed.error_name == "NOT_A_MEMBER"


def test_lost_connection_fails_commits_in_flight_as_retriable() -> None:
    s = stable()
    only_request(s(Commit(OFFSETS)), OffsetCommitRequest)
    outputs = s(CoordinatorLost("reset"))
    (failed,) = events_of(outputs, CommitFailed)
    assert failed.retriable and failed.error_code is None
    assert events_of(outputs, FindCoordinator)
    (refused,) = events_of(s(Commit(OFFSETS)), CommitFailed)
    assert refused.error_name == "COORDINATOR_UNKNOWN" and refused.retriable


# -- OffsetFetch ----------------------------------------------------------------------------


def fetch_v8(
    *rows: tuple[str, int, int, str | None, int], group_error: int = 0
) -> OffsetFetchResponse:
    topics: dict[str, list[OffsetFetchResponsePartitions]] = {}
    for topic, index, offset, metadata, code in rows:
        topics.setdefault(topic, []).append(
            OffsetFetchResponsePartitions(
                partition_index=index,
                committed_offset=offset,
                committed_leader_epoch=3,
                metadata=metadata,
                error_code=code,
            )
        )
    group = OffsetFetchResponseGroup(
        group_id="g",
        topics=tuple(
            OffsetFetchResponseTopics(name=t, partitions=tuple(ps)) for t, ps in topics.items()
        ),
        error_code=group_error,
    )
    return OffsetFetchResponse(groups=(group,))


def test_fetch_committed_offsets_v8() -> None:
    s = stable()
    wanted = frozenset({P0, P1, Partition(TOPIC, 2)})
    request = only_request(s(FetchCommitted(wanted)), OffsetFetchRequest)
    assert request.require_stable
    (group,) = request.groups
    assert group.group_id == "g"
    assert [(t.name, t.partition_indexes) for t in group.topics or ()] == [(TOPIC, (0, 1, 2))]
    outputs = s(fetch_v8((TOPIC, 0, 42, "delta-v12", 0), (TOPIC, 1, -1, None, 0)))
    (fetched,) = events_of(outputs, OffsetsFetched)
    assert dict(fetched.offsets) == {
        P0: CommittedOffset(42, "delta-v12", 3),
        P1: None,
        Partition(TOPIC, 2): None,
    }


@pytest.mark.parametrize(("version", "stable_flag"), [(7, True), (5, False)])
def test_fetch_committed_offsets_before_v8(version: int, stable_flag: bool) -> None:
    s = Script()
    s(Subscribe(frozenset({TOPIC})))
    s(CoordinatorFound(1, "h", 1, CoordinatorVersions(offset_fetch=version)))
    request = only_request(s(FetchCommitted(frozenset({P1}))), OffsetFetchRequest)
    assert request.group_id == "g" and request.require_stable is stable_flag
    assert [(t.name, t.partition_indexes) for t in request.topics or ()] == [(TOPIC, (1,))]
    response = OffsetFetchResponse(
        topics=(
            OffsetFetchResponseTopic(
                name=TOPIC,
                partitions=(
                    OffsetFetchResponsePartition(
                        partition_index=1, committed_offset=5, metadata="m", error_code=0
                    ),
                ),
            ),
        )
    )
    (fetched,) = events_of(s(response), OffsetsFetched)
    assert dict(fetched.offsets) == {P1: CommittedOffset(5, "m")}


@pytest.mark.parametrize(
    ("response", "name", "retriable", "rediscover"),
    [
        (
            fetch_v8((TOPIC, 0, 1, None, E.UNSTABLE_OFFSET_COMMIT)),
            "UNSTABLE_OFFSET_COMMIT",
            True,
            False,
        ),
        (
            fetch_v8((TOPIC, 0, 1, None, E.UNKNOWN_TOPIC_OR_PARTITION)),
            "UNKNOWN_TOPIC_OR_PARTITION",
            False,
            False,
        ),
        (fetch_v8(group_error=E.NOT_COORDINATOR), "NOT_COORDINATOR", True, True),
        (
            fetch_v8(group_error=E.COORDINATOR_LOAD_IN_PROGRESS),
            "COORDINATOR_LOAD_IN_PROGRESS",
            True,
            False,
        ),
    ],
)
def test_fetch_errors(
    response: OffsetFetchResponse, name: str, retriable: bool, rediscover: bool
) -> None:
    s = stable()
    only_request(s(FetchCommitted(frozenset({P0}))), OffsetFetchRequest)
    outputs = s(response)
    (failed,) = events_of(outputs, OffsetFetchFailed)
    assert (failed.error_name, failed.retriable, failed.partitions) == (
        name,
        retriable,
        frozenset({P0}),
    )
    assert bool(events_of(outputs, FindCoordinator)) is rediscover


def test_fetch_group_authorization_failure_is_fatal() -> None:
    s = stable()
    only_request(s(FetchCommitted(frozenset({P0}))), OffsetFetchRequest)
    outputs = s(fetch_v8(group_error=E.GROUP_AUTHORIZATION_FAILED))
    assert events_of(outputs, OffsetFetchFailed) and events_of(outputs, Fatal)


def test_a_commit_made_for_another_generation_is_refused_unsent() -> None:
    """A caller held while its member's session expired and it joined again commits
    from its books of the old generation: the new generation must not carry that past
    the coordinator's fence (the member is in generation 1 here)."""
    s = stable()
    (failed,) = events_of(s(Commit(OFFSETS, generation=0)), CommitFailed)
    assert failed.error_name == "ILLEGAL_GENERATION" and failed.error_code is None
    assert "generation 0" in failed.message and not requests_of(s(Tick()), OffsetCommitRequest)
    request = only_request(s(Commit(OFFSETS, generation=1)), OffsetCommitRequest)
    assert request.generation_id_or_member_epoch == 1
