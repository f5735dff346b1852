"""Handlers of the coordinator's answers: JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, OffsetCommit and OffsetFetch.

Each takes the request its answer belongs to (``inflight.py``: the oldest of its
API; an answer to nothing in flight is refused), sets a stale answer aside, and
names the outcome of a current one by its error code, as Kafka's consumer does.
"""

from __future__ import annotations

from collections.abc import Iterator

from ingest.errors import DecodeError, RemoteProtocolError
from ingest.group.classic.classic_requests import CONSUMER_PROTOCOL_TYPE
from ingest.group.classic.classic_transitions import (
    JOINING,
    STABLE,
    STAY,
    SYNCING,
    TERMINAL,
    UNJOINED,
    Outcome,
    Step,
)
from ingest.group.classic.core import MachineCore
from ingest.group.commits import commit_answered, fetch_answered
from ingest.group.events import Left, Output
from ingest.group.inflight import COMMIT, FETCH, HEARTBEAT, JOIN, LEAVE, SYNC
from ingest.group.types import Partition
from ingest.protocol.consumer import decode_assignment
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)

__all__ = ["AnswerHandlers"]

E = ErrorCode
_COORDINATOR_MOVED = {E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR}


class AnswerHandlers(MachineCore):
    """Coordinator answers -> outcomes. See the module docstring."""

    def _on_join_response(self, response: JoinGroupResponse, now: float, out: list[Output]) -> Step:
        sent = self._take(JOIN, JoinGroupResponse)
        if self._state is not JOINING or not sent.same_round(self._epoch()):
            return STAY
        code = response.error_code
        name = error_for(code).name
        match code:
            case E.NONE:
                return self._joined(response, now)
            case E.MEMBER_ID_REQUIRED:
                self._member_id = response.member_id
                return Step(Outcome.JOIN, at=now, reason="the coordinator gave us a member id")
            case E.UNKNOWN_MEMBER_ID if sent.epoch.member_id == self._member_id:
                return Step(Outcome.MEMBER_LOST, lost=f"JoinGroup: {name}", at=now, reason=name)
            case E.UNKNOWN_MEMBER_ID | E.REBALANCE_IN_PROGRESS:
                return Step(Outcome.JOIN, at=now, reason=name)
            case E.COORDINATOR_LOAD_IN_PROGRESS:
                return Step(Outcome.JOIN, at=now + self._backoff(), reason=name)
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR:
                self._forget_coordinator(f"JoinGroup: {name}")
                return Step(Outcome.JOIN, at=now, reason=name)
            case E.FENCED_INSTANCE_ID:
                return self._fence("JoinGroup")
        return self._fail(code, "JoinGroup failed")

    def _joined(self, response: JoinGroupResponse, now: float) -> Step:
        if response.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE):
            return self._fail(
                E.INCONSISTENT_GROUP_PROTOCOL,
                f"JoinGroup: protocol type {response.protocol_type!r}, "
                f"expected {CONSUMER_PROTOCOL_TYPE!r}",
            )
        name = response.protocol_name
        if name is None or self.config.assignor(name) is None:
            offered = [a.name for a in self.config.assignors]
            return self._fail(
                E.INCONSISTENT_GROUP_PROTOCOL,
                f"JoinGroup: the coordinator chose assignor {name!r}; we offered {offered}",
            )
        self._generation_id = response.generation_id
        self._member_id = response.member_id
        self._protocol_name = name
        self._leader_id = response.leader
        self._session_anchor = now
        self._next_heartbeat_at = now + self.config.heartbeat_interval_ms / 1000
        if self.is_leader and not response.skip_assignment:
            self._leadership.pending = response
            return self._lead(now)
        return self._sync(now, {})

    def _on_sync_response(
        self, response: SyncGroupResponse, now: float, out: list[Output]
    ) -> Step | Iterator[Step]:
        sent = self._take(SYNC, SyncGroupResponse)
        if self._state is not SYNCING or not sent.same_round(self._epoch()):
            return STAY
        code = response.error_code
        name = error_for(code).name
        match code:
            case E.NONE:
                return self._synced(response, now)
            case E.REBALANCE_IN_PROGRESS:
                return self._rejoin(now, f"SyncGroup: {name}")
            case E.UNKNOWN_MEMBER_ID:
                return Step(Outcome.MEMBER_LOST, lost=f"SyncGroup: {name}", at=now, reason=name)
            case E.ILLEGAL_GENERATION:
                return Step(Outcome.GENERATION_LOST, lost=f"SyncGroup: {name}", at=now, reason=name)
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR:
                self._forget_coordinator(f"SyncGroup: {name}")
                return self._rejoin(now, name)
            case E.FENCED_INSTANCE_ID:
                return self._fence("SyncGroup")
        return self._fail(code, "SyncGroup failed")

    def _synced(self, response: SyncGroupResponse, now: float) -> Iterator[Step]:
        if response.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE) or (
            response.protocol_name is not None and response.protocol_name != self._protocol_name
        ):
            yield self._fail(
                E.INCONSISTENT_GROUP_PROTOCOL,
                f"SyncGroup answered protocol {response.protocol_type}/{response.protocol_name},"
                f" we joined with {CONSUMER_PROTOCOL_TYPE}/{self._protocol_name}",
            )
            return
        # An empty assignment is what a leader gives a member it assigned nothing.
        user_data: bytes | None = None
        assigned: frozenset[Partition] = frozenset()
        if response.assignment:
            try:
                payload = decode_assignment(response.assignment)
            except DecodeError as exc:
                error = RemoteProtocolError(
                    f"the leader's SyncGroup assignment is unreadable: {exc}"
                )
                yield self._fail_protocol(error)
                return
            assigned = frozenset(
                Partition(tp.topic, i) for tp in payload.assigned_partitions for i in tp.partitions
            )
            user_data = payload.user_data
        self._session_anchor = now
        stray = sorted({p.topic for p in assigned} - self._subscription)
        if stray:
            # Kafka's rule: an assignment outside the subscription is not applied; rejoin.
            yield self._rejoin(now, f"assigned topics {stray} we do not subscribe to")
            return
        revoked = self._owned - assigned
        if revoked:
            yield Step(
                Outcome.ASSIGNED_REVOKING,
                partitions=revoked,
                assignment=assigned,
                user_data=user_data,
            )
            return
        yield Step(Outcome.ASSIGNED, assignment=assigned, user_data=user_data)
        if self._rejoin_after_sync:
            yield self._rejoin(now, "the subscription changed during the rebalance")

    def _on_heartbeat_response(
        self, response: HeartbeatResponse, now: float, out: list[Output]
    ) -> Step:
        sent = self._take(HEARTBEAT, HeartbeatResponse)
        state = self._state
        current = sent.same_generation(self._epoch())
        if state in TERMINAL or state is UNJOINED:
            return STAY
        code = response.error_code
        if code in (E.NONE, E.REBALANCE_IN_PROGRESS):
            if current:
                # From when the heartbeat was sent, not answered: a driver stalled between
                # the two must not stretch the session past the coordinator's view of it.
                self._session_anchor = max(self._session_anchor, sent.sent_at)
            if code == E.REBALANCE_IN_PROGRESS and state is STABLE and current:
                return self._rejoin(now, "the group is rebalancing")
            return STAY
        if code in (E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            if not current:
                return STAY
            if code == E.FENCED_INSTANCE_ID:
                return self._fence("Heartbeat")
            return self._generation_lost(code, "Heartbeat", now)
        self._next_heartbeat_at = now + self._backoff()
        if code in _COORDINATOR_MOVED:
            self._forget_coordinator(f"Heartbeat: {error_for(code).name}")
            return STAY
        if code == E.GROUP_AUTHORIZATION_FAILED:
            return self._fail(code, "Heartbeat failed")
        return STAY  # Kafka retries other heartbeat errors after a backoff

    def _on_leave_response(
        self, response: LeaveGroupResponse, now: float, out: list[Output]
    ) -> Step:
        self._take(LEAVE, LeaveGroupResponse)
        code = response.error_code or next(
            (m.error_code for m in response.members if m.error_code), 0
        )
        return Step(Outcome.LEFT, report=Left(error_name=error_for(code).name if code else None))

    def _on_commit_response(
        self, response: OffsetCommitResponse, now: float, out: list[Output]
    ) -> Step:
        sent = self._take(COMMIT, OffsetCommitResponse)
        assert sent.commit is not None
        event, code = commit_answered(sent.commit, response)
        out.append(event)
        state = self._state
        if code == E.NONE or state in TERMINAL:
            return STAY
        current = sent.same_generation(self._epoch())
        match code:
            case E.GROUP_AUTHORIZATION_FAILED if state is not UNJOINED:
                return self._fail(code, "OffsetCommit failed")
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR | E.REQUEST_TIMED_OUT:
                self._forget_coordinator(f"OffsetCommit: {error_for(code).name}")
            case E.FENCED_INSTANCE_ID if current:
                return self._fence("OffsetCommit")
            case E.REBALANCE_IN_PROGRESS if state is STABLE:
                return self._rejoin(now, "OffsetCommit: REBALANCE_IN_PROGRESS")
            case E.UNKNOWN_MEMBER_ID | E.ILLEGAL_GENERATION if current:
                return self._generation_lost(code, "OffsetCommit", now)
        return STAY

    def _on_fetch_response(
        self, response: OffsetFetchResponse, now: float, out: list[Output]
    ) -> Step:
        sent = self._take(FETCH, OffsetFetchResponse)
        event, code = fetch_answered(response, self.config.group_id, sent.partitions)
        out.append(event)
        if not code or self._state in TERMINAL:
            return STAY
        if code in _COORDINATOR_MOVED:
            self._forget_coordinator(f"OffsetFetch: {error_for(code).name}")
        elif code == E.GROUP_AUTHORIZATION_FAILED:
            return self._fail(code, "OffsetFetch failed")
        return STAY
