"""Handlers of the local commands and of the driver's reports.

Each records what its input says and names the outcome (a ``Step``); the table
(``transitions.py``) gives the state. Commands: Subscribe, Leave, Commit,
FetchCommitted, RevocationDone, Tick. Reports: MetadataUpdate, CoordinatorFound,
CoordinatorLookupFailed, CoordinatorLost, RequestFailed.
"""

from __future__ import annotations

from collections.abc import Iterator

from ingest.group.classic.classic_requests import STATIC_JOIN_VERSION
from ingest.group.classic.classic_transitions import (
    JOINING,
    LEAVING,
    REVOKING,
    STABLE,
    STAY,
    SYNCING,
    TERMINAL,
    UNJOINED,
    Outcome,
    Step,
)
from ingest.group.classic.core import MachineCore
from ingest.group.commits import commit_lost, fetch_lost, refuse_commit, refuse_fetch
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorLost,
    FetchCommitted,
    Leave,
    Left,
    MetadataUpdate,
    Output,
    RequestFailed,
    RevocationDone,
    Subscribe,
    Tick,
)
from ingest.group.inflight import COMMIT, FETCH, HEARTBEAT, JOIN, LEAVE, SYNC, Sent
from ingest.group.requests import offset_commit_request, offset_fetch_request
from ingest.group.types import InvalidTransition, RebalanceProtocol
from ingest.protocol.error_codes import ErrorCode

__all__ = ["CommandHandlers"]

E = ErrorCode
_LOOKUP_FATAL = {E.GROUP_AUTHORIZATION_FAILED, E.INVALID_REQUEST, E.INVALID_GROUP_ID}


