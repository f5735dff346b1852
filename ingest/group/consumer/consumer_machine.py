"""The consumer-group membership state machine for the consumer protocol (KIP-848), sans I/O.

``ConsumerMachine.handle(input, now)`` applies one input and returns what to do
next, like ``GroupMachine`` (the classic protocol) and with the same inputs and
outputs where they mean the same thing, so one driver can run either. It reads no
clock (``now`` is passed in), opens no socket, starts no thread and draws no random
number: the member id (a UUID, KIP-1082) comes from the driver.

The coordinator assigns. The member heartbeats with ConsumerGroupHeartbeat: epoch
0 joins (every field), later heartbeats carry only what changed, at the interval
the coordinator gives. An answer may bring a target assignment by topic id; the
member reconciles it incrementally (``consumer_member.py``). Topic ids it cannot
name are asked for (NeedTopicNames -> TopicNames). Commits carry the member epoch
(OffsetCommit v9+). A static member leaves with epoch -2 and keeps its assignment
for a restart; a dynamic one with -1.

The engine (``engine.py``) runs it with the tables of ``consumer_transitions.py``: the
handlers here read each input and name the outcome; the effects change the record.

Errors follow Kafka's consumer (``AbstractHeartbeatRequestManager``,
``ConsumerHeartbeatRequestManager``):

- FENCED_MEMBER_EPOCH, UNKNOWN_MEMBER_ID: the partitions are lost; rejoin at epoch 0
  at once (or once a pending revocation is acknowledged).
- FENCED_INSTANCE_ID: terminal (Fenced).
- COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR: look the coordinator up again, then
  heartbeat at once; COORDINATOR_LOAD_IN_PROGRESS and any retriable error: again
  after ``retry_backoff_ms``.
- TOPIC_AUTHORIZATION_FAILED: a GroupWarning; the member keeps what it owns and retries.
- Anything else (UNRELEASED_INSTANCE_ID, GROUP_MAX_SIZE_REACHED, UNSUPPORTED_ASSIGNOR,
  INVALID_REQUEST, GROUP_AUTHORIZATION_FAILED, UNSUPPORTED_VERSION,
  INVALID_REGULAR_EXPRESSION, ...): terminal (Fatal).

After any error the next heartbeat carries every field again.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Iterator

from ingest.errors import ConfigError, RemoteProtocolError
from ingest.group import engine
from ingest.group.commits import (
    commit_answer,
    commit_or_refuse,
    fetch_or_refuse,
    fetch_response,
    request_lost,
)
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import (
    ConsumerInput,
    ConsumerOutput,
    GroupWarning,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_member import EFFECTS, ConsumerMember
from ingest.group.consumer.consumer_requests import HEARTBEAT, REGEX_VERSION
from ingest.group.consumer.consumer_transitions import (
    JOINING,
    LEAVING,
    RECONCILING,
    REVOKING,
    ROWS,
    STAY,
    TERMINAL,
    TRANSITIONS,
    UNJOINED,
    ConsumerState,
    Effect,
    Outcome,
    Step,
)
from ingest.group.coordination import COORDINATOR_MOVED, fail, fence
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    Fatal,
    FetchCommitted,
    Leave,
    Left,
    RequestFailed,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.group.inflight import Sent
from ingest.group.types import InvalidTransition
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)
from ingest.protocol.partition import Partition

__all__ = ["HANDLERS", "ConsumerMachine"]

E = ErrorCode
API = "ConsumerGroupHeartbeat"
#: A member of a consumer-protocol group commits with its member epoch from OffsetCommit v9.
COMMIT_VERSION = 9


class ConsumerMachine:
    """One consumer's membership in one consumer-protocol group. See the module docstring."""

    def __init__(self, config: ConsumerGroupConfig, *, member_id: str) -> None:
        """``member_id``: this process's id for its whole life (KIP-1082), a random UUID
        the driver draws, so that the machine itself draws nothing."""
        if not member_id:
            raise ConfigError("must not be empty", key="member_id")
        self.config = config
        self._m = ConsumerMember(config, member_id)

    def handle(self, event: ConsumerInput, now: float) -> list[ConsumerOutput]:
        """Apply ``event`` at time ``now``; return the outputs in the order to act on them."""
        return _ENGINE.handle(self, self._m, event, now)

    # -- public view ------------------------------------------------------------------

    @property
    def state(self) -> ConsumerState:
        return self._m.state

    @property
    def member_id(self) -> str:
        return self._m.member_id

    @property
    def member_epoch(self) -> int:
        return self._m.member_epoch

    @property
    def assignment(self) -> frozenset[Partition]:
        """Partitions this member consumes and may commit (those being revoked included)."""
        return self._m.owned | self._m.revoking

    @property
    def subscription(self) -> frozenset[str] | str:
        """The topic names subscribed to, or the regex."""
        return self._m.regex if self._m.regex is not None else self._m.topics

    @property
    def coordinator(self) -> CoordinatorFound | None:
        return self._m.link.found

    @property
    def session_deadline(self) -> float | None:
        """When the session ends without a heartbeat answer (the partitions are then
        lost); None outside a session. An exchange answered later is worthless."""
        return self._m.session_deadline() if self._m.in_session() else None

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats: the coordinator's, once it answered."""
        return self._m.interval

    def inflight(self, api_key: int) -> int:
        """How many requests of ``api_key`` await a response."""
        return self._m.inflight(api_key)

    def next_deadline(self) -> float | None:
        """When a Tick would next do something (send, retry, expire); None when nothing waits."""
        return self._m.next_deadline()

    # -- outcomes shared by handlers --------------------------------------------------

    def _lost(self, reason: str, now: float) -> Step:
        return Step(Outcome.MEMBER_FENCED, lost=reason, at=now)

    def _fence(self, api: str) -> Step:
        return fence(Outcome.FENCE, api, self.config.group_instance_id, "member")

    def _fail(self, code: int, context: str, detail: str | None = None) -> Step:
        return fail(Outcome.FAIL, code, context, self.config.group_id, detail)

    # -- local commands ----------------------------------------------------------------

    def _on_subscribe(self, event: Subscribe, now: float, out: list[ConsumerOutput]) -> Step:
        return self._subscribe(event.topics, None, now)

    def _on_subscribe_regex(
        self, event: SubscribeRegex, now: float, out: list[ConsumerOutput]
    ) -> Step:
        coordinator = self._m.link.found
        if coordinator is not None:
            version = coordinator.versions.consumer_group_heartbeat
            if version is not None and version < REGEX_VERSION:
                return self._regex_unsupported(version)
        return self._subscribe(frozenset(), event.pattern, now)

    def _subscribe(self, topics: frozenset[str], regex: str | None, now: float) -> Step:
        changed = (topics, regex) != (self._m.topics, self._m.regex)
        self._m.topics, self._m.regex = topics, regex
        if self._m.state is UNJOINED:
            return Step(Outcome.JOIN, at=now)
        if changed and self._m.member_epoch > 0:
            self._m.next_heartbeat_at = now  # the coordinator recomputes the target at once
        return STAY

    def _regex_unsupported(self, version: int) -> Step:
        return self._fail(
            E.UNSUPPORTED_VERSION,
            "a topic regex subscription",
            f"needs ConsumerGroupHeartbeat v{REGEX_VERSION} (KIP-848); "
            f"the coordinator speaks v{version}",
        )

    def _on_leave(self, event: Leave, now: float, out: list[ConsumerOutput]) -> Step:
        state = self._m.state
        if state in TERMINAL:
            return STAY
        if state is LEAVING:
            self._m.leave_force = self._m.leave_force or event.force
            return STAY
        self._m.topics, self._m.regex = frozenset(), None
        if state is UNJOINED:
            return Step(Outcome.LEFT, report=Left())
        self._m.leave_force = event.force
        if self._m.owned:
            return Step(Outcome.REVOKE_THEN_LEAVE, partitions=self._m.owned)
        if self._m.revocations_pending:
            return Step(Outcome.LEAVE_AFTER_REVOCATION)
        return self._m.leave_now()

    def _on_commit(self, event: Commit, now: float, out: list[ConsumerOutput]) -> Step:
        m = self._m
        sent_or_answer = commit_or_refuse(
            m.link,
            event,
            m.state.for_offsets,
            active=m.in_session(),
            assignment=self.assignment,
            identity=self.config,
            generation_id=m.member_epoch,  # generation_id_or_member_epoch
            member_id=m.member_id,
            epoch=m.epoch(),
            membership_since=m.membership_since,
        )
        out.append(sent_or_answer)
        return STAY

    def _on_fetch_committed(
        self, event: FetchCommitted, now: float, out: list[ConsumerOutput]
    ) -> Step:
        m = self._m
        state = m.state.for_offsets
        out.append(fetch_or_refuse(m.link, event, state, self.config.group_id, m.epoch()))
        return STAY

    def _on_revocation_done(
        self, event: RevocationDone, now: float, out: list[ConsumerOutput]
    ) -> Step:
        if self._m.revocations_pending == 0:
            raise InvalidTransition(self._m.state, RevocationDone, "no PartitionsRevoked awaits it")
        self._m.revocations_pending -= 1
        if self._m.revocations_pending:
            return STAY
        self._m.revoking = frozenset()
        if self._m.state is REVOKING:
            if self._m.member_epoch == 0:  # the partitions were lost meanwhile: rejoin
                return Step(Outcome.JOIN, at=now)
            return self._m.reconcile(now)
        if self._m.state is LEAVING:
            return self._m.leave_now()
        return STAY

    def _on_tick(self, event: Tick, now: float, out: list[ConsumerOutput]) -> Step:
        if self._m.in_session() and now >= self._m.session_deadline():
            self._m.link.forget("session timed out without a heartbeat answer")
            return Step(
                Outcome.SESSION_EXPIRED,
                lost="no heartbeat answer within the session timeout",
                at=now,
            )
        return STAY

    # -- driver reports ------------------------------------------------------------------

    def _on_topic_names(self, event: TopicNames, now: float, out: list[ConsumerOutput]) -> Step:
        for topic_id, name in event.names.items():
            if name is not None:
                self._m.names.setdefault(topic_id, name)  # an id names one topic for good
        if self._m.state is RECONCILING and not self._m.revocations_pending:
            return self._m.reconcile(now)
        return STAY

    def _on_coordinator_found(
        self, event: CoordinatorFound, now: float, out: list[ConsumerOutput]
    ) -> Step:
        self._m.link.lookup_pending = False
        if self._m.state in TERMINAL:
            return STAY
        versions = event.versions
        version = versions.consumer_group_heartbeat
        if version is None:
            return self._fail(
                E.UNSUPPORTED_VERSION,
                "the consumer group protocol (KIP-848)",
                "the coordinator does not offer ConsumerGroupHeartbeat; "
                "use the classic protocol with this broker",
            )
        if self._m.regex is not None and version < REGEX_VERSION:
            return self._regex_unsupported(version)
        if versions.offset_commit < COMMIT_VERSION:
            return self._fail(
                E.UNSUPPORTED_VERSION,
                "the consumer group protocol (KIP-848)",
                f"members commit with OffsetCommit v{COMMIT_VERSION}+; "
                f"the coordinator speaks v{versions.offset_commit}",
            )
        self._m.link.found = event
        return STAY

    def _on_lookup_failed(
        self, event: CoordinatorLookupFailed, now: float, out: list[ConsumerOutput]
    ) -> Step:
        m = self._m
        fatal = m.link.lookup_failed(event, m.state, now + m.backoff(), m.state in TERMINAL)
        if fatal is None:
            return STAY
        return self._fail(fatal, f"FindCoordinator failed: {event.message}")

    def _on_coordinator_lost(
        self, event: CoordinatorLost, now: float, out: list[ConsumerOutput]
    ) -> Iterator[Step]:
        for sent in self._m.link.lost(event.reason):
            yield self._request_failed(sent, now, event.reason, out)

    def _on_request_failed(
        self, event: RequestFailed, now: float, out: list[ConsumerOutput]
    ) -> Step:
        sent = self._m.link.failed(event, self._m.state)
        return self._request_failed(sent, now, event.reason, out)

    def _request_failed(
        self, sent: Sent, now: float, reason: str, out: list[ConsumerOutput]
    ) -> Step:
        message = reason or "no response from the coordinator"
        if sent.api_key == HEARTBEAT:
            self._m.sent = None  # the next heartbeat carries every field
            if self._is_leave(sent) and self._m.state is LEAVING:
                return Step(Outcome.LEFT, report=Left(error_name="REQUEST_FAILED"))
            self._m.next_heartbeat_at = now + self._m.backoff()
        lost = request_lost(sent, message)
        if lost is not None:
            out.append(lost)
        return STAY

    # -- the coordinator's answers -------------------------------------------------------

    def _on_heartbeat_response(
        self, response: ConsumerGroupHeartbeatResponse, now: float, out: list[ConsumerOutput]
    ) -> Step:
        sent = self._m.link.take(HEARTBEAT, ConsumerGroupHeartbeatResponse, self._m.state)
        state = self._m.state
        if state in TERMINAL or state is UNJOINED or sent.epoch.round != self._m.round:
            return STAY  # stale: sent for a membership since abandoned
        code = response.error_code
        if self._is_leave(sent):
            name = error_for(code).name if code else None
            return Step(Outcome.LEFT, report=Left(error_name=name))
        if code == E.NONE:
            return self._heartbeat_answered(response, sent, now)
        self._m.sent = None  # the next heartbeat carries every field
        info = error_for(code)
        detail = response.error_message or info.description
        match code:
            case E.FENCED_MEMBER_EPOCH | E.UNKNOWN_MEMBER_ID:
                return self._lost(f"{API}: {info.name}: {detail}", now)
            case E.FENCED_INSTANCE_ID:
                return self._fence(API)
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR:
                self._m.link.forget(f"{API}: {info.name}")
                self._m.next_heartbeat_at = -math.inf  # at once, to the new coordinator
                return STAY
            case E.TOPIC_AUTHORIZATION_FAILED:
                out.append(GroupWarning(code, info.name, f"{API}: {detail}"))
        if info.retriable or code == E.TOPIC_AUTHORIZATION_FAILED:
            self._m.next_heartbeat_at = now + self._m.backoff()
            return STAY
        return self._fail(code, f"{API} failed", detail)

    def _heartbeat_answered(
        self, response: ConsumerGroupHeartbeatResponse, sent: Sent, now: float
    ) -> Step:
        if response.member_epoch <= 0:
            error = RemoteProtocolError(
                f"{API} succeeded with member epoch {response.member_epoch}"
            )
            fatal = Fatal.protocol_broken(error)
            return Step(Outcome.FAIL, lost=fatal.message, report=fatal)
        if response.member_id:
            self._m.member_id = response.member_id  # v0: the coordinator may choose it
        if self._m.member_epoch == 0 or self._m.membership_since is None:
            self._m.membership_since = response.member_epoch
        self._m.member_epoch = response.member_epoch
        if response.heartbeat_interval_ms > 0:
            self._m.interval = response.heartbeat_interval_ms / 1000
        # From when the heartbeat was sent: a stalled driver must not stretch the session.
        self._m.session_anchor = max(self._m.session_anchor, sent.sent_at)
        assignment = response.assignment
        if assignment is not None:
            target: dict[uuid.UUID, frozenset[int]] = {}
            for topic in assignment.topic_partitions:
                target[topic.topic_id] = target.get(topic.topic_id, frozenset()) | frozenset(
                    topic.partitions
                )
            self._m.target = target
            self._m.asked.clear()
        state = self._m.state
        if state in (REVOKING, LEAVING):
            return STAY  # reconciled once RevocationDone comes (or not at all when leaving)
        if assignment is None and state is not JOINING:
            return STAY  # nothing changed
        return self._m.reconcile(now)

    def _on_commit_response(
        self, response: OffsetCommitResponse, now: float, out: list[ConsumerOutput]
    ) -> Step:
        event, code, _ = commit_answer(self._m.link, response, self._m.state)
        out.append(event)
        state = self._m.state
        if code == E.NONE or state in TERMINAL:
            return STAY
        if code == E.GROUP_AUTHORIZATION_FAILED and state is not UNJOINED:
            return self._fail(code, "OffsetCommit failed")
        if code in (*COORDINATOR_MOVED, E.REQUEST_TIMED_OUT):
            self._m.link.forget(f"OffsetCommit: {error_for(code).name}")
        # STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, ...: the commit failed; the heartbeat
        # decides the membership (Kafka's consumer does the same).
        return STAY

    def _on_fetch_response(
        self, response: OffsetFetchResponse, now: float, out: list[ConsumerOutput]
    ) -> Step:
        m = self._m
        terminal = m.state in TERMINAL
        event, fatal = fetch_response(m.link, response, self.config.group_id, m.state, terminal)
        out.append(event)
        return self._fail(fatal, "OffsetFetch failed") if fatal else STAY

    @staticmethod
    def _is_leave(sent: Sent) -> bool:
        """The leaving heartbeat: sent with epoch -1 or -2 (``Sent.epoch`` records it)."""
        return sent.epoch.generation_id < 0


