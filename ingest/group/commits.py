"""Offsets through the group, for both protocols: the answers a machine gives a Commit or
FetchCommitted itself, the OffsetCommit or OffsetFetch it sends otherwise, and the
events their answers (or their loss) become.

Functions of what the machine knows. The machine decides, from the error code these
return, what an answer means for its membership; nothing here changes a state.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

from ingest.group.coordination import COORDINATOR_MOVED, Coordination
from ingest.group.events import (
    Commit,
    CommitFailed,
    FetchCommitted,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    SendRequest,
)
from ingest.group.inflight import COMMIT, FETCH, Epoch, Sent
from ingest.group.requests import (
    GroupIdentity,
    commit_error,
    fetch_outcome,
    offset_commit_request,
    offset_fetch_request,
)
from ingest.group.types import MemberState
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import OffsetCommitResponse, OffsetFetchResponse
from ingest.protocol.partition import Partition

__all__ = [
    "COMMIT_RETRIABLE",
    "commit_answer",
    "commit_answered",
    "commit_lost",
    "commit_or_refuse",
    "fetch_answered",
    "fetch_lost",
    "fetch_or_refuse",
    "fetch_response",
    "refuse_commit",
    "refuse_fetch",
    "request_lost",
]

E = ErrorCode
_TERMINAL = (MemberState.FENCED, MemberState.FAILED)
_REBALANCING = (MemberState.JOINING, MemberState.SYNCING)

#: Commit errors after which the same commit may be sent again as it is.
COMMIT_RETRIABLE = frozenset(
    {
        E.COORDINATOR_LOAD_IN_PROGRESS,
        E.UNKNOWN_TOPIC_OR_PARTITION,
        E.COORDINATOR_NOT_AVAILABLE,
        E.NOT_COORDINATOR,
        E.REQUEST_TIMED_OUT,
    }
)


def refuse_commit(
    commit: Commit,
    state: MemberState,
    *,
    active: bool,
    assignment: frozenset[Partition],
    coordinator_known: bool,
    generation: int | None = None,
    membership_since: int | None = None,
) -> CommitFailed | OffsetsCommitted | None:
    """The machine's own answer to ``commit``, or None when it goes to the coordinator.

    ``active``: a member of a generation that may commit (stable, or revoking);
    ``assignment``: the partitions it may commit (those being revoked included);
    ``generation``: the member's generation, which a commit made for another refuses;
    ``membership_since``: the consumer protocol's member epoch at which the membership
    began (its first epoch after joining with epoch 0): a commit made in an earlier epoch
    comes from an earlier membership's books and is refused. Within one membership the
    epoch moves on with the group's assignments, which fence nothing.
    """

    def refuse(name: str, message: str, retriable: bool = False) -> CommitFailed:
        return CommitFailed(commit.offsets, commit.metadata, None, name, retriable, message)

    if state in _TERMINAL:
        return refuse("NOT_A_MEMBER", f"the member is {state.name}")
    if state in _REBALANCING:
        return refuse("REBALANCE_IN_PROGRESS", "commit after the rebalance completes")
    if not active:
        return refuse("NOT_A_MEMBER", "the member is not in an active generation")
    if commit.generation is not None and generation is not None and commit.generation != generation:
        return refuse(
            "ILLEGAL_GENERATION",
            f"made for generation {commit.generation}; the member is in generation {generation}",
        )
    if (
        commit.generation is not None
        and membership_since is not None
        and commit.generation < membership_since
    ):
        return refuse(
            "FENCED_MEMBER_EPOCH",
            f"made in member epoch {commit.generation}, before this membership began "
            f"(epoch {membership_since})",
        )
    not_owned = sorted(set(commit.offsets) - assignment)
    if not_owned:
        names = ", ".join(str(p) for p in not_owned)
        return refuse("NOT_ASSIGNED", f"this member does not own {names}")
    if not commit.offsets:
        return OffsetsCommitted(commit.offsets, commit.metadata)
    if not coordinator_known:
        return refuse("COORDINATOR_UNKNOWN", "the coordinator is being looked up", True)
    return None


def commit_answered(
    commit: Commit, response: OffsetCommitResponse
) -> tuple[OffsetsCommitted | CommitFailed, int]:
    """The event for ``commit``'s answer, and the error code that decides it (0: none)."""
    code = commit_error(response)
    if code == E.NONE:
        return OffsetsCommitted(commit.offsets, commit.metadata), code
    info = error_for(code)
    failed = CommitFailed(
        commit.offsets,
        commit.metadata,
        code,
        info.name,
        code in COMMIT_RETRIABLE,
        info.description,
    )
    return failed, code


def commit_lost(commit: Commit, message: str) -> CommitFailed:
    """The OffsetCommit got no answer: the commit may be sent again."""
    return CommitFailed(commit.offsets, commit.metadata, None, "REQUEST_FAILED", True, message)


