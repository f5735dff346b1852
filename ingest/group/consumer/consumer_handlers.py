"""Handlers of the consumer-protocol machine's inputs: commands, driver reports, answers.

Each records what its input says and names the outcome (a ``Step``); the table
(``consumer_transitions.py``) gives the state. Errors follow Kafka's consumer
(``AbstractHeartbeatRequestManager``, ``ConsumerHeartbeatRequestManager``):

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

from ingest.errors import RemoteProtocolError
from ingest.group.commits import (
    commit_answered,
    commit_lost,
    fetch_answered,
    fetch_lost,
    refuse_commit,
    refuse_fetch,
)
from ingest.group.consumer.consumer_core import (
    COMMIT_VERSION,
    HEARTBEAT,
    REGEX_VERSION,
    ConsumerCore,
)
from ingest.group.consumer.consumer_events import (
    ConsumerOutput,
    GroupWarning,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_transitions import (
    JOINING,
    LEAVING,
    RECONCILING,
    REVOKING,
    STAY,
    TERMINAL,
    UNJOINED,
    Outcome,
    Step,
)
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
from ingest.group.inflight import COMMIT, FETCH, Sent
from ingest.group.requests import offset_commit_request, offset_fetch_request
from ingest.group.types import InvalidTransition
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatResponse,
    OffsetCommitResponse,
    OffsetFetchResponse,
)

__all__ = ["ConsumerHandlers"]

E = ErrorCode
_LOOKUP_FATAL = {E.GROUP_AUTHORIZATION_FAILED, E.INVALID_REQUEST, E.INVALID_GROUP_ID}
_COORDINATOR_MOVED = {E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR}
API = "ConsumerGroupHeartbeat"


class ConsumerHandlers(ConsumerCore):
    """Inputs -> outcomes. See the module docstring."""

    # -- local commands ----------------------------------------------------------------

    def _on_subscribe(self, event: Subscribe, now: float, out: list[ConsumerOutput]) -> Step:
        return self._subscribe(event.topics, None, now)

    def _on_subscribe_regex(
        self, event: SubscribeRegex, now: float, out: list[ConsumerOutput]
    ) -> Step:
        coordinator = self._coordinator
        if coordinator is not None:
            version = coordinator.versions.consumer_group_heartbeat
            if version is not None and version < REGEX_VERSION:
                return self._regex_unsupported(version)
        return self._subscribe(frozenset(), event.pattern, now)

    def _subscribe(self, topics: frozenset[str], regex: str | None, now: float) -> Step:
        changed = (topics, regex) != (self._topics, self._regex)
        self._topics, self._regex = topics, regex
        if self._state is UNJOINED:
            return Step(Outcome.JOIN, at=now)
        if changed and self._member_epoch > 0:
            self._next_heartbeat_at = now  # the coordinator recomputes the target at once
        return STAY

    def _regex_unsupported(self, version: int) -> Step:
        return self._fail(
            E.UNSUPPORTED_VERSION,
            "a topic regex subscription",
            f"needs ConsumerGroupHeartbeat v{REGEX_VERSION} (KIP-848); "
            f"the coordinator speaks v{version}",
        )

    def _on_leave(self, event: Leave, now: float, out: list[ConsumerOutput]) -> Step:
        state = self._state
        if state in TERMINAL:
            return STAY
        if state is LEAVING:
            self._leave_force = self._leave_force or event.force
            return STAY
        self._topics, self._regex = frozenset(), None
        if state is UNJOINED:
            return Step(Outcome.LEFT, report=Left())
        self._leave_force = event.force
        if self._owned:
            return Step(Outcome.REVOKE_THEN_LEAVE, partitions=self._owned)
        if self._revocations_pending:
            return Step(Outcome.LEAVE_AFTER_REVOCATION)
        return self._leave_now()

    def _on_commit(self, event: Commit, now: float, out: list[ConsumerOutput]) -> Step:
        coordinator = self._coordinator
        answer = refuse_commit(
            event,
            self._state.for_offsets,
            active=self._can_commit(),
            assignment=self.assignment,
            coordinator_known=coordinator is not None,
            membership_since=self._membership_since,
        )
        if answer is not None:
            out.append(answer)
            return STAY
        assert coordinator is not None
        version = coordinator.versions.offset_commit
        request = offset_commit_request(
            self.config,
            generation_id=self._member_epoch,  # generation_id_or_member_epoch
            member_id=self._member_id,
            offsets=event.offsets,
            metadata=event.metadata,
            version=version,
        )
        self._send(out, request, version, commit=event)
        return STAY

    def _on_fetch_committed(
        self, event: FetchCommitted, now: float, out: list[ConsumerOutput]
    ) -> Step:
        coordinator = self._coordinator
        state = self._state.for_offsets
        answer = refuse_fetch(event, state, coordinator_known=coordinator is not None)
        if answer is not None:
            out.append(answer)
            return STAY
        assert coordinator is not None
        version = coordinator.versions.offset_fetch
        request = offset_fetch_request(self.config.group_id, event.partitions, version=version)
        self._send(out, request, version, partitions=event.partitions)
        return STAY

    def _on_revocation_done(
        self, event: RevocationDone, now: float, out: list[ConsumerOutput]
    ) -> Step:
        if self._revocations_pending == 0:
            raise InvalidTransition(self._state, RevocationDone, "no PartitionsRevoked awaits it")
        self._revocations_pending -= 1
        if self._revocations_pending:
            return STAY
        self._revoking = frozenset()
        if self._state is REVOKING:
            if self._member_epoch == 0:  # the partitions were lost meanwhile: rejoin
                return Step(Outcome.JOIN, at=now)
            return self._reconcile(now)
        if self._state is LEAVING:
            return self._leave_now()
        return STAY

    def _on_tick(self, event: Tick, now: float, out: list[ConsumerOutput]) -> Step:
        if self._in_session() and now >= self._session_deadline():
            self._forget_coordinator("session timed out without a heartbeat answer")
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
                self._names.setdefault(topic_id, name)  # an id names one topic for good
        if self._state is RECONCILING and not self._revocations_pending:
            return self._reconcile(now)
        return STAY

    def _on_coordinator_found(
        self, event: CoordinatorFound, now: float, out: list[ConsumerOutput]
    ) -> Step:
        self._lookup_pending = False
        if self._state in TERMINAL:
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
        if self._regex is not None and version < REGEX_VERSION:
            return self._regex_unsupported(version)
        if versions.offset_commit < COMMIT_VERSION:
            return self._fail(
                E.UNSUPPORTED_VERSION,
                "the consumer group protocol (KIP-848)",
                f"members commit with OffsetCommit v{COMMIT_VERSION}+; "
                f"the coordinator speaks v{versions.offset_commit}",
            )
        self._coordinator = event
        return STAY

    def _on_lookup_failed(
        self, event: CoordinatorLookupFailed, now: float, out: list[ConsumerOutput]
    ) -> Step:
        if not self._lookup_pending:
            raise InvalidTransition(self._state, CoordinatorLookupFailed, "no lookup was asked for")
        self._lookup_pending = False
        code = event.error_code
        if code in _LOOKUP_FATAL and self._state not in TERMINAL:
            return self._fail(code, f"FindCoordinator failed: {event.message}")
        self._lookup_retry_at = now + self._backoff()
        return STAY

    def _on_coordinator_lost(
        self, event: CoordinatorLost, now: float, out: list[ConsumerOutput]
    ) -> Iterator[Step]:
        self._forget_coordinator(event.reason or "the coordinator connection was lost")
        for sent in self._inflight.drain():
            yield self._request_failed(sent, now, event.reason, out)

    def _on_request_failed(
        self, event: RequestFailed, now: float, out: list[ConsumerOutput]
    ) -> Step:
        sent = self._take(event.api_key, RequestFailed)
        self._forget_coordinator(event.reason or "a request to the coordinator failed")
        return self._request_failed(sent, now, event.reason, out)

    def _request_failed(
        self, sent: Sent, now: float, reason: str, out: list[ConsumerOutput]
    ) -> Step:
        message = reason or "no response from the coordinator"
        if sent.api_key == HEARTBEAT:
            self._sent = None  # the next heartbeat carries every field
            if self._is_leave(sent) and self._state is LEAVING:
                return Step(Outcome.LEFT, report=Left(error_name="REQUEST_FAILED"))
            self._next_heartbeat_at = now + self._backoff()
        elif sent.api_key == COMMIT and sent.commit is not None:
            out.append(commit_lost(sent.commit, message))
        elif sent.api_key == FETCH:
            out.append(fetch_lost(sent.partitions, message))
        return STAY

    # -- the coordinator's answers -------------------------------------------------------

    def _on_heartbeat_response(
        self, response: ConsumerGroupHeartbeatResponse, now: float, out: list[ConsumerOutput]
    ) -> Step:
        sent = self._take(HEARTBEAT, ConsumerGroupHeartbeatResponse)
        state = self._state
        if state in TERMINAL or state is UNJOINED or sent.epoch.round != self._round:
            return STAY  # stale: sent for a membership since abandoned
        code = response.error_code
        if self._is_leave(sent):
            name = error_for(code).name if code else None
            return Step(Outcome.LEFT, report=Left(error_name=name))
        if code == E.NONE:
            return self._heartbeat_answered(response, sent, now)
        self._sent = None  # the next heartbeat carries every field
        info = error_for(code)
        detail = response.error_message or info.description
        match code:
            case E.FENCED_MEMBER_EPOCH | E.UNKNOWN_MEMBER_ID:
                return self._lost(f"{API}: {info.name}: {detail}", now)
            case E.FENCED_INSTANCE_ID:
                return self._fence(API)
            case E.COORDINATOR_NOT_AVAILABLE | E.NOT_COORDINATOR:
                self._forget_coordinator(f"{API}: {info.name}")
                self._next_heartbeat_at = -math.inf  # at once, to the new coordinator
                return STAY
            case E.TOPIC_AUTHORIZATION_FAILED:
                out.append(GroupWarning(code, info.name, f"{API}: {detail}"))
        if info.retriable or code == E.TOPIC_AUTHORIZATION_FAILED:
            self._next_heartbeat_at = now + self._backoff()
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
            self._member_id = response.member_id  # v0: the coordinator may choose it
        if self._member_epoch == 0 or self._membership_since is None:
            self._membership_since = response.member_epoch
        self._member_epoch = response.member_epoch
        if response.heartbeat_interval_ms > 0:
            self._interval = response.heartbeat_interval_ms / 1000
        # From when the heartbeat was sent: a stalled driver must not stretch the session.
        self._session_anchor = max(self._session_anchor, sent.sent_at)
        assignment = response.assignment
        if assignment is not None:
            target: dict[uuid.UUID, frozenset[int]] = {}
            for topic in assignment.topic_partitions:
                target[topic.topic_id] = target.get(topic.topic_id, frozenset()) | frozenset(
                    topic.partitions
                )
            self._target = target
            self._asked.clear()
        state = self._state
        if state in (REVOKING, LEAVING):
            return STAY  # reconciled once RevocationDone comes (or not at all when leaving)
        if assignment is None and state is not JOINING:
            return STAY  # nothing changed
        return self._reconcile(now)

    def _on_commit_response(
        self, response: OffsetCommitResponse, now: float, out: list[ConsumerOutput]
    ) -> Step:
        sent = self._take(COMMIT, OffsetCommitResponse)
        assert sent.commit is not None
        event, code = commit_answered(sent.commit, response)
        out.append(event)
        state = self._state
        if code == E.NONE or state in TERMINAL:
            return STAY
        if code == E.GROUP_AUTHORIZATION_FAILED and state is not UNJOINED:
            return self._fail(code, "OffsetCommit failed")
        if code in (*_COORDINATOR_MOVED, E.REQUEST_TIMED_OUT):
            self._forget_coordinator(f"OffsetCommit: {error_for(code).name}")
        # STALE_MEMBER_EPOCH, UNKNOWN_MEMBER_ID, ...: the commit failed; the heartbeat
        # decides the membership (Kafka's consumer does the same).
        return STAY

    def _on_fetch_response(
        self, response: OffsetFetchResponse, now: float, out: list[ConsumerOutput]
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

    @staticmethod
    def _is_leave(sent: Sent) -> bool:
        """The leaving heartbeat: sent with epoch -1 or -2 (``Sent.epoch`` records it)."""
        return sent.epoch.generation_id < 0
