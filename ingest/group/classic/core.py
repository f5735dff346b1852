"""The state a ``GroupMachine`` keeps, and what every part of it uses.

``MachineCore`` holds the membership (subscription, coordinator, generation,
join round, partitions owned and being revoked, the session), answers the
public questions about it, sends requests (``_pump`` after every input, and
``_send`` for the rest) and names the outcomes several handlers share
(``_rejoin``, ``_fail``, ...). The handlers (``commands.py``, ``answers.py``) and
the effects (``effects.py``) build on it; ``machine.py`` puts them together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ingest.errors import GroupProtocolError
from ingest.group.classic.classic_config import GroupConfig
from ingest.group.classic.classic_requests import heartbeat_request, join_group_request
from ingest.group.classic.classic_transitions import (
    JOINING,
    LEAVING,
    REVOKING,
    STABLE,
    SYNCING,
    TERMINAL,
    UNJOINED,
    Outcome,
    Step,
)
from ingest.group.classic.leader import Leadership, NeedsMetadata, assign_group
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    Fatal,
    Fenced,
    FindCoordinator,
    Left,
    Output,
    SendRequest,
)
from ingest.group.inflight import HEARTBEAT, JOIN, Epoch, InFlight, Sent
from ingest.group.types import InvalidTransition, MemberState, Partition, RebalanceProtocol
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.schema import Request

__all__ = ["MachineCore"]

E = ErrorCode


class MachineCore:
    """The membership's state and the means shared by handlers and effects."""

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
        self._leave_force = False
        self._leave_reason = ""
        self._leadership = Leadership()
        self._metadata_check_at = math.inf  # the stable leader's next look at its topics
        self._session_anchor = -math.inf
        self._next_heartbeat_at = math.inf
        self._inflight = InFlight()

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
        return self._leadership.retained

    @property
    def session_deadline(self) -> float | None:
        """When the session ends without a heartbeat answer (the partitions are then
        lost); None outside a session. An exchange answered later is worthless."""
        return self._session_deadline() if self._heartbeating() else None

    def inflight(self, api_key: int) -> int:
        """How many requests of ``api_key`` await a response."""
        return self._inflight.count(api_key)

    def next_deadline(self) -> float | None:
        """When a Tick would next do something (send, retry, expire); None when nothing waits."""
        if self._state in TERMINAL:
            return None
        times: list[float] = []
        if self._coordinator is None:
            if self._needs_coordinator() and not self._lookup_pending:
                times.append(self._lookup_retry_at)
        else:
            if self._state is JOINING and self._join_due and not self.inflight(JOIN):
                times.append(self._join_retry_at)
            if self._heartbeating() and not self.inflight(HEARTBEAT):
                times.append(self._next_heartbeat_at)
        if self._heartbeating():
            times.append(self._session_deadline())
        return min(times) if times else None

    # -- outcomes shared by handlers --------------------------------------------------

    def _rejoin(self, now: float, reason: str) -> Step:
        """Rejoin as Kafka's onJoinPrepare does: eager revokes all, cooperative what is unsubscribed.

        Only SYNCING and STABLE (and JOINING) decide to rejoin, and no revocation is
        pending there: those are acknowledged in REVOKING and LEAVING.
        """
        if self.protocol is RebalanceProtocol.EAGER:
            revoke = self._owned
        else:
            revoke = frozenset(p for p in self._owned if p.topic not in self._subscription)
        if revoke:
            return Step(Outcome.REVOKE_THEN_JOIN, partitions=revoke)
        return Step(Outcome.JOIN, at=now, reason=reason)

    def _generation_lost(self, code: int, api: str, now: float) -> Step:
        """ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID for our current generation: partitions are lost.

        Kafka keeps the member id on ILLEGAL_GENERATION: it may still be valid.
        """
        reason = f"{api}: {error_for(code).name}"
        outcome = Outcome.MEMBER_LOST if code == E.UNKNOWN_MEMBER_ID else Outcome.GENERATION_LOST
        return Step(outcome, lost=reason, at=now, reason=reason)

    def _lead(self, now: float) -> Step:
        """Assign the group (the JoinGroup answer waiting in ``_leadership``), then sync."""
        lead = self._leadership
        join, name = lead.pending, self._protocol_name
        assert join is not None and name is not None
        assignor = self.config.assignor(name)
        assert assignor is not None
        try:
            result = assign_group(
                join,
                assignor,
                self.protocol,
                lead.metadata,
                generation_id=self._generation_id,
                retained_user_data=lead.retained_for(name),
            )
        except GroupProtocolError as exc:
            return self._fail_protocol(exc)
        if isinstance(result, NeedsMetadata):
            return Step(Outcome.AWAIT_METADATA, topics=result.topics)
        lead.assigned_counts = result.counts
        lead.pending = None
        return self._sync(now, result.encoded)

    def _sync(self, now: float, assignments: Mapping[str, bytes]) -> Step:
        if self._coordinator is None:
            # Lost the coordinator between JoinGroup and SyncGroup: Kafka's sync would fail too.
            return self._rejoin(now, "the coordinator was lost before SyncGroup")
        return Step(Outcome.SYNC, assignments=assignments)

    def _leave_now(self) -> Step:
        """Leave with nothing left to revoke: LeaveGroup if we should and can."""
        send = self.config.sends_leave_group or self._leave_force
        if send and self._member_id and self._coordinator is not None:
            return Step(Outcome.SEND_LEAVE_GROUP)
        return Step(Outcome.LEAVE_QUIETLY, report=Left())

    def _fence(self, api: str) -> Step:
        reason = (
            f"{api}: FENCED_INSTANCE_ID: another consumer joined with group.instance.id "
            f"{self.config.group_instance_id!r}"
        )
        return Step(Outcome.FENCE, lost=reason, report=Fenced(reason))

    def _fail(self, code: int, context: str) -> Step:
        """A fatal error code from the coordinator (or for it)."""
        info = error_for(code)
        if code == E.GROUP_AUTHORIZATION_FAILED:
            message = f"{context}: not authorized to use group {self.config.group_id!r}"
        else:
            message = f"{context}: {info.name}: {info.description}"
        return Step(Outcome.FAIL, lost=message, report=Fatal(code, info.name, message))

    def _fail_protocol(self, error: GroupProtocolError) -> Step:
        """The group protocol was broken, by the other side or by our own assignor."""
        fatal = Fatal.protocol_broken(error)
        return Step(Outcome.FAIL, lost=fatal.message, report=fatal)

    def _forget_coordinator(self, reason: str) -> None:
        """Recorded from an input: the coordinator is gone; ``_pump`` looks it up again."""
        if self._coordinator is not None:
            self._lookup_reason = reason
        self._coordinator = None

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
        api_key = type(request).api_key
        self._inflight.add(Sent(api_key, self._epoch(), commit, partitions, sent_at))
        out.append(SendRequest(request, version))

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
            and not self.inflight(JOIN)
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
        if self._heartbeating() and not self.inflight(HEARTBEAT) and now >= self._next_heartbeat_at:
            request_hb = heartbeat_request(
                self.config,
                generation_id=self._generation_id,
                member_id=self._member_id,
                version=versions.heartbeat,
            )
            self._send(out, request_hb, versions.heartbeat, sent_at=now)
            self._next_heartbeat_at = now + self.config.heartbeat_interval_ms / 1000

    # -- small predicates -------------------------------------------------------------

    def _take(self, api_key: int, input_type: type) -> Sent:
        sent = self._inflight.take(api_key)
        if sent is None:
            raise InvalidTransition(self._state, input_type, "no such request is in flight")
        return sent

    def _epoch(self) -> Epoch:
        return Epoch(self._round, self._generation_id, self._member_id)

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
