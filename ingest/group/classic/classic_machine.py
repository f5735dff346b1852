"""The classic protocol's membership state machine (JoinGroup, SyncGroup, Heartbeat), sans I/O.

``GroupMachine.handle(input, now)`` applies one input and returns what to do next:
requests to send, lookups and metadata the driver must provide, events for the
application. It reads no clock (``now`` is passed in), opens no socket, starts no thread.
The engine (``engine.py``) runs it with the tables of ``classic_transitions.py``: the
handlers here read each input and name the outcome, as Kafka's AbstractCoordinator and
ConsumerCoordinator do; the effects change the record (``classic_member.py``). Answers
of one API are matched to the oldest request in flight; one sent for a round or
generation since abandoned is set aside (``inflight.py``).
"""

from __future__ import annotations

from collections.abc import Iterator

from ingest.errors import RemoteProtocolError
from ingest.group import engine
from ingest.group.classic.classic_config import GroupConfig
from ingest.group.classic.classic_member import (
    EFFECTS,
    ClassicMember,
    fail_protocol,
    generation_lost,
)
from ingest.group.classic.classic_requests import (
    STATIC_JOIN_VERSION,
    join_protocol_error,
    read_assignment,
    sync_protocol_error,
)
from ingest.group.classic.classic_transitions import (
    JOINING,
    LEAVING,
    REVOKING,
    ROWS,
    STABLE,
    STAY,
    SYNCING,
    TERMINAL,
    TRANSITIONS,
    UNJOINED,
    Effect,
    Outcome,
    Step,
)
from ingest.group.commits import (
    commit_answer,
    commit_or_refuse,
    fetch_or_refuse,
    fetch_response,
    request_lost,
)
from ingest.group.coordination import COORDINATOR_MOVED, fail, fence
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    Input,
    Leave,
    Left,
    MetadataUpdate,
    Output,
    RequestFailed,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.group.inflight import HEARTBEAT, JOIN, LEAVE, SYNC, Sent
from ingest.group.types import InvalidTransition, MemberState, RebalanceProtocol
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
    SyncGroupResponse,
)
from ingest.protocol.partition import Partition

__all__ = ["HANDLERS", "GroupMachine"]

E = ErrorCode


