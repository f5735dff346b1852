"""What a classic-protocol member knows, the effects that change it, and what it sends.

``ClassicMember`` is the record ``GroupMachine`` keeps: the subscription, the
coordinator link, the generation, the join round, the partitions owned and being
revoked, the session. Its ``do_*`` methods carry out the ``Effect``s the rows of
``ROWS`` name (``EFFECTS``), in the order a row lists them; none chooses a state
(the engine enters the row's state after them). ``pump`` sends what is due after
every input: the coordinator lookup when needed, the JoinGroup when due, and
heartbeats (at most one in flight) every ``heartbeat_interval_ms`` while a member
of a generation. ``rejoin``, ``joined``, ``lead``, ``sync``, ``assigned`` and
``leave_now`` name the outcomes the record alone decides (the handlers call them);
the rest are questions about the record, answered without changing it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from ingest.errors import GroupProtocolError
from ingest.group import engine
from ingest.group.classic.classic_config import GroupConfig
from ingest.group.classic.classic_requests import (
    heartbeat_request,
    join_group_request,
    leave_group_request,
    sync_group_request,
)
from ingest.group.classic.classic_transitions import (
    JOINING,
    LEAVING,
    REVOKING,
    STABLE,
    SYNCING,
    TERMINAL,
    UNJOINED,
    Effect,
    Outcome,
    Step,
)
from ingest.group.classic.leader import Leadership, NeedsMetadata, assign_group
from ingest.group.coordination import Coordination
from ingest.group.events import (
    Fatal,
    Left,
    NeedMetadata,
    Output,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
)
from ingest.group.inflight import HEARTBEAT, JOIN, Epoch
from ingest.group.types import MemberState, RebalanceProtocol
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import JoinGroupResponse
from ingest.protocol.partition import Partition

__all__ = ["EFFECTS", "ClassicMember", "fail_protocol", "generation_lost"]

E = ErrorCode


@dataclass
class ClassicMember:
    """One classic member's state; ``state`` is set by the engine's table lookup only."""

    config: GroupConfig = field(compare=False, repr=False)  # fixed: not part of the state
    state: MemberState = UNJOINED
    subscription: frozenset[str] = frozenset()
    link: Coordination = field(default_factory=Coordination)
    member_id: str = ""
    generation_id: int = -1
    # The generation whose SyncGroup gave us what we own. The subscription carries this,
    # not the latest JoinGroup's generation: it is what the assignor needs to rank stale
    # claims, and it keeps the subscription unchanged across rejoins that change nothing
    # (a broker may start a new generation for every changed subscription).
    owned_generation: int = -1
    protocol_name: str | None = None
    leader_id: str = ""
    # A "round" is one attempt to join and sync; abandoning it makes its responses stale.
    round: int = 0
    join_due: bool = False
    join_retry_at: float = -math.inf
    join_reason: str = ""
    rejoin_after_sync: bool = False
    owned: frozenset[Partition] = frozenset()
    revoking: frozenset[Partition] = frozenset()
    revocations_pending: int = 0
    leave_force: bool = False
    leave_reason: str = ""
    leadership: Leadership = field(default_factory=Leadership)
    metadata_check_at: float = math.inf  # the stable leader's next look at its topics
    session_anchor: float = -math.inf
    next_heartbeat_at: float = math.inf

    # -- questions ----------------------------------------------------------------------

    @property
    def is_leader(self) -> bool:
        return bool(self.member_id) and self.leader_id == self.member_id

    def inflight(self, api_key: int) -> int:
        return self.link.inflight.count(api_key)

    def epoch(self) -> Epoch:
        return Epoch(self.round, self.generation_id, self.member_id)

    def backoff(self) -> float:
        return self.config.retry_backoff_ms / 1000

    def session_deadline(self) -> float:
        return self.session_anchor + self.config.session_timeout_ms / 1000

    def in_generation(self) -> bool:
        return self.generation_id >= 0 and bool(self.member_id)

    def heartbeating(self) -> bool:
        state = self.state
        member = state in (SYNCING, STABLE, REVOKING) or (
            state is LEAVING and self.revocations_pending > 0
        )
        return member and self.in_generation()

    def can_commit(self) -> bool:
        state = self.state
        active = state in (STABLE, REVOKING) or (state is LEAVING and self.revocations_pending > 0)
        return active and self.in_generation()

    def needs_coordinator(self) -> bool:
        return self.state in (JOINING, SYNCING, STABLE, REVOKING) or self.heartbeating()

    def next_deadline(self) -> float | None:
        """When a Tick would next do something (send, retry, expire); None when nothing waits."""
        if self.state in TERMINAL:
            return None
        lookup = self.link.lookup_due(self.needs_coordinator())
        times = [] if lookup is None else [lookup]
        if self.link.found is not None:
            if self.state is JOINING and self.join_due and not self.inflight(JOIN):
                times.append(self.join_retry_at)
            if self.heartbeating() and not self.inflight(HEARTBEAT):
                times.append(self.next_heartbeat_at)
        if self.heartbeating():
            times.append(self.session_deadline())
        return min(times) if times else None

    # -- sending --------------------------------------------------------------------------

    def pump(self, now: float, out: list[Output]) -> None:
        """Send what is due in the current state; never changes the state."""
        if self.state in TERMINAL:
            return
        coordinator = self.link.found
        if coordinator is None:
            lookup = self.link.look_up(now, self.needs_coordinator())
            if lookup is not None:
                out.append(lookup)
            return
        versions = coordinator.versions
        if (
            self.state is JOINING
            and self.join_due
            and not self.inflight(JOIN)
            and now >= self.join_retry_at
        ):
            self.join_due = False
            self.rejoin_after_sync = False
            request = join_group_request(
                self.config,
                member_id=self.member_id,
                topics=self.subscription,
                owned=self.owned,
                generation_id=self.owned_generation,
                reason=self.join_reason,
                version=versions.join_group,
            )
            out.append(self.link.send(request, versions.join_group, self.epoch()))
        if self.heartbeating() and not self.inflight(HEARTBEAT) and now >= self.next_heartbeat_at:
            request_hb = heartbeat_request(
                self.config,
                generation_id=self.generation_id,
                member_id=self.member_id,
                version=versions.heartbeat,
            )
            out.append(self.link.send(request_hb, versions.heartbeat, self.epoch(), sent_at=now))
            self.next_heartbeat_at = now + self.config.heartbeat_interval_ms / 1000

    # -- outcomes the state decides (the handlers name them) ----------------------------

    def rejoin(self, now: float, reason: str) -> Step:
        """Rejoin as Kafka's onJoinPrepare does: eager revokes all, cooperative what is unsubscribed.

        Only SYNCING and STABLE (and JOINING) decide to rejoin, and no revocation is
        pending there: those are acknowledged in REVOKING and LEAVING.
        """
        if self.config.rebalance_protocol is RebalanceProtocol.EAGER:
            revoke = self.owned
        else:
            revoke = frozenset(p for p in self.owned if p.topic not in self.subscription)
        if revoke:
            return Step(Outcome.REVOKE_THEN_JOIN, partitions=revoke)
        return Step(Outcome.JOIN, at=now, reason=reason)

    def joined(self, response: JoinGroupResponse, now: float) -> Step:
        """Enter the generation a JoinGroup answer names; then lead, or sync as a follower."""
        self.generation_id = response.generation_id
        self.member_id = response.member_id
        self.protocol_name = response.protocol_name
        self.leader_id = response.leader
        self.session_anchor = now
        self.next_heartbeat_at = now + self.config.heartbeat_interval_ms / 1000
        if self.is_leader and not response.skip_assignment:
            self.leadership.pending = response
            return self.lead(now)
        return self.sync(now, {})

    def lead(self, now: float) -> Step:
        """Assign the group (the JoinGroup answer waiting in ``leadership``), then sync."""
        lead = self.leadership
        join, name = lead.pending, self.protocol_name
        assert join is not None and name is not None
        assignor = self.config.assignor(name)
        assert assignor is not None
        try:
            result = assign_group(
                join,
                assignor,
                self.config.rebalance_protocol,
                lead.metadata,
                generation_id=self.generation_id,
                retained_user_data=lead.retained_for(name),
            )
        except GroupProtocolError as exc:
            return fail_protocol(exc)
        if isinstance(result, NeedsMetadata):
            return Step(Outcome.AWAIT_METADATA, topics=result.topics)
        lead.assigned_counts = result.counts
        lead.pending = None
        return self.sync(now, result.encoded)

    def sync(self, now: float, assignments: Mapping[str, bytes]) -> Step:
        if self.link.found is None:
            # Lost the coordinator between JoinGroup and SyncGroup: Kafka's sync would fail too.
            return self.rejoin(now, "the coordinator was lost before SyncGroup")
        return Step(Outcome.SYNC, assignments=assignments)

    def leave_now(self) -> Step:
        """Leave with nothing left to revoke: LeaveGroup if we should and can."""
        send = self.config.sends_leave_group or self.leave_force
        if send and self.member_id and self.link.found is not None:
            return Step(Outcome.SEND_LEAVE_GROUP)
        return Step(Outcome.LEAVE_QUIETLY, report=Left())

    def assigned(
        self, assigned: frozenset[Partition], user_data: bytes | None, now: float
    ) -> Iterator[Step]:
        """The steps of a SyncGroup answer's assignment (lazily: each sees the last applied)."""
        stray = sorted({p.topic for p in assigned} - self.subscription)
        if stray:
            # Kafka's rule: an assignment outside the subscription is not applied; rejoin.
            yield self.rejoin(now, f"assigned topics {stray} we do not subscribe to")
            return
        revoked = self.owned - assigned
        if revoked:
            yield Step(
                Outcome.ASSIGNED_REVOKING,
                partitions=revoked,
                assignment=assigned,
                user_data=user_data,
            )
            return
        yield Step(Outcome.ASSIGNED, assignment=assigned, user_data=user_data)
        if self.rejoin_after_sync:
            yield self.rejoin(now, "the subscription changed during the rebalance")

    # -- the effects ----------------------------------------------------------------------

    def do_start_joining(self, step: Step, now: float, out: list[Output]) -> None:
        """A new round; ``pump`` sends its JoinGroup at ``step.at`` once the coordinator is known."""
        self.round += 1
        self.leadership.pending = None
        self.join_due = True
        self.join_retry_at = step.at
        self.join_reason = step.reason

    def do_retry_join(self, step: Step, now: float, out: list[Output]) -> None:
        self.join_due = True
        self.join_retry_at = now + self.backoff()

    def do_rejoin_after_sync(self, step: Step, now: float, out: list[Output]) -> None:
        self.rejoin_after_sync = True

    def do_abandon_round(self, step: Step, now: float, out: list[Output]) -> None:
        self.round += 1
        self.leadership.pending = None
        self.join_due = False

    def do_revoke(self, step: Step, now: float, out: list[Output]) -> None:
        out.append(PartitionsRevoked(step.partitions))
        self.owned -= step.partitions
        self.revoking |= step.partitions
        self.revocations_pending += 1

    def do_ask_metadata(self, step: Step, now: float, out: list[Output]) -> None:
        out.append(NeedMetadata(step.topics))

    def do_send_sync(self, step: Step, now: float, out: list[Output]) -> None:
        assert self.link.found is not None
        version = self.link.found.versions.sync_group
        request = sync_group_request(
            self.config,
            generation_id=self.generation_id,
            member_id=self.member_id,
            protocol_name=self.protocol_name,
            assignments=step.assignments,
            version=version,
        )
        out.append(self.link.send(request, version, self.epoch()))

    def do_apply_assignment(self, step: Step, now: float, out: list[Output]) -> None:
        self.leadership.retain(step.user_data, self.protocol_name)
        added = step.assignment - self.owned
        self.owned = step.assignment
        self.owned_generation = self.generation_id
        self.metadata_check_at = now + self.config.metadata_refresh_ms / 1000
        out.append(PartitionsAssigned(added, step.assignment, self.generation_id, self.member_id))

    def do_lose(self, step: Step, now: float, out: list[Output]) -> None:
        lost = self.owned | self.revoking
        if lost:
            out.append(PartitionsLost(lost, step.lost))
        self.owned = frozenset()
        self.owned_generation = -1
        self.revoking = frozenset()

    def do_reset_generation(self, step: Step, now: float, out: list[Output]) -> None:
        self._reset_generation(reset_member_id=False)

    def do_reset_member(self, step: Step, now: float, out: list[Output]) -> None:
        self._reset_generation(reset_member_id=True)

    def do_stop(self, step: Step, now: float, out: list[Output]) -> None:
        self.do_abandon_round(step, now, out)
        self._reset_generation(reset_member_id=True)

    def do_send_leave_group(self, step: Step, now: float, out: list[Output]) -> None:
        member_id = self.member_id
        self.do_forget_membership(step, now, out)
        assert self.link.found is not None
        version = self.link.found.versions.leave_group
        request = leave_group_request(
            self.config, member_id=member_id, reason=self.leave_reason, version=version
        )
        out.append(self.link.send(request, version, self.epoch()))

    def do_forget_membership(self, step: Step, now: float, out: list[Output]) -> None:
        self._reset_generation(reset_member_id=True)
        self.owned = frozenset()

    def do_report(self, step: Step, now: float, out: list[Output]) -> None:
        assert step.report is not None
        out.append(step.report)

    def _reset_generation(self, *, reset_member_id: bool) -> None:
        self.generation_id = -1
        self.protocol_name = None
        self.leader_id = ""
        self.leadership.assigned_counts = None
        if reset_member_id:
            self.member_id = ""


def generation_lost(code: int, api: str, now: float) -> Step:
    """ILLEGAL_GENERATION / UNKNOWN_MEMBER_ID for our current generation: partitions are lost.

    Kafka keeps the member id on ILLEGAL_GENERATION: it may still be valid.
    """
    reason = f"{api}: {error_for(code).name}"
    outcome = Outcome.MEMBER_LOST if code == E.UNKNOWN_MEMBER_ID else Outcome.GENERATION_LOST
    return Step(outcome, lost=reason, at=now, reason=reason)


def fail_protocol(error: GroupProtocolError) -> Step:
    """The group protocol was broken, by the other side or by our own assignor."""
    fatal = Fatal.protocol_broken(error)
    return Step(Outcome.FAIL, lost=fatal.message, report=fatal)


#: Effect -> the method that carries it out (``do_`` and the effect's name).
EFFECTS: dict[Effect, engine.EffectFn[ClassicMember, Output]] = engine.effect_methods(
    ClassicMember, Effect
)