class CommandHandlers(MachineCore):
    """Local commands and driver reports -> outcomes. See the module docstring."""

    def _on_subscribe(self, event: Subscribe, now: float, out: list[Output]) -> Step:
        state = self._state
        if event.topics == self._subscription and state is not UNJOINED:
            return STAY
        self._subscription = event.topics
        if state is UNJOINED:
            return Step(Outcome.JOIN, at=now, reason="subscribed")
        if state is STABLE:
            return self._rejoin(now, "the subscription changed")
        if state is REVOKING:
            if self.protocol is RebalanceProtocol.COOPERATIVE:
                dropped = frozenset(p for p in self._owned if p.topic not in event.topics)
                if dropped:
                    return Step(Outcome.REVOKE_MORE, partitions=dropped)
            return STAY
        # JOINING or SYNCING: the round in progress used the old subscription.
        if state is SYNCING or (self.inflight(JOIN) and not self._join_due):
            return Step(Outcome.REJOIN_AFTER_SYNC)
        return STAY

    def _on_leave(self, event: Leave, now: float, out: list[Output]) -> Step:
        state = self._state
        if state in TERMINAL:
            return STAY
        if state is LEAVING:
            self._leave_force = self._leave_force or event.force
            return STAY
        self._subscription = frozenset()
        if state is UNJOINED:
            return Step(Outcome.LEFT, report=Left())
        self._rejoin_after_sync = False
        self._leave_force = event.force
        self._leave_reason = event.reason
        if self._owned:
            return Step(Outcome.REVOKE_THEN_LEAVE, partitions=self._owned)
        if self._revocations_pending:
            return Step(Outcome.LEAVE_AFTER_REVOCATION)
        return self._leave_now()

    def _on_commit(self, event: Commit, now: float, out: list[Output]) -> Step:
        coordinator = self._coordinator
        answer = refuse_commit(
            event,
            self._state,
            active=self._can_commit(),
            assignment=self.assignment,
            coordinator_known=coordinator is not None,
            generation=self._generation_id,
        )
        if answer is not None:
            out.append(answer)
            return STAY
        assert coordinator is not None
        version = coordinator.versions.offset_commit
        request = offset_commit_request(
            self.config,
            generation_id=self._generation_id,
            member_id=self._member_id,
            offsets=event.offsets,
            metadata=event.metadata,
            version=version,
            leader_epochs=event.leader_epochs,
        )
        self._send(out, request, version, commit=event)
        return STAY

    def _on_fetch_committed(self, event: FetchCommitted, now: float, out: list[Output]) -> Step:
        coordinator = self._coordinator
        answer = refuse_fetch(event, self._state, coordinator_known=coordinator is not None)
        if answer is not None:
            out.append(answer)
            return STAY
        assert coordinator is not None
        version = coordinator.versions.offset_fetch
        request = offset_fetch_request(self.config.group_id, event.partitions, version=version)
        self._send(out, request, version, partitions=event.partitions)
        return STAY

    def _on_revocation_done(self, event: RevocationDone, now: float, out: list[Output]) -> Step:
        if self._revocations_pending == 0:
            raise InvalidTransition(self._state, RevocationDone, "no PartitionsRevoked awaits it")
        self._revocations_pending -= 1
        if self._revocations_pending:
            return STAY
        self._revoking = frozenset()
        if self._state is REVOKING:
            return Step(Outcome.JOIN, at=now, reason="revoked partitions")
        if self._state is LEAVING:
            return self._leave_now()
        return STAY

    def _on_tick(self, event: Tick, now: float, out: list[Output]) -> Step:
        if self._heartbeating() and now >= self._session_deadline():
            self._forget_coordinator("session timed out without a heartbeat answer")
            return Step(
                Outcome.SESSION_EXPIRED,
                lost="no heartbeat answer within the session timeout",
                at=now,
                reason="session timed out",
            )
        counts = self._leadership.assigned_counts
        if self._state is STABLE and self.is_leader and counts and now >= self._metadata_check_at:
            self._metadata_check_at = now + self.config.metadata_refresh_ms / 1000
            return Step(Outcome.CHECK_METADATA, topics=frozenset(counts))
        return STAY

    # -- handlers: driver reports -----------------------------------------------------

    def _on_metadata(self, event: MetadataUpdate, now: float, out: list[Output]) -> Step:
        self._leadership.metadata.update(event.partitions_per_topic)
        state = self._state
        if state is SYNCING and self._leadership.pending is not None:
            return self._lead(now)
        if state is STABLE and self.is_leader:
            changed = self._leadership.changed_counts()
            if changed:
                return self._rejoin(now, f"partition counts changed for {changed}")
        return STAY

    def _on_coordinator_found(self, event: CoordinatorFound, now: float, out: list[Output]) -> Step:
        self._lookup_pending = False
        if self._state in TERMINAL:
            return STAY
        if self.config.is_static and event.versions.join_group < STATIC_JOIN_VERSION:
            return self._fail(
                E.UNSUPPORTED_VERSION,
                f"static membership (group_instance_id) needs JoinGroup v{STATIC_JOIN_VERSION}+;"
                f" the coordinator does v{event.versions.join_group}",
            )
        self._coordinator = event
        return STAY

    def _on_lookup_failed(
        self, event: CoordinatorLookupFailed, now: float, out: list[Output]
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
        self, event: CoordinatorLost, now: float, out: list[Output]
    ) -> Iterator[Step]:
        self._forget_coordinator(event.reason or "the coordinator connection was lost")
        for sent in self._inflight.drain():
            yield self._request_failed(sent, now, event.reason, out)
        if self._state is SYNCING:  # the leader was waiting for metadata: this round cannot finish
            yield self._rejoin(now, "the coordinator was lost during the rebalance")

    def _on_request_failed(self, event: RequestFailed, now: float, out: list[Output]) -> Step:
        sent = self._take(event.api_key, RequestFailed)
        self._forget_coordinator(event.reason or "a request to the coordinator failed")
        return self._request_failed(sent, now, event.reason, out)

    def _request_failed(self, sent: Sent, now: float, reason: str, out: list[Output]) -> Step:
        message = reason or "no response from the coordinator"
        state = self._state
        api_key = sent.api_key
        current = sent.same_round(self._epoch())
        if api_key == JOIN and state is JOINING and current:
            return Step(Outcome.RETRY_JOIN)
        if api_key == SYNC and state is SYNCING and current:
            return self._rejoin(now, f"SyncGroup failed: {message}")
        if api_key == HEARTBEAT:
            self._next_heartbeat_at = now + self._backoff()
        elif api_key == COMMIT and sent.commit is not None:
            out.append(commit_lost(sent.commit, message))
        elif api_key == FETCH:
            out.append(fetch_lost(sent.partitions, message))
        elif api_key == LEAVE and state is LEAVING:
            return Step(Outcome.LEFT, report=Left(error_name="REQUEST_FAILED"))
        return STAY