class GroupMachine:
    """One consumer's membership in one group. See the module docstring."""

    def __init__(self, config: GroupConfig) -> None:
        self.config = config
        self.protocol = config.rebalance_protocol
        self._m = ClassicMember(config)

    def handle(self, event: Input, now: float) -> list[Output]:
        """Apply ``event`` at time ``now``; return the outputs in the order to act on them."""
        return _ENGINE.handle(self, self._m, event, now)

    # -- public view ------------------------------------------------------------------

    @property
    def state(self) -> MemberState:
        return self._m.state

    @property
    def member_id(self) -> str:
        return self._m.member_id

    @property
    def generation_id(self) -> int:
        return self._m.generation_id

    @property
    def is_leader(self) -> bool:
        return self._m.is_leader

    @property
    def assignment(self) -> frozenset[Partition]:
        """Partitions this member consumes and may commit (those being revoked included)."""
        return self._m.owned | self._m.revoking

    @property
    def subscription(self) -> frozenset[str]:
        return self._m.subscription

    @property
    def coordinator(self) -> CoordinatorFound | None:
        return self._m.link.found

    @property
    def retained_user_data(self) -> bytes | None:
        return self._m.leadership.retained

    @property
    def session_deadline(self) -> float | None:
        """When the session ends without a heartbeat answer (the partitions are then
        lost); None outside a session. An exchange answered later is worthless."""
        return self._m.session_deadline() if self._m.heartbeating() else None

    def inflight(self, api_key: int) -> int:
        """How many requests of ``api_key`` await a response."""
        return self._m.inflight(api_key)

    def next_deadline(self) -> float | None:
        """When a Tick would next do something (send, retry, expire); None when nothing waits."""
        return self._m.next_deadline()

    # -- outcomes shared by handlers --------------------------------------------------

    def _fence(self, api: str) -> Step:
        return fence(Outcome.FENCE, api, self.config.group_instance_id, "consumer")

    def _fail(self, code: int, context: str) -> Step:
        return fail(Outcome.FAIL, code, context, self.config.group_id)

    # -- handlers: local commands -----------------------------------------------------

    def _on_subscribe(self, event: Subscribe, now: float, out: list[Output]) -> Step:
        state = self._m.state
        if event.topics == self._m.subscription and state is not UNJOINED:
            return STAY
        self._m.subscription = event.topics
        if state is UNJOINED:
            return Step(Outcome.JOIN, at=now, reason="subscribed")
        if state is STABLE:
            return self._m.rejoin(now, "the subscription changed")
        if state is REVOKING:
            if self.protocol is RebalanceProtocol.COOPERATIVE:
                dropped = frozenset(p for p in self._m.owned if p.topic not in event.topics)
                if dropped:
                    return Step(Outcome.REVOKE_MORE, partitions=dropped)
            return STAY
        # JOINING or SYNCING: the round in progress used the old subscription.
        if state is SYNCING or (self._m.inflight(JOIN) and not self._m.join_due):
            return Step(Outcome.REJOIN_AFTER_SYNC)
        return STAY

    def _on_leave(self, event: Leave, now: float, out: list[Output]) -> Step:
        state = self._m.state
        if state in TERMINAL:
            return STAY
        if state is LEAVING:
            self._m.leave_force = self._m.leave_force or event.force
            return STAY
        self._m.subscription = frozenset()
        if state is UNJOINED:
            return Step(Outcome.LEFT, report=Left())
        self._m.rejoin_after_sync = False
        self._m.leave_force = event.force
        self._m.leave_reason = event.reason
        if self._m.owned:
            return Step(Outcome.REVOKE_THEN_LEAVE, partitions=self._m.owned)
        if self._m.revocations_pending:
            return Step(Outcome.LEAVE_AFTER_REVOCATION)
        return self._m.leave_now()

    def _on_commit(self, event: Commit, now: float, out: list[Output]) -> Step:
        m = self._m
        sent_or_answer = commit_or_refuse(
            m.link,
            event,
            m.state,
            active=m.can_commit(),
            assignment=self.assignment,
            identity=self.config,
            generation_id=m.generation_id,
            member_id=m.member_id,
            epoch=m.epoch(),
            generation=m.generation_id,
            leader_epochs=event.leader_epochs,
        )
        out.append(sent_or_answer)
        return STAY

    def _on_fetch_committed(self, event: FetchCommitted, now: float, out: list[Output]) -> Step:
        m = self._m
        out.append(fetch_or_refuse(m.link, event, m.state, self.config.group_id, m.epoch()))
        return STAY

    def _on_revocation_done(self, event: RevocationDone, now: float, out: list[Output]) -> Step:
        if self._m.revocations_pending == 0:
            raise InvalidTransition(self._m.state, RevocationDone, "no PartitionsRevoked awaits it")
        self._m.revocations_pending -= 1
        if self._m.revocations_pending:
            return STAY
        self._m.revoking = frozenset()
        if self._m.state is REVOKING:
            return Step(Outcome.JOIN, at=now, reason="revoked partitions")
        if self._m.state is LEAVING:
            return self._m.leave_now()
        return STAY

    def _on_tick(self, event: Tick, now: float, out: list[Output]) -> Step:
        if self._m.heartbeating() and now >= self._m.session_deadline():
            self._m.link.forget("session timed out without a heartbeat answer")
            return Step(
                Outcome.SESSION_EXPIRED,
                lost="no heartbeat answer within the session timeout",
                at=now,
                reason="session timed out",
            )
        counts = self._m.leadership.assigned_counts
        if (
            self._m.state is STABLE
            and self._m.is_leader
            and counts
            and now >= self._m.metadata_check_at
        ):
            self._m.metadata_check_at = now + self.config.metadata_refresh_ms / 1000
            return Step(Outcome.CHECK_METADATA, topics=frozenset(counts))
        return STAY

    # -- handlers: driver reports -----------------------------------------------------

    def _on_metadata(self, event: MetadataUpdate, now: float, out: list[Output]) -> Step:
        self._m.leadership.metadata.update(event.partitions_per_topic)
        state = self._m.state
        if state is SYNCING and self._m.leadership.pending is not None:
            return self._m.lead(now)
        if state is STABLE and self._m.is_leader:
            changed = self._m.leadership.changed_counts()
            if changed:
                return self._m.rejoin(now, f"partition counts changed for {changed}")
        return STAY

    def _on_coordinator_found(self, event: CoordinatorFound, now: float, out: list[Output]) -> Step:
        self._m.link.lookup_pending = False
        if self._m.state in TERMINAL:
            return STAY
        if self.config.is_static and event.versions.join_group < STATIC_JOIN_VERSION:
            return self._fail(
                E.UNSUPPORTED_VERSION,
                f"static membership (group_instance_id) needs JoinGroup v{STATIC_JOIN_VERSION}+;"
                f" the coordinator does v{event.versions.join_group}",
            )
        self._m.link.found = event
        return STAY

    def _on_lookup_failed(
        self, event: CoordinatorLookupFailed, now: float, out: list[Output]
    ) -> Step:
        m = self._m
        fatal = m.link.lookup_failed(event, m.state, now + m.backoff(), m.state in TERMINAL)
        if fatal is None:
            return STAY
        return self._fail(fatal, f"FindCoordinator failed: {event.message}")

    def _on_coordinator_lost(
        self, event: CoordinatorLost, now: float, out: list[Output]
    ) -> Iterator[Step]:
        for sent in self._m.link.lost(event.reason):
            yield self._request_failed(sent, now, event.reason, out)
        if self._m.state is SYNCING:
            # The leader was waiting for metadata: this round cannot finish.
            yield self._m.rejoin(now, "the coordinator was lost during the rebalance")

    def _on_request_failed(self, event: RequestFailed, now: float, out: list[Output]) -> Step:
        sent = self._m.link.failed(event, self._m.state)
        return self._request_failed(sent, now, event.reason, out)

    def _request_failed(self, sent: Sent, now: float, reason: str, out: list[Output]) -> Step:
        message = reason or "no response from the coordinator"
        state = self._m.state
        api_key = sent.api_key
        current = sent.same_round(self._m.epoch())
        if api_key == JOIN and state is JOINING and current:
            return Step(Outcome.RETRY_JOIN)
        if api_key == SYNC and state is SYNCING and current:
            return self._m.rejoin(now, f"SyncGroup failed: {message}")
        if api_key == HEARTBEAT:
            self._m.next_heartbeat_at = now + self._m.backoff()
        elif api_key == LEAVE and state is LEAVING:
            return Step(Outcome.LEFT, report=Left(error_name="REQUEST_FAILED"))
        lost = request_lost(sent, message)
        if lost is not None:
            out.append(lost)
        return STAY

    # -- handlers: the coordinator's answers -------------------------------------------

    def _on_join_response(self, response: JoinGroupResponse, now: float, out: list[Output]) -> Step:
        sent = self._m.link.take(JOIN, JoinGroupResponse, self._m.state)
        if self._m.state is not JOINING or not sent.same_round(self._m.epoch()):
            return STAY
        code = response.error_code
        name = error_for(code).name
        match code:
            case E.NONE:
                return self._joined(response, now)
            case E.MEMBER_ID_REQUIRED:
                self._m.member_id = response.member_id
                return Step(Outcome.JOIN, at=now, reason="the coordinator gave us a member id")
            case E.UNKNOWN_MEMBER_ID if sent.epoch.member_id == self._m.member_id:
                return Step(Outcome.MEMBER_LOST, lost=f"JoinGroup: {name}", at=now, reason=name)
            case E.UNKNOWN_MEMBER_ID | E.REBALANCE_IN_PROGRESS:
                return Step(Outcome.JOIN, at=now, reason=name)
            case E.COORDINATOR_LOAD_IN_PROGRESS:
                return Step(Outcome.JOIN, at=now + self._m.backoff(), reason=name)
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR:
                self._m.link.forget(f"JoinGroup: {name}")
                return Step(Outcome.JOIN, at=now, reason=name)
            case E.FENCED_INSTANCE_ID:
                return self._fence("JoinGroup")
        return self._fail(code, "JoinGroup failed")

    def _joined(self, response: JoinGroupResponse, now: float) -> Step:
        inconsistent = join_protocol_error(response, self.config)
        if inconsistent is not None:
            return self._fail(E.INCONSISTENT_GROUP_PROTOCOL, inconsistent)
        return self._m.joined(response, now)

    def _on_sync_response(
        self, response: SyncGroupResponse, now: float, out: list[Output]
    ) -> Step | Iterator[Step]:
        sent = self._m.link.take(SYNC, SyncGroupResponse, self._m.state)
        if self._m.state is not SYNCING or not sent.same_round(self._m.epoch()):
            return STAY
        code = response.error_code
        name = error_for(code).name
        match code:
            case E.NONE:
                return self._synced(response, now)
            case E.REBALANCE_IN_PROGRESS:
                return self._m.rejoin(now, f"SyncGroup: {name}")
            case E.UNKNOWN_MEMBER_ID:
                return Step(Outcome.MEMBER_LOST, lost=f"SyncGroup: {name}", at=now, reason=name)
            case E.ILLEGAL_GENERATION:
                return Step(Outcome.GENERATION_LOST, lost=f"SyncGroup: {name}", at=now, reason=name)
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR:
                self._m.link.forget(f"SyncGroup: {name}")
                return self._m.rejoin(now, name)
            case E.FENCED_INSTANCE_ID:
                return self._fence("SyncGroup")
        return self._fail(code, "SyncGroup failed")

    def _synced(self, response: SyncGroupResponse, now: float) -> Iterator[Step]:
        inconsistent = sync_protocol_error(response, self._m.protocol_name)
        if inconsistent is not None:
            yield self._fail(E.INCONSISTENT_GROUP_PROTOCOL, inconsistent)
            return
        try:
            assigned, user_data = read_assignment(response.assignment)
        except RemoteProtocolError as exc:
            yield fail_protocol(exc)
            return
        self._m.session_anchor = now
        yield from self._m.assigned(assigned, user_data, now)

    def _on_heartbeat_response(
        self, response: HeartbeatResponse, now: float, out: list[Output]
    ) -> Step:
        sent = self._m.link.take(HEARTBEAT, HeartbeatResponse, self._m.state)
        state = self._m.state
        current = sent.same_generation(self._m.epoch())
        if state in TERMINAL or state is UNJOINED:
            return STAY
        code = response.error_code
        if code in (E.NONE, E.REBALANCE_IN_PROGRESS):
            if current:
                # From when the heartbeat was sent, not answered: a driver stalled between
                # the two must not stretch the session past the coordinator's view of it.
                self._m.session_anchor = max(self._m.session_anchor, sent.sent_at)
            if code == E.REBALANCE_IN_PROGRESS and state is STABLE and current:
                return self._m.rejoin(now, "the group is rebalancing")
            return STAY
        if code in (E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            if not current:
                return STAY
            if code == E.FENCED_INSTANCE_ID:
                return self._fence("Heartbeat")
            return generation_lost(code, "Heartbeat", now)
        self._m.next_heartbeat_at = now + self._m.backoff()
        if code in COORDINATOR_MOVED:
            self._m.link.forget(f"Heartbeat: {error_for(code).name}")
            return STAY
        if code == E.GROUP_AUTHORIZATION_FAILED:
            return self._fail(code, "Heartbeat failed")
        return STAY  # Kafka retries other heartbeat errors after a backoff

    def _on_leave_response(
        self, response: LeaveGroupResponse, now: float, out: list[Output]
    ) -> Step:
        self._m.link.take(LEAVE, LeaveGroupResponse, self._m.state)
        code = response.error_code or next(
            (m.error_code for m in response.members if m.error_code), 0
        )
        return Step(Outcome.LEFT, report=Left(error_name=error_for(code).name if code else None))

    def _on_commit_response(
        self, response: OffsetCommitResponse, now: float, out: list[Output]
    ) -> Step:
        event, code, sent = commit_answer(self._m.link, response, self._m.state)
        out.append(event)
        state = self._m.state
        if code == E.NONE or state in TERMINAL:
            return STAY
        current = sent.same_generation(self._m.epoch())
        match code:
            case E.GROUP_AUTHORIZATION_FAILED if state is not UNJOINED:
                return self._fail(code, "OffsetCommit failed")
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR | E.REQUEST_TIMED_OUT:
                self._m.link.forget(f"OffsetCommit: {error_for(code).name}")
            case E.FENCED_INSTANCE_ID if current:
                return self._fence("OffsetCommit")
            case E.REBALANCE_IN_PROGRESS if state is STABLE:
                return self._m.rejoin(now, "OffsetCommit: REBALANCE_IN_PROGRESS")
            case E.UNKNOWN_MEMBER_ID | E.ILLEGAL_GENERATION if current:
                return generation_lost(code, "OffsetCommit", now)
        return STAY

    def _on_fetch_response(
        self, response: OffsetFetchResponse, now: float, out: list[Output]
    ) -> Step:
        m = self._m
        terminal = m.state in TERMINAL
        event, fatal = fetch_response(m.link, response, self.config.group_id, m.state, terminal)
        out.append(event)
        return self._fail(fatal, "OffsetFetch failed") if fatal else STAY


Handler = engine.Handler[GroupMachine, Output]

#: input type -> the handler naming its outcome (``ACCEPTS`` says where it is accepted).
HANDLERS: dict[type, Handler] = {
    Subscribe: GroupMachine._on_subscribe,
    Leave: GroupMachine._on_leave,
    Commit: GroupMachine._on_commit,
    FetchCommitted: GroupMachine._on_fetch_committed,
    RevocationDone: GroupMachine._on_revocation_done,
    Tick: GroupMachine._on_tick,
    MetadataUpdate: GroupMachine._on_metadata,
    CoordinatorFound: GroupMachine._on_coordinator_found,
    CoordinatorLookupFailed: GroupMachine._on_lookup_failed,
    CoordinatorLost: GroupMachine._on_coordinator_lost,
    RequestFailed: GroupMachine._on_request_failed,
    JoinGroupResponse: GroupMachine._on_join_response,
    SyncGroupResponse: GroupMachine._on_sync_response,
    HeartbeatResponse: GroupMachine._on_heartbeat_response,
    LeaveGroupResponse: GroupMachine._on_leave_response,
    OffsetCommitResponse: GroupMachine._on_commit_response,
    OffsetFetchResponse: GroupMachine._on_fetch_response,
}

_ENGINE: engine.TableEngine[GroupMachine, ClassicMember, MemberState, Outcome, Effect, Output] = (
    engine.TableEngine(ROWS, TRANSITIONS, HANDLERS, EFFECTS)
)
