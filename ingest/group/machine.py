"""The consumer-group membership state machine (classic protocol), sans I/O.

``GroupMachine.handle(input, now)`` applies one input and returns what to do
next: requests to send to the coordinator, lookups and metadata the driver
must provide, and events for the application. It reads no clock (``now`` is
passed in, monotonic seconds), opens no socket and starts no thread.

Every accepted (state, input type) pair is a row of ``TRANSITIONS`` below,
with the states it may lead to; any other pair raises ``InvalidTransition``.
Handlers follow Kafka's AbstractCoordinator and ConsumerCoordinator: which
errors rejoin at once, which back off, which reset the member id, which lose
the partitions and which are fatal.

Requests go out from one place, ``_pump``, after every input: the coordinator
lookup when needed, the JoinGroup when due, and heartbeats (at most one in
flight) every ``heartbeat_interval_ms`` while a member of a generation.
Responses of one API must be fed back in the order their requests were sent;
each is matched to the oldest request of its API still in flight, and one
sent for a round or generation that has since been abandoned is ignored.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ingest.errors import DecodeError
from ingest.group.assignors import MemberAssignment, MemberSubscription
from ingest.group.config import GroupConfig
from ingest.group.events import (
    Commit,
    CommitFailed,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    Fatal,
    Fenced,
    FetchCommitted,
    FindCoordinator,
    Input,
    Leave,
    Left,
    MetadataUpdate,
    NeedMetadata,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    Output,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RequestFailed,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.group.requests import (
    CONSUMER_PROTOCOL_TYPE,
    STATIC_JOIN_VERSION,
    commit_error,
    encode_member_assignment,
    fetch_outcome,
    heartbeat_request,
    join_group_request,
    leave_group_request,
    offset_commit_request,
    offset_fetch_request,
    sync_group_request,
)
from ingest.group.types import InvalidTransition, MemberState, Partition, RebalanceProtocol
from ingest.protocol.consumer import decode_assignment, decode_subscription
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    LeaveGroupResponse,
    OffsetCommitRequest,
    OffsetCommitResponse,
    OffsetFetchRequest,
    OffsetFetchResponse,
    SyncGroupRequest,
    SyncGroupResponse,
)
from ingest.protocol.schema import Request

__all__ = ["TRANSITIONS", "GroupMachine", "Transition"]

UNJOINED = MemberState.UNJOINED
JOINING = MemberState.JOINING
SYNCING = MemberState.SYNCING
STABLE = MemberState.STABLE
REVOKING = MemberState.REVOKING
LEAVING = MemberState.LEAVING
FENCED = MemberState.FENCED
FAILED = MemberState.FAILED
TERMINAL = frozenset({FENCED, FAILED})

JOIN = JoinGroupRequest.api_key
SYNC = SyncGroupRequest.api_key
HEARTBEAT = HeartbeatRequest.api_key
LEAVE = LeaveGroupRequest.api_key
COMMIT = OffsetCommitRequest.api_key
FETCH = OffsetFetchRequest.api_key

E = ErrorCode
_COORDINATOR_MOVED = {E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR}
_COMMIT_RETRIABLE = {
    E.COORDINATOR_LOAD_IN_PROGRESS,
    E.UNKNOWN_TOPIC_OR_PARTITION,
    E.COORDINATOR_NOT_AVAILABLE,
    E.NOT_COORDINATOR,
    E.REQUEST_TIMED_OUT,
}
_LOOKUP_FATAL = {E.GROUP_AUTHORIZATION_FAILED, E.INVALID_REQUEST, E.INVALID_GROUP_ID}


@dataclass
class _Sent:
    """What we need to know about a request when its response comes back."""

    round: int
    generation_id: int
    member_id: str
    commit: Commit | None = None
    partitions: frozenset[Partition] = frozenset()
    sent_at: float = -math.inf  # heartbeats only


class _After(Enum):
    REJOIN = "rejoin"
    LEAVE = "leave"


class GroupMachine:
    """One consumer's membership in one group. See the module docstring."""

    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.protocol = config.rebalance_protocol
        self._state = UNJOINED
        self._subscription: frozenset[str] = frozenset()
        self._coordinator: CoordinatorFound | None = None
        self._lookup_pending = False
        self._lookup_retry_at = -math.inf
        self._lookup_reason = "no coordinator known yet"
        self._member_id = ""
        self._generation_id = -1
        # The generation whose SyncGroup gave us what we own. The subscription carries this,
        # not the latest JoinGroup's generation: it is what the assignor needs to rank stale
        # claims, and it keeps the subscription unchanged across rejoins that change nothing
        # (a broker may start a new generation for every changed subscription).
        self._owned_generation = -1
        self._protocol_name: str | None = None
        self._leader_id = ""
        # A "round" is one attempt to join and sync; abandoning it makes its responses stale.
        self._round = 0
        self._join_due = False
        self._join_retry_at = -math.inf
        self._join_reason = ""
        self._rejoin_after_sync = False
        self._owned: frozenset[Partition] = frozenset()
        self._revoking: frozenset[Partition] = frozenset()
        self._revocations_pending = 0
        self._after_revocation = _After.REJOIN
        self._leave_force = False
        self._leave_reason = ""
        self._retained_user_data: bytes | None = None
        self._retained_protocol: str | None = None
        self._metadata: dict[str, int] = {}
        self._assigned_metadata: dict[str, int] | None = None
        self._leader_join: JoinGroupResponse | None = None
        self._session_anchor = -math.inf
        self._next_heartbeat_at = math.inf
        self._inflight: dict[int, deque[_Sent]] = {
            key: deque() for key in (JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH)
        }

    # -- public view ------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self._state

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def generation_id(self) -> int:
        return self._generation_id

    @property
    def is_leader(self) -> bool:
        return bool(self._member_id) and self._leader_id == self._member_id

    @property
    def assignment(self) -> frozenset[Partition]:
        """Partitions this member consumes and may commit (those being revoked included)."""
        return self._owned | self._revoking

    @property
    def subscription(self) -> frozenset[str]:
        return self._subscription

    @property
    def coordinator(self) -> CoordinatorFound | None:
        return self._coordinator

    @property
    def retained_user_data(self) -> bytes | None:
        return self._retained_user_data

    def inflight(self, api_key: int) -> int:
        """How many requests of ``api_key`` await a response."""
        queue = self._inflight.get(api_key)
        return len(queue) if queue is not None else 0

    def next_deadline(self) -> float | None:
        """When a Tick would next do something (send, retry, expire); None when nothing waits."""
        if self._state in TERMINAL:
            return None
        times: list[float] = []
        if self._coordinator is None:
            if self._needs_coordinator() and not self._lookup_pending:
                times.append(self._lookup_retry_at)
        else:
            if self._state is JOINING and self._join_due and not self._inflight[JOIN]:
                times.append(self._join_retry_at)
            if self._heartbeating() and not self._inflight[HEARTBEAT]:
                times.append(self._next_heartbeat_at)
        if self._heartbeating():
            times.append(self._session_deadline())
        return min(times) if times else None

    # -- the one entry point ----------------------------------------------------------

    def handle(self, event: Input, now: float) -> list[Output]:
        """Apply ``event`` at time ``now``; return the outputs in the order to act on them."""
        entry = TRANSITIONS.get((self._state, type(event)))
        if entry is None:
            raise InvalidTransition(self._state, type(event))
        out: list[Output] = []
        before = self._state
        after = entry.handler(self, event, now, out)
        if after not in entry.targets:
            raise AssertionError(
                f"{entry.handler.__name__} moved {before.name} to {after.name}, "
                f"which the table does not allow"
            )
        self._state = after
        self._pump(now, out)
        return out

    # -- handlers: local commands -----------------------------------------------------

    def _on_subscribe(self, event: Subscribe, now: float, out: list[Output]) -> MemberState:
        state = self._state
        if event.topics == self._subscription and state is not UNJOINED:
            return state
        self._subscription = event.topics
        if state is UNJOINED:
            return self._start_joining(now, "subscribed")
        if state is STABLE:
            return self._rejoin(now, "the subscription changed", out)
        if state is REVOKING:
            if self.protocol is RebalanceProtocol.COOPERATIVE:
                dropped = frozenset(p for p in self._owned if p.topic not in event.topics)
                if dropped:
                    self._revoke(dropped, _After.REJOIN, out)
            return REVOKING
        # JOINING or SYNCING: the round in progress used the old subscription.
        if state is SYNCING or (self._inflight[JOIN] and not self._join_due):
            self._rejoin_after_sync = True
        return state

    def _on_leave(self, event: Leave, now: float, out: list[Output]) -> MemberState:
        state = self._state
        if state in TERMINAL:
            return state
        if state is LEAVING:
            self._leave_force = self._leave_force or event.force
            return LEAVING
        self._subscription = frozenset()
        if state is UNJOINED:
            out.append(Left())
            return UNJOINED
        self._abandon_round()
        self._rejoin_after_sync = False
        self._leave_force = event.force
        self._leave_reason = event.reason
        self._after_revocation = _After.LEAVE
        if self._owned:
            self._revoke(self._owned, _After.LEAVE, out)
        if self._revocations_pending:
            return LEAVING
        return self._finish_leaving(out)

    def _on_commit(self, event: Commit, now: float, out: list[Output]) -> MemberState:
        state = self._state

        def refuse(name: str, message: str, retriable: bool = False) -> MemberState:
            out.append(CommitFailed(event.offsets, event.metadata, None, name, retriable, message))
            return state

        if state in TERMINAL:
            return refuse("NOT_A_MEMBER", f"the member is {state.name}")
        if state in (JOINING, SYNCING):
            return refuse("REBALANCE_IN_PROGRESS", "commit after the rebalance completes")
        if not self._can_commit():
            return refuse("NOT_A_MEMBER", "the member is not in an active generation")
        not_owned = sorted(set(event.offsets) - self.assignment)
        if not_owned:
            names = ", ".join(str(p) for p in not_owned)
            return refuse("NOT_ASSIGNED", f"this member does not own {names}")
        if not event.offsets:
            out.append(OffsetsCommitted(event.offsets, event.metadata))
            return state
        if self._coordinator is None:
            return refuse("COORDINATOR_UNKNOWN", "the coordinator is being looked up", True)
        version = self._coordinator.versions.offset_commit
        request = offset_commit_request(
            self.config,
            generation_id=self._generation_id,
            member_id=self._member_id,
            offsets=event.offsets,
            metadata=event.metadata,
            version=version,
        )
        self._send(out, request, version, commit=event)
        return state

    def _on_fetch_committed(
        self, event: FetchCommitted, now: float, out: list[Output]
    ) -> MemberState:
        state = self._state
        if not event.partitions:
            out.append(OffsetsFetched({}))
            return state
        if state in TERMINAL or self._coordinator is None:
            retriable = state not in TERMINAL
            message = "the coordinator is being looked up" if retriable else state.name
            name = "COORDINATOR_UNKNOWN" if retriable else "NOT_A_MEMBER"
            out.append(OffsetFetchFailed(event.partitions, None, name, retriable, message))
            return state
        version = self._coordinator.versions.offset_fetch
        request = offset_fetch_request(self.config.group_id, event.partitions, version=version)
        self._send(out, request, version, partitions=event.partitions)
        return state

    def _on_revocation_done(
        self, event: RevocationDone, now: float, out: list[Output]
    ) -> MemberState:
        state = self._state
        if self._revocations_pending == 0:
            raise InvalidTransition(state, RevocationDone, "no PartitionsRevoked awaits it")
        self._revocations_pending -= 1
        if self._revocations_pending:
            return state
        self._revoking = frozenset()
        if state is REVOKING:
            return self._start_joining(now, "revoked partitions")
        if state is LEAVING:
            return self._finish_leaving(out)
        return state

    def _on_tick(self, event: Tick, now: float, out: list[Output]) -> MemberState:
        state = self._state
        if self._heartbeating() and now >= self._session_deadline():
            self._lose("no heartbeat answer within the session timeout", out)
            self._reset_generation(reset_member_id=False)
            self._coordinator_unknown("session timed out without a heartbeat answer")
            if state in (SYNCING, STABLE):
                return self._rejoin(now, "session timed out", out)
        return state

    # -- handlers: driver reports -----------------------------------------------------

    def _on_metadata(self, event: MetadataUpdate, now: float, out: list[Output]) -> MemberState:
        self._metadata.update(event.partitions_per_topic)
        state = self._state
        if state is SYNCING and self._leader_join is not None:
            return self._lead(now, out)
        if state is STABLE and self.is_leader and self._assigned_metadata is not None:
            changed = sorted(
                t for t, n in self._assigned_metadata.items() if self._metadata.get(t, n) != n
            )
            if changed:
                return self._rejoin(now, f"partition counts changed for {changed}", out)
        return state

    def _on_coordinator_found(
        self, event: CoordinatorFound, now: float, out: list[Output]
    ) -> MemberState:
        state = self._state
        self._lookup_pending = False
        if state in TERMINAL:
            return state
        if self.config.is_static and event.versions.join_group < STATIC_JOIN_VERSION:
            return self._fail(
                E.UNSUPPORTED_VERSION,
                f"static membership (group_instance_id) needs JoinGroup v{STATIC_JOIN_VERSION}+;"
                f" the coordinator does v{event.versions.join_group}",
                out,
            )
        self._coordinator = event
        return state

    def _on_lookup_failed(
        self, event: CoordinatorLookupFailed, now: float, out: list[Output]
    ) -> MemberState:
        state = self._state
        if not self._lookup_pending:
            raise InvalidTransition(state, CoordinatorLookupFailed, "no lookup was asked for")
        self._lookup_pending = False
        code = event.error_code
        if code in _LOOKUP_FATAL and state not in TERMINAL:
            return self._fail(code, f"FindCoordinator failed: {event.message}", out)
        self._lookup_retry_at = now + self._backoff()
        return state

    def _on_coordinator_lost(
        self, event: CoordinatorLost, now: float, out: list[Output]
    ) -> MemberState:
        self._coordinator_unknown(event.reason or "the coordinator connection was lost")
        state = self._state
        for api_key, queue in self._inflight.items():
            while queue:
                state = self._request_failed(
                    api_key, queue.popleft(), state, now, event.reason, out
                )
        if state is SYNCING:  # the leader was waiting for metadata: this round cannot finish
            state = self._rejoin(now, "the coordinator was lost during the rebalance", out)
        return state

    def _on_request_failed(
        self, event: RequestFailed, now: float, out: list[Output]
    ) -> MemberState:
        sent = self._take(event.api_key, RequestFailed)
        self._coordinator_unknown(event.reason or "a request to the coordinator failed")
        return self._request_failed(event.api_key, sent, self._state, now, event.reason, out)

    def _request_failed(
        self,
        api_key: int,
        sent: _Sent,
        state: MemberState,
        now: float,
        reason: str,
        out: list[Output],
    ) -> MemberState:
        message = reason or "no response from the coordinator"
        current = sent.round == self._round
        if api_key == JOIN and state is JOINING and current:
            self._join_due = True
            self._join_retry_at = now + self._backoff()
        elif api_key == SYNC and state is SYNCING and current:
            return self._rejoin(now, f"SyncGroup failed: {message}", out)
        elif api_key == HEARTBEAT:
            self._next_heartbeat_at = now + self._backoff()
        elif api_key == COMMIT and sent.commit is not None:
            commit = sent.commit
            out.append(
                CommitFailed(commit.offsets, commit.metadata, None, "REQUEST_FAILED", True, message)
            )
        elif api_key == FETCH:
            out.append(OffsetFetchFailed(sent.partitions, None, "REQUEST_FAILED", True, message))
        elif api_key == LEAVE and state is LEAVING:
            out.append(Left(error_name="REQUEST_FAILED"))
            return UNJOINED
        return state

    # -- handlers: coordinator responses ----------------------------------------------

    def _on_join_response(
        self, response: JoinGroupResponse, now: float, out: list[Output]
    ) -> MemberState:
        sent = self._take(JOIN, JoinGroupResponse)
        if self._state is not JOINING or sent.round != self._round:
            return self._state
        code = response.error_code
        if code == E.NONE:
            if response.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE):
                return self._fail(
                    E.INCONSISTENT_GROUP_PROTOCOL,
                    f"JoinGroup: protocol type {response.protocol_type!r}, "
                    f"expected {CONSUMER_PROTOCOL_TYPE!r}",
                    out,
                )
            name = response.protocol_name
            if name is None or self.config.assignor(name) is None:
                offered = [a.name for a in self.config.assignors]
                return self._fail(
                    E.INCONSISTENT_GROUP_PROTOCOL,
                    f"JoinGroup: the coordinator chose assignor {name!r}; we offered {offered}",
                    out,
                )
            self._generation_id = response.generation_id
            self._member_id = response.member_id
            self._protocol_name = name
            self._leader_id = response.leader
            self._session_anchor = now
            self._next_heartbeat_at = now + self.config.heartbeat_interval_ms / 1000
            if self.is_leader and not response.skip_assignment:
                self._leader_join = response
                return self._lead(now, out)
            return self._send_sync({}, now, out)
        if code == E.MEMBER_ID_REQUIRED:
            self._member_id = response.member_id
            return self._start_joining(now, "the coordinator gave us a member id")
        if code == E.UNKNOWN_MEMBER_ID:
            if sent.member_id == self._member_id:
                self._lose("JoinGroup: UNKNOWN_MEMBER_ID", out)
                self._reset_generation(reset_member_id=True)
            return self._start_joining(now, "UNKNOWN_MEMBER_ID")
        if code == E.REBALANCE_IN_PROGRESS:
            return self._start_joining(now, "REBALANCE_IN_PROGRESS")
        if code == E.COORDINATOR_LOAD_IN_PROGRESS:
            return self._start_joining(now + self._backoff(), "COORDINATOR_LOAD_IN_PROGRESS")
        if code in _COORDINATOR_MOVED:
            self._coordinator_unknown(f"JoinGroup: {error_for(code).name}")
            return self._start_joining(now, error_for(code).name)
        if code == E.FENCED_INSTANCE_ID:
            return self._fence("JoinGroup", out)
        return self._fail(code, "JoinGroup failed", out)

    def _on_sync_response(
        self, response: SyncGroupResponse, now: float, out: list[Output]
    ) -> MemberState:
        sent = self._take(SYNC, SyncGroupResponse)
        if self._state is not SYNCING or sent.round != self._round:
            return self._state
        code = response.error_code
        if code == E.NONE:
            return self._on_synced(response, now, out)
        if code == E.REBALANCE_IN_PROGRESS:
            return self._rejoin(now, "SyncGroup: REBALANCE_IN_PROGRESS", out)
        if code in (E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION):
            name = error_for(code).name
            self._lose(f"SyncGroup: {name}", out)
            self._reset_generation(reset_member_id=code == E.UNKNOWN_MEMBER_ID)
            return self._rejoin(now, name, out)
        if code in _COORDINATOR_MOVED:
            self._coordinator_unknown(f"SyncGroup: {error_for(code).name}")
            return self._rejoin(now, error_for(code).name, out)
        if code == E.FENCED_INSTANCE_ID:
            return self._fence("SyncGroup", out)
        return self._fail(code, "SyncGroup failed", out)

    def _on_synced(self, response: SyncGroupResponse, now: float, out: list[Output]) -> MemberState:
        if response.protocol_type not in (None, CONSUMER_PROTOCOL_TYPE) or (
            response.protocol_name is not None and response.protocol_name != self._protocol_name
        ):
            return self._fail(
                E.INCONSISTENT_GROUP_PROTOCOL,
                f"SyncGroup answered protocol {response.protocol_type}/{response.protocol_name},"
                f" we joined with {CONSUMER_PROTOCOL_TYPE}/{self._protocol_name}",
                out,
            )
        # An empty assignment is what a leader gives a member it assigned nothing.
        user_data: bytes | None = None
        assigned: frozenset[Partition] = frozenset()
        if response.assignment:
            try:
                payload = decode_assignment(response.assignment)
            except DecodeError as exc:
                return self._fail(E.NONE, f"SyncGroup assignment is unreadable: {exc}", out)
            assigned = frozenset(
                Partition(tp.topic, i) for tp in payload.assigned_partitions for i in tp.partitions
            )
            user_data = payload.user_data
        self._session_anchor = now
        stray = sorted({p.topic for p in assigned} - self._subscription)
        if stray:
            # Kafka's rule: an assignment outside the subscription is not applied; rejoin.
            return self._rejoin(now, f"assigned topics {stray} we do not subscribe to", out)
        self._retained_user_data = user_data
        self._retained_protocol = self._protocol_name
        revoked = self._owned - assigned
        added = assigned - self._owned
        if revoked:
            self._revoke(revoked, _After.REJOIN, out)
        self._owned = assigned
        self._owned_generation = self._generation_id
        out.append(PartitionsAssigned(added, assigned, self._generation_id, self._member_id))
        if revoked:
            return REVOKING
        if self._rejoin_after_sync:
            return self._rejoin(now, "the subscription changed during the rebalance", out)
        return STABLE

    def _on_heartbeat_response(
        self, response: HeartbeatResponse, now: float, out: list[Output]
    ) -> MemberState:
        sent = self._take(HEARTBEAT, HeartbeatResponse)
        state = self._state
        stale = sent.generation_id != self._generation_id or sent.member_id != self._member_id
        if state in TERMINAL or state is UNJOINED:
            return state
        code = response.error_code
        if code in (E.NONE, E.REBALANCE_IN_PROGRESS):
            if not stale:
                # From when the heartbeat was sent, not answered: a driver stalled between
                # the two must not stretch the session past the coordinator's view of it.
                self._session_anchor = max(self._session_anchor, sent.sent_at)
            if code == E.REBALANCE_IN_PROGRESS and state is STABLE and not stale:
                return self._rejoin(now, "the group is rebalancing", out)
            return state
        if code in (E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            if stale:
                return state
            if code == E.FENCED_INSTANCE_ID:
                return self._fence("Heartbeat", out)
            return self._reset_and_rejoin(code, "Heartbeat", now, out)
        self._next_heartbeat_at = now + self._backoff()
        if code in _COORDINATOR_MOVED:
            self._coordinator_unknown(f"Heartbeat: {error_for(code).name}")
            return state
        if code == E.GROUP_AUTHORIZATION_FAILED:
            return self._fail(code, "Heartbeat failed", out)
        return state  # Kafka retries other heartbeat errors after a backoff

    def _on_leave_response(
        self, response: LeaveGroupResponse, now: float, out: list[Output]
    ) -> MemberState:
        self._take(LEAVE, LeaveGroupResponse)
        code = response.error_code or next(
            (m.error_code for m in response.members if m.error_code), 0
        )
        out.append(Left(error_name=error_for(code).name if code else None))
        return UNJOINED

    def _on_commit_response(
        self, response: OffsetCommitResponse, now: float, out: list[Output]
    ) -> MemberState:
        sent = self._take(COMMIT, OffsetCommitResponse)
        commit = sent.commit
        assert commit is not None
        state = self._state
        code = commit_error(response)
        if code == E.NONE:
            out.append(OffsetsCommitted(commit.offsets, commit.metadata))
            return state
        info = error_for(code)
        out.append(
            CommitFailed(
                commit.offsets,
                commit.metadata,
                code,
                info.name,
                code in _COMMIT_RETRIABLE,
                info.description,
            )
        )
        if state in TERMINAL:
            return state
        unchanged = sent.generation_id == self._generation_id and sent.member_id == self._member_id
        if code == E.GROUP_AUTHORIZATION_FAILED:
            return self._fail(code, "OffsetCommit failed", out)
        if code in _COORDINATOR_MOVED or code == E.REQUEST_TIMED_OUT:
            self._coordinator_unknown(f"OffsetCommit: {info.name}")
        elif code == E.FENCED_INSTANCE_ID and unchanged:
            return self._fence("OffsetCommit", out)
        elif code == E.REBALANCE_IN_PROGRESS and state is STABLE:
            return self._rejoin(now, "OffsetCommit: REBALANCE_IN_PROGRESS", out)
        elif code in (E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION) and unchanged:
            return self._reset_and_rejoin(code, "OffsetCommit", now, out)
        return state

    def _on_fetch_response(
        self, response: OffsetFetchResponse, now: float, out: list[Output]
    ) -> MemberState:
        sent = self._take(FETCH, OffsetFetchResponse)
        state = self._state
        outcome = fetch_outcome(response, self.config.group_id, sent.partitions)
        if not outcome.error_code:
            out.append(OffsetsFetched(outcome.offsets))
            return state
        code = outcome.error_code
        info = error_for(code)
        message = f"{info.description} {outcome.detail}".strip()
        out.append(OffsetFetchFailed(sent.partitions, code, info.name, outcome.retriable, message))
        if state in TERMINAL:
            return state
        if code in _COORDINATOR_MOVED:
            self._coordinator_unknown(f"OffsetFetch: {info.name}")
        elif code == E.GROUP_AUTHORIZATION_FAILED:
            return self._fail(code, "OffsetFetch failed", out)
        return state

    # -- transitions shared by handlers -----------------------------------------------

    def _start_joining(self, at: float, reason: str) -> MemberState:
        """Enter JOINING; ``_pump`` sends the JoinGroup at ``at`` once the coordinator is known."""
        self._round += 1
        self._leader_join = None
        self._join_due = True
        self._join_retry_at = at
        self._join_reason = reason
        return JOINING

    def _rejoin(self, now: float, reason: str, out: list[Output]) -> MemberState:
        """Rejoin as Kafka's onJoinPrepare does: eager revokes all, cooperative what is unsubscribed."""
        if self.protocol is RebalanceProtocol.EAGER:
            revoke = self._owned
        else:
            revoke = frozenset(p for p in self._owned if p.topic not in self._subscription)
        if revoke:
            self._abandon_round()
            self._revoke(revoke, _After.REJOIN, out)
            return REVOKING
        if self._revocations_pending:
            self._abandon_round()
            return REVOKING
        return self._start_joining(now, reason)

    def _reset_and_rejoin(self, code: int, api: str, now: float, out: list[Output]) -> MemberState:
        """ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID for our current generation: partitions are lost."""
        name = error_for(code).name
        self._lose(f"{api}: {name}", out)
        # Kafka keeps the member id on ILLEGAL_GENERATION: it may still be valid.
        self._reset_generation(reset_member_id=code == E.UNKNOWN_MEMBER_ID)
        if self._state in (REVOKING, LEAVING):
            return self._state  # rejoins or leaves once the driver confirms revocation
        return self._rejoin(now, f"{api}: {name}", out)

    def _revoke(self, partitions: frozenset[Partition], after: _After, out: list[Output]) -> None:
        out.append(PartitionsRevoked(partitions))
        self._owned -= partitions
        self._revoking |= partitions
        self._revocations_pending += 1
        if self._after_revocation is not _After.LEAVE:
            self._after_revocation = after

    def _lose(self, reason: str, out: list[Output]) -> None:
        lost = self._owned | self._revoking
        if lost:
            out.append(PartitionsLost(lost, reason))
        self._owned = frozenset()
        self._owned_generation = -1
        self._revoking = frozenset()

    def _reset_generation(self, *, reset_member_id: bool) -> None:
        self._generation_id = -1
        self._protocol_name = None
        self._leader_id = ""
        self._assigned_metadata = None
        if reset_member_id:
            self._member_id = ""

    def _abandon_round(self) -> None:
        self._round += 1
        self._leader_join = None
        self._join_due = False

    def _finish_leaving(self, out: list[Output]) -> MemberState:
        """Send LeaveGroup if we should and can; either way the member is reset."""
        self._after_revocation = _After.REJOIN
        member_id = self._member_id
        self._reset_generation(reset_member_id=True)
        self._owned = frozenset()
        send = self.config.sends_leave_group or self._leave_force
        if send and member_id and self._coordinator is not None:
            version = self._coordinator.versions.leave_group
            request = leave_group_request(
                self.config, member_id=member_id, reason=self._leave_reason, version=version
            )
            self._send(out, request, version)
            return LEAVING
        out.append(Left())
        return UNJOINED

    def _fence(self, api: str, out: list[Output]) -> MemberState:
        reason = (
            f"{api}: FENCED_INSTANCE_ID: another consumer joined with group.instance.id "
            f"{self.config.group_instance_id!r}"
        )
        self._lose(reason, out)
        self._stop()
        out.append(Fenced(reason))
        return FENCED

    def _fail(self, code: int, context: str, out: list[Output]) -> MemberState:
        info = error_for(code)
        if code == E.GROUP_AUTHORIZATION_FAILED:
            message = f"{context}: not authorized to use group {self.config.group_id!r}"
        elif code == E.NONE:
            message = context
        else:
            message = f"{context}: {info.name}: {info.description}"
        self._lose(message, out)
        self._stop()
        out.append(Fatal(code if code else None, info.name if code else "PROTOCOL_ERROR", message))
        return FAILED

    def _stop(self) -> None:
        self._abandon_round()
        self._reset_generation(reset_member_id=True)

    def _coordinator_unknown(self, reason: str) -> None:
        if self._coordinator is not None:
            self._lookup_reason = reason
        self._coordinator = None

    # -- the leader's assignment --------------------------------------------------------

    def _lead(self, now: float, out: list[Output]) -> MemberState:
        response = self._leader_join
        assert response is not None and self._protocol_name is not None
        subscriptions: dict[str, MemberSubscription] = {}
        for member in response.members:
            try:
                payload = decode_subscription(member.metadata)
            except DecodeError as exc:
                return self._fail(
                    E.NONE, f"member {member.member_id} sent an unreadable subscription: {exc}", out
                )
            subscriptions[member.member_id] = MemberSubscription(
                topics=frozenset(payload.topics),
                owned_partitions=frozenset(
                    Partition(tp.topic, i) for tp in payload.owned_partitions for i in tp.partitions
                ),
                generation_id=payload.generation_id,
                group_instance_id=member.group_instance_id,
                user_data=payload.user_data,
            )
        group_topics = {t for s in subscriptions.values() for t in s.topics}
        missing = frozenset(t for t in group_topics if t not in self._metadata)
        if missing:
            out.append(NeedMetadata(missing))
            return SYNCING
        counts = {t: self._metadata[t] for t in sorted(group_topics)}
        assignor = self.config.assignor(self._protocol_name)
        assert assignor is not None
        retained = (
            self._retained_user_data if self._retained_protocol == self._protocol_name else None
        )
        result = assignor.assign(
            subscriptions, counts, generation_id=self._generation_id, retained_user_data=retained
        )
        assignments = {m: result.get(m, MemberAssignment()) for m in subscriptions}
        if self.protocol is RebalanceProtocol.COOPERATIVE:
            problem = _cooperative_violation(subscriptions, assignments)
            if problem:
                return self._fail(E.NONE, f"assignor {assignor.name}: {problem}", out)
        self._assigned_metadata = counts
        self._leader_join = None
        encoded = {m: encode_member_assignment(a) for m, a in assignments.items()}
        return self._send_sync(encoded, now, out)

    # -- sending ----------------------------------------------------------------------

    def _send(
        self,
        out: list[Output],
        request: Request,
        version: int,
        *,
        commit: Commit | None = None,
        partitions: frozenset[Partition] = frozenset(),
        sent_at: float = -math.inf,
    ) -> None:
        sent = _Sent(self._round, self._generation_id, self._member_id, commit, partitions, sent_at)
        self._inflight[type(request).api_key].append(sent)
        out.append(SendRequest(request, version))

    def _send_sync(
        self, assignments: dict[str, bytes], now: float, out: list[Output]
    ) -> MemberState:
        if self._coordinator is None:
            # Lost the coordinator between JoinGroup and SyncGroup: Kafka's sync would fail too.
            return self._rejoin(now, "the coordinator was lost before SyncGroup", out)
        versions = self._coordinator.versions
        request = sync_group_request(
            self.config,
            generation_id=self._generation_id,
            member_id=self._member_id,
            protocol_name=self._protocol_name,
            assignments=assignments,
            version=versions.sync_group,
        )
        self._send(out, request, versions.sync_group)
        return SYNCING

    def _pump(self, now: float, out: list[Output]) -> None:
        """Send what is due in the current state; never changes the state."""
        if self._state in TERMINAL:
            return
        coordinator = self._coordinator
        if coordinator is None:
            due = now >= self._lookup_retry_at
            if self._needs_coordinator() and not self._lookup_pending and due:
                self._lookup_pending = True
                out.append(FindCoordinator(self._lookup_reason))
            return
        versions = coordinator.versions
        if (
            self._state is JOINING
            and self._join_due
            and not self._inflight[JOIN]
            and now >= self._join_retry_at
        ):
            self._join_due = False
            self._rejoin_after_sync = False
            request = join_group_request(
                self.config,
                member_id=self._member_id,
                topics=self._subscription,
                owned=self._owned,
                generation_id=self._owned_generation,
                reason=self._join_reason,
                version=versions.join_group,
            )
            self._send(out, request, versions.join_group)
        if (
            self._heartbeating()
            and not self._inflight[HEARTBEAT]
            and now >= self._next_heartbeat_at
        ):
            request_hb = heartbeat_request(
                self.config,
                generation_id=self._generation_id,
                member_id=self._member_id,
                version=versions.heartbeat,
            )
            self._send(out, request_hb, versions.heartbeat, sent_at=now)
            self._next_heartbeat_at = now + self.config.heartbeat_interval_ms / 1000

    # -- small predicates -------------------------------------------------------------

    def _take(self, api_key: int, input_type: type) -> _Sent:
        queue = self._inflight.get(api_key)
        if not queue:
            raise InvalidTransition(self._state, input_type, "no such request is in flight")
        return queue.popleft()

    def _backoff(self) -> float:
        return self.config.retry_backoff_ms / 1000

    def _session_deadline(self) -> float:
        return self._session_anchor + self.config.session_timeout_ms / 1000

    def _in_generation(self) -> bool:
        return self._generation_id >= 0 and bool(self._member_id)

    def _heartbeating(self) -> bool:
        state = self._state
        member = state in (SYNCING, STABLE, REVOKING) or (
            state is LEAVING and self._revocations_pending > 0
        )
        return member and self._in_generation()

    def _can_commit(self) -> bool:
        state = self._state
        active = state in (STABLE, REVOKING) or (state is LEAVING and self._revocations_pending > 0)
        return active and self._in_generation()

    def _needs_coordinator(self) -> bool:
        return self._state in (JOINING, SYNCING, STABLE, REVOKING) or self._heartbeating()


def _cooperative_violation(
    subscriptions: dict[str, MemberSubscription], assignments: dict[str, MemberAssignment]
) -> str:
    """Kafka's validateCooperativeAssignment: nothing moves owner within one rebalance."""
    owners: dict[Partition, str] = {}
    for member, subscription in subscriptions.items():
        for partition in subscription.owned_partitions:
            owners[partition] = member
    for member, assignment in assignments.items():
        for partition in assignment.partitions:
            owner = owners.get(partition)
            if owner is not None and owner != member:
                return f"{partition} moves from {owner} to {member} without being revoked first"
    return ""


# -- the transition table -------------------------------------------------------------

Handler = Callable[[GroupMachine, Any, float, list[Output]], MemberState]


@dataclass(frozen=True)
class Transition:
    handler: Handler
    targets: frozenset[MemberState]


def _row(
    input_type: type, handler: Handler, targets: dict[MemberState, Iterable[MemberState]]
) -> dict[tuple[MemberState, type], Transition]:
    return {
        (state, input_type): Transition(handler, frozenset(to)) for state, to in targets.items()
    }


def _stay(*states: MemberState) -> dict[MemberState, Iterable[MemberState]]:
    return {s: (s,) for s in states}


_ALL = tuple(MemberState)
_MEMBER_RESET = (JOINING, REVOKING, FENCED, FAILED)  # where a member goes on a reset/fence/fail

M = GroupMachine
#: (state, input type) -> handler and the states it may lead to. Nothing else is accepted.
TRANSITIONS: dict[tuple[MemberState, type], Transition] = {
    # local commands
    **_row(Subscribe, M._on_subscribe, {
        UNJOINED: (JOINING,),
        JOINING: (JOINING,),
        SYNCING: (SYNCING,),
        STABLE: (STABLE, JOINING, REVOKING),
        REVOKING: (REVOKING,),
    }),
    **_row(Leave, M._on_leave, {
        UNJOINED: (UNJOINED,),
        JOINING: (LEAVING, UNJOINED),
        SYNCING: (LEAVING, UNJOINED),
        STABLE: (LEAVING, UNJOINED),
        REVOKING: (LEAVING, UNJOINED),
        LEAVING: (LEAVING,),
        FENCED: (FENCED,),
        FAILED: (FAILED,),
    }),
    **_row(Commit, M._on_commit, _stay(*_ALL)),
    **_row(FetchCommitted, M._on_fetch_committed, _stay(*_ALL)),
    **_row(RevocationDone, M._on_revocation_done, {
        REVOKING: (REVOKING, JOINING),
        LEAVING: (LEAVING, UNJOINED),
        FENCED: (FENCED,),
        FAILED: (FAILED,),
    }),
    **_row(Tick, M._on_tick, {
        **_stay(UNJOINED, JOINING, REVOKING, LEAVING, FENCED, FAILED),
        SYNCING: (SYNCING, JOINING),
        STABLE: (STABLE, JOINING),
    }),
    # driver reports
    **_row(MetadataUpdate, M._on_metadata, {
        **_stay(UNJOINED, JOINING, REVOKING, LEAVING, FENCED, FAILED),
        SYNCING: (SYNCING, JOINING, REVOKING, FAILED),
        STABLE: (STABLE, JOINING, REVOKING),
    }),
    **_row(CoordinatorFound, M._on_coordinator_found, {
        **{s: (s, FAILED) for s in (UNJOINED, JOINING, SYNCING, STABLE, REVOKING, LEAVING)},
        **_stay(FENCED, FAILED),
    }),
    **_row(CoordinatorLookupFailed, M._on_lookup_failed, {
        **{s: (s, FAILED) for s in (UNJOINED, JOINING, SYNCING, STABLE, REVOKING, LEAVING)},
        **_stay(FENCED, FAILED),
    }),
    **_row(CoordinatorLost, M._on_coordinator_lost, {
        **_stay(UNJOINED, JOINING, STABLE, REVOKING, FENCED, FAILED),
        SYNCING: (SYNCING, JOINING, REVOKING),
        LEAVING: (LEAVING, UNJOINED),
    }),
    **_row(RequestFailed, M._on_request_failed, {
        **_stay(UNJOINED, JOINING, STABLE, REVOKING, FENCED, FAILED),
        SYNCING: (SYNCING, JOINING, REVOKING),
        LEAVING: (LEAVING, UNJOINED),
    }),
    # coordinator responses (each must match a request in flight)
    **_row(JoinGroupResponse, M._on_join_response, {
        **_stay(UNJOINED, SYNCING, STABLE, REVOKING, LEAVING, FENCED, FAILED),
        JOINING: (JOINING, SYNCING, FENCED, FAILED),
    }),
    **_row(SyncGroupResponse, M._on_sync_response, {
        **_stay(UNJOINED, JOINING, STABLE, REVOKING, LEAVING, FENCED, FAILED),
        SYNCING: (SYNCING, STABLE, *_MEMBER_RESET),
    }),
    **_row(HeartbeatResponse, M._on_heartbeat_response, {
        **_stay(UNJOINED, FENCED, FAILED),
        JOINING: (JOINING, REVOKING, FENCED, FAILED),
        SYNCING: (SYNCING, *_MEMBER_RESET),
        STABLE: (STABLE, *_MEMBER_RESET),
        REVOKING: (REVOKING, FENCED, FAILED),
        LEAVING: (LEAVING, FENCED, FAILED),
    }),
    **_row(LeaveGroupResponse, M._on_leave_response, {LEAVING: (UNJOINED,)}),
    **_row(OffsetCommitResponse, M._on_commit_response, {
        **_stay(UNJOINED, FENCED, FAILED),
        JOINING: (JOINING, REVOKING, FENCED, FAILED),
        SYNCING: (SYNCING, *_MEMBER_RESET),
        STABLE: (STABLE, *_MEMBER_RESET),
        REVOKING: (REVOKING, FENCED, FAILED),
        LEAVING: (LEAVING, FENCED, FAILED),
    }),
    **_row(OffsetFetchResponse, M._on_fetch_response, {
        **{s: (s, FAILED) for s in (UNJOINED, JOINING, SYNCING, STABLE, REVOKING, LEAVING)},
        **_stay(FENCED, FAILED),
    }),
}  # fmt: skip
