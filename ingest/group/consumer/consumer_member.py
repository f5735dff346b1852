"""What a consumer-protocol member knows, the effects that change it, and what it sends.

``ConsumerMember`` is the record ``ConsumerMachine`` keeps: the subscription, the
coordinator link, the member id and epoch, the target assignment by topic id, the
topic names known, the partitions owned and being revoked, the heartbeat timing and
the fields last sent. Its ``do_*`` methods carry out the ``Effect``s the rows of
``ROWS`` name (``EFFECTS``), in the order a row lists them; none chooses a state (the
engine enters the row's state after them). ``pump`` sends the heartbeat when due
after every input (``consumer_requests.py`` builds it). ``reconcile`` and
``leave_now`` name the outcomes the record alone decides; the rest are questions
about it, answered without changing it.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from dataclasses import dataclass, field

from ingest.group import engine
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import ConsumerOutput, NeedTopicNames
from ingest.group.consumer.consumer_requests import (
    HEARTBEAT,
    SentFields,
    heartbeat_request,
    leave_request,
)
from ingest.group.consumer.consumer_transitions import (
    JOINING,
    LEAVING,
    RECONCILING,
    REVOKING,
    STABLE,
    TERMINAL,
    UNJOINED,
    ConsumerState,
    Effect,
    Outcome,
    Step,
)
from ingest.group.coordination import Coordination
from ingest.group.events import Left, PartitionsAssigned, PartitionsLost, PartitionsRevoked
from ingest.group.inflight import COMMIT, FETCH, Epoch, InFlight
from ingest.protocol.messages import LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH
from ingest.protocol.partition import Partition

__all__ = ["EFFECTS", "ConsumerMember"]

_API_KEYS = (HEARTBEAT, COMMIT, FETCH)  # the order a lost connection fails them


def _link() -> Coordination:
    return Coordination(InFlight(queues={key: deque() for key in _API_KEYS}))


@dataclass
class ConsumerMember:
    """One consumer-protocol member's state; ``state`` is set by the engine's table lookup only."""

    config: ConsumerGroupConfig = field(compare=False, repr=False)  # fixed: not part of the state
    member_id: str
    state: ConsumerState = UNJOINED
    topics: frozenset[str] = frozenset()
    regex: str | None = None
    link: Coordination = field(default_factory=_link)
    member_epoch: int = 0
    # A round is one membership attempt; answers to heartbeats of an abandoned one are stale.
    round: int = 0
    interval: float = 0.0  # seconds between heartbeats: the config's, then the coordinator's
    next_heartbeat_at: float = math.inf
    session_anchor: float = -math.inf
    sent: SentFields | None = None
    target: dict[uuid.UUID, frozenset[int]] | None = None
    names: dict[uuid.UUID, str] = field(default_factory=dict)
    asked: set[uuid.UUID] = field(default_factory=set)
    owned: frozenset[Partition] = frozenset()
    revoking: frozenset[Partition] = frozenset()
    revocations_pending: int = 0
    announced: bool = False  # PartitionsAssigned given since joining
    # The first member epoch after joining with epoch 0 (None while joining): commits
    # made in earlier epochs belong to an earlier membership (``refuse_commit``).
    membership_since: int | None = None
    leave_force: bool = False

    def __post_init__(self) -> None:
        self.interval = self.config.heartbeat_interval_ms / 1000

    # -- questions ----------------------------------------------------------------------

    def inflight(self, api_key: int) -> int:
        return self.link.inflight.count(api_key)

    def epoch(self) -> Epoch:
        return Epoch(self.round, self.member_epoch, self.member_id)

    def backoff(self) -> float:
        return self.config.retry_backoff_ms / 1000

    def heartbeat_due(self) -> float:
        """When the next heartbeat goes: at once when what the member owns changed."""
        sent = self.sent
        changed = sent is not None and sent.owned != self.owned | self.revoking
        if changed and self.member_epoch > 0:
            return -math.inf
        return self.next_heartbeat_at

    def session_deadline(self) -> float:
        """The member's own session: ``session_timeout_ms``, but never less than two of the
        coordinator's heartbeat intervals, which the coordinator sets: a shorter one would
        expire between two answered heartbeats (a 2 s session against the broker's default
        5 s interval lost the partitions at every heartbeat)."""
        session = max(self.config.session_timeout_ms / 1000, 2 * self.interval)
        return self.session_anchor + session

    def heartbeating(self) -> bool:
        """Joining (epoch 0), or a member: heartbeats are due."""
        return self.state is JOINING or self.in_session()

    def in_session(self) -> bool:
        """A member epoch the coordinator gave, in a state that keeps it alive."""
        state = self.state
        member = state in (STABLE, RECONCILING, REVOKING) or (
            state is LEAVING and self.revocations_pending > 0
        )
        return member and self.member_epoch > 0

    def needs_coordinator(self) -> bool:
        return self.state in (JOINING, STABLE, RECONCILING, REVOKING) or self.heartbeating()

    def next_deadline(self) -> float | None:
        """When a Tick would next do something (send, retry, expire); None when nothing waits."""
        if self.state in TERMINAL:
            return None
        lookup = self.link.lookup_due(self.needs_coordinator())
        times = [] if lookup is None else [lookup]
        if self.link.found is not None and self.heartbeating() and not self.inflight(HEARTBEAT):
            times.append(self.heartbeat_due())
        if self.in_session():
            times.append(self.session_deadline())
        return min(times) if times else None

    def leave_epoch(self) -> int:
        """-2 keeps a static member's assignment for its restart; -1 leaves for good."""
        if self.config.is_static and not self.leave_force:
            return LEAVE_GROUP_STATIC_MEMBER_EPOCH
        return LEAVE_GROUP_MEMBER_EPOCH

    # -- outcomes the state decides (the handlers name them) ----------------------------

    def reconcile(self, now: float) -> Step:
        """Kafka's reconciliation of the target: revoke first, then own what can be named."""
        target = self.target or {}
        resolved = frozenset(
            Partition(self.names[topic_id], index)
            for topic_id, indexes in target.items()
            if topic_id in self.names
            for index in indexes
        )
        revoke = self.owned - resolved
        if revoke:
            return Step(Outcome.REVOKE, partitions=revoke)
        unknown = frozenset(topic_id for topic_id in target if topic_id not in self.names)
        if not unknown:
            return Step(Outcome.RECONCILED, assignment=resolved)
        ask = unknown - self.asked
        if ask:
            return Step(Outcome.AWAIT_TOPIC_NAMES, assignment=resolved, topic_ids=ask)
        return Step(Outcome.PARTLY_RECONCILED, assignment=resolved)

    def leave_now(self) -> Step:
        """Leave with nothing left to revoke: the leaving heartbeat if there is a membership."""
        joined = self.member_epoch > 0 or (self.state is JOINING and self.inflight(HEARTBEAT))
        if self.config.leave_on_close and joined and self.link.found is not None:
            return Step(Outcome.SEND_LEAVE)
        return Step(Outcome.LEAVE_QUIETLY, report=Left())

    # -- sending --------------------------------------------------------------------------

    def pump(self, now: float, out: list[ConsumerOutput]) -> None:
        """Send what is due in the current state; never changes the state."""
        if self.state in TERMINAL:
            return
        coordinator = self.link.found
        if coordinator is None:
            lookup = self.link.look_up(now, self.needs_coordinator())
            if lookup is not None:
                out.append(lookup)
            return
        version = coordinator.versions.consumer_group_heartbeat
        assert version is not None  # CoordinatorFound refuses a coordinator without it
        if self.heartbeating() and not self.inflight(HEARTBEAT) and now >= self.heartbeat_due():
            request, self.sent = heartbeat_request(
                self.config,
                self.sent,
                joining=self.state is JOINING,
                topics=self.topics,
                regex=self.regex,
                owned=self.owned | self.revoking,
                member_id=self.member_id,
                member_epoch=self.member_epoch,
                names=self.names,
                target=self.target,
                version=version,
            )
            out.append(self.link.send(request, version, self.epoch(), sent_at=now))
            self.next_heartbeat_at = now + self.interval

    # -- the effects ----------------------------------------------------------------------

    def do_start_joining(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        """Epoch 0; ``pump`` sends the joining heartbeat (every field) at ``step.at``."""
        self.round += 1
        self.member_epoch = 0
        self.membership_since = None
        self.target = None
        self.sent = None
        self.announced = False
        self.next_heartbeat_at = step.at

    def do_apply_assignment(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        """Own the target; only what it adds is announced (kept partitions run on untouched).

        The heartbeat that reports it goes at once (``heartbeat_due``).
        """
        added = step.assignment - self.owned
        self.owned = step.assignment
        if added or not self.announced:
            self.announced = True
            event = PartitionsAssigned(added, step.assignment, self.member_epoch, self.member_id)
            out.append(event)

    def do_ask_topic_names(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self.asked |= step.topic_ids
        out.append(NeedTopicNames(step.topic_ids))

    def do_revoke(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        out.append(PartitionsRevoked(step.partitions))
        self.owned -= step.partitions
        self.revoking |= step.partitions
        self.revocations_pending += 1

    def do_lose(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        lost = self.owned | self.revoking
        if lost:
            out.append(PartitionsLost(lost, step.lost))
        self.owned = frozenset()
        self.revoking = frozenset()

    def do_reset_epoch(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self.round += 1
        self.member_epoch = 0
        self.membership_since = None
        self.target = None
        self.sent = None

    def do_abandon_round(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self.round += 1

    def do_send_leave(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        coordinator = self.link.found
        assert coordinator is not None and coordinator.versions.consumer_group_heartbeat is not None
        epoch = self.leave_epoch()
        request = leave_request(self.config, self.member_id, epoch)
        version = coordinator.versions.consumer_group_heartbeat
        marked = Epoch(self.round, epoch, self.member_id)  # marks the leaving heartbeat
        out.append(self.link.send(request, version, marked, sent_at=now))
        self.do_forget_membership(step, now, out)

    def do_forget_membership(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self.member_epoch = 0
        self.membership_since = None
        self.owned = frozenset()
        self.target = None
        self.sent = None

    def do_stop(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self.round += 1
        self.do_forget_membership(step, now, out)

    def do_report(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        assert step.report is not None
        out.append(step.report)


#: Effect -> the method that carries it out (``do_`` and the effect's name).
EFFECTS: dict[Effect, engine.EffectFn[ConsumerMember, ConsumerOutput]] = engine.effect_methods(
    ConsumerMember, Effect
)