Handler = engine.Handler[ConsumerMachine, ConsumerOutput]

#: input type -> the handler naming its outcome (``ACCEPTS`` says where it is accepted).
HANDLERS: dict[type, Handler] = {
    Subscribe: ConsumerMachine._on_subscribe,
    SubscribeRegex: ConsumerMachine._on_subscribe_regex,
    Leave: ConsumerMachine._on_leave,
    Commit: ConsumerMachine._on_commit,
    FetchCommitted: ConsumerMachine._on_fetch_committed,
    RevocationDone: ConsumerMachine._on_revocation_done,
    Tick: ConsumerMachine._on_tick,
    TopicNames: ConsumerMachine._on_topic_names,
    CoordinatorFound: ConsumerMachine._on_coordinator_found,
    CoordinatorLookupFailed: ConsumerMachine._on_lookup_failed,
    CoordinatorLost: ConsumerMachine._on_coordinator_lost,
    RequestFailed: ConsumerMachine._on_request_failed,
    ConsumerGroupHeartbeatResponse: ConsumerMachine._on_heartbeat_response,
    OffsetCommitResponse: ConsumerMachine._on_commit_response,
    OffsetFetchResponse: ConsumerMachine._on_fetch_response,
}

_ENGINE: engine.TableEngine[
    ConsumerMachine, ConsumerMember, ConsumerState, Outcome, Effect, ConsumerOutput
] = engine.TableEngine(ROWS, TRANSITIONS, HANDLERS, EFFECTS)