def refuse_fetch(
    fetch: FetchCommitted, state: MemberState, *, coordinator_known: bool
) -> OffsetsFetched | OffsetFetchFailed | None:
    """The machine's own answer to ``fetch``, or None when it goes to the coordinator."""
    if not fetch.partitions:
        return OffsetsFetched({})
    if state in _TERMINAL or not coordinator_known:
        retriable = state not in _TERMINAL
        message = "the coordinator is being looked up" if retriable else state.name
        name = "COORDINATOR_UNKNOWN" if retriable else "NOT_A_MEMBER"
        return OffsetFetchFailed(fetch.partitions, None, name, retriable, message)
    return None


def fetch_answered(
    response: OffsetFetchResponse, group_id: str, partitions: frozenset[Partition]
) -> tuple[OffsetsFetched | OffsetFetchFailed, int]:
    """The event for an OffsetFetch answer, and its error code (0: none)."""
    outcome = fetch_outcome(response, group_id, partitions)
    if not outcome.error_code:
        return OffsetsFetched(outcome.offsets), 0
    code = outcome.error_code
    info = error_for(code)
    message = f"{info.description} {outcome.detail}".strip()
    return OffsetFetchFailed(partitions, code, info.name, outcome.retriable, message), code


def fetch_lost(partitions: frozenset[Partition], message: str) -> OffsetFetchFailed:
    """The OffsetFetch got no answer: it may be asked again."""
    return OffsetFetchFailed(partitions, None, "REQUEST_FAILED", True, message)


def commit_or_refuse(
    link: Coordination,
    commit: Commit,
    state: MemberState,
    *,
    active: bool,
    assignment: frozenset[Partition],
    identity: GroupIdentity,
    generation_id: int,
    member_id: str,
    epoch: Epoch,
    generation: int | None = None,
    membership_since: int | None = None,
    leader_epochs: Mapping[Partition, int] | None = None,
) -> CommitFailed | OffsetsCommitted | SendRequest:
    """The member's own answer to ``commit`` (``refuse_commit``), or the OffsetCommit sent.

    ``generation_id`` goes out as the request's generation_id_or_member_epoch.
    """
    coordinator = link.found
    answer = refuse_commit(
        commit,
        state,
        active=active,
        assignment=assignment,
        coordinator_known=coordinator is not None,
        generation=generation,
        membership_since=membership_since,
    )
    if answer is not None:
        return answer
    assert coordinator is not None
    version = coordinator.versions.offset_commit
    request = offset_commit_request(
        identity,
        generation_id=generation_id,
        member_id=member_id,
        offsets=commit.offsets,
        metadata=commit.metadata,
        version=version,
        leader_epochs=leader_epochs,
    )
    return link.send(request, version, epoch, commit=commit)


def fetch_or_refuse(
    link: Coordination, fetch: FetchCommitted, state: MemberState, group_id: str, epoch: Epoch
) -> OffsetsFetched | OffsetFetchFailed | SendRequest:
    """The member's own answer to ``fetch`` (``refuse_fetch``), or the OffsetFetch sent."""
    coordinator = link.found
    answer = refuse_fetch(fetch, state, coordinator_known=coordinator is not None)
    if answer is not None:
        return answer
    assert coordinator is not None
    version = coordinator.versions.offset_fetch
    request = offset_fetch_request(group_id, fetch.partitions, version=version)
    return link.send(request, version, epoch, partitions=fetch.partitions)


def commit_answer(
    link: Coordination, response: OffsetCommitResponse, state: Enum
) -> tuple[OffsetsCommitted | CommitFailed, int, Sent]:
    """The OffsetCommit ``response`` answers: its event, its error code, and the request."""
    sent = link.take(COMMIT, OffsetCommitResponse, state)
    assert sent.commit is not None
    event, code = commit_answered(sent.commit, response)
    return event, code, sent


def fetch_response(
    link: Coordination,
    response: OffsetFetchResponse,
    group_id: str,
    state: Enum,
    terminal: bool,
) -> tuple[OffsetsFetched | OffsetFetchFailed, int]:
    """The OffsetFetch ``response`` answers: its event, and the fatal error code it brings
    to a live member (GROUP_AUTHORIZATION_FAILED), else 0. A coordinator that moved is
    forgotten (``terminal``: the member is fenced or failed, and nothing more matters)."""
    sent = link.take(FETCH, OffsetFetchResponse, state)
    event, code = fetch_answered(response, group_id, sent.partitions)
    if not code or terminal:
        return event, 0
    if code in COORDINATOR_MOVED:
        link.forget(f"OffsetFetch: {error_for(code).name}")
    elif code == E.GROUP_AUTHORIZATION_FAILED:
        return event, code
    return event, 0


def request_lost(sent: Sent, message: str) -> CommitFailed | OffsetFetchFailed | None:
    """The event for an OffsetCommit or OffsetFetch that got no answer; None for other APIs."""
    if sent.api_key == COMMIT and sent.commit is not None:
        return commit_lost(sent.commit, message)
    if sent.api_key == FETCH:
        return fetch_lost(sent.partitions, message)
    return None
