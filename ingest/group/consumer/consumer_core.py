"""The state a ``ConsumerMachine`` keeps, and what its handlers and effects share.

``ConsumerCore`` holds the membership (subscription, coordinator, member id and
epoch, the target assignment by topic id, the topic names known, the partitions
owned and being revoked, the heartbeat timing and the fields last sent), answers
the public questions about it, builds and sends heartbeats (``_pump`` after every
input) and names the outcomes several handlers share (``_reconcile``,
``_leave_now``, ``_fail``, ...).

Heartbeats follow Kafka's consumer: every field when joining or after an error,
afterwards only the fields that changed since the last one sent (``SentFields``);
``topic_partitions`` is what the member owns (those being revoked included, until
RevocationDone), sent at once whenever it changed.
"""

from __future__ import annotations

import math
import uuid
from collections import deque
from dataclasses import dataclass

from ingest.errors import ConfigError
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import ConsumerOutput
from ingest.group.consumer.consumer_transitions import (
    JOINING,
    LEAVING,
    RECONCILING,
    REVOKING,
    STABLE,
    TERMINAL,
    UNJOINED,
    ConsumerState,
    Outcome,
    Step,
)
from ingest.group.events import (
    Commit,
    CoordinatorFound,
    Fatal,
    Fenced,
    FindCoordinator,
    Left,
    SendRequest,
)
from ingest.group.inflight import COMMIT, FETCH, Epoch, InFlight, Sent
from ingest.group.types import InvalidTransition, Partition, partitions_by_topic
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroupHeartbeatRequest,
    TopicPartitions,
)
from ingest.protocol.schema import Request

__all__ = ["HEARTBEAT", "REGEX_VERSION", "ConsumerCore", "SentFields"]

E = ErrorCode
HEARTBEAT = ConsumerGroupHeartbeatRequest.api_key
#: ConsumerGroupHeartbeat carries ``subscribed_topic_regex`` from v1.
REGEX_VERSION = 1
#: A member of a consumer-protocol group commits with its member epoch from OffsetCommit v9.
COMMIT_VERSION = 9
_API_KEYS = (HEARTBEAT, COMMIT, FETCH)  # the order a lost connection fails them


@dataclass
class SentFields:
    """The fields of the last heartbeat that carried them; None: never sent (send it)."""

    rebalance_timeout_ms: int | None = None
    rack_id: str | None = None
    topics: frozenset[str] | None = None
    regex: str | None = None
    server_assignor: str | None = None
    owned: frozenset[Partition] | None = None


class ConsumerCore:
    """The membership's state and the means shared by handlers and effects."""

    def __init__(self, config: ConsumerGroupConfig, *, member_id: str) -> None:
        """``member_id``: this process's id for its whole life (KIP-1082), a random UUID
        the driver draws, so that the machine itself draws nothing."""
        if not member_id:
            raise ConfigError("must not be empty", key="member_id")
        self.config = config
        self._state = UNJOINED
        self._topics: frozenset[str] = frozenset()
        self._regex: str | None = None
        self._coordinator: CoordinatorFound | None = None
        self._lookup_pending = False
        self._lookup_retry_at = -math.inf
        self._lookup_reason = "no coordinator known yet"
        self._member_id = member_id
        self._member_epoch = 0
        # A round is one membership attempt; answers to heartbeats of an abandoned one are stale.
        self._round = 0
        self._interval = config.heartbeat_interval_ms / 1000
        self._next_heartbeat_at = math.inf
        self._session_anchor = -math.inf
        self._sent: SentFields | None = None
        self._target: dict[uuid.UUID, frozenset[int]] | None = None
        self._names: dict[uuid.UUID, str] = {}
        self._asked: set[uuid.UUID] = set()
        self._owned: frozenset[Partition] = frozenset()
        self._revoking: frozenset[Partition] = frozenset()
        self._revocations_pending = 0
        self._announced = False  # PartitionsAssigned given since joining
        # The first member epoch after joining with epoch 0 (None while joining): commits
        # made in earlier epochs belong to an earlier membership (``refuse_commit``).
        self._membership_since: int | None = None
        self._leave_force = False
        self._inflight = InFlight(queues={key: deque() for key in _API_KEYS})

    # -- public view ------------------------------------------------------------------

    @property
    def state(self) -> ConsumerState:
        return self._state

    @property
    def member_id(self) -> str:
        return self._member_id

    @property
    def member_epoch(self) -> int:
        return self._member_epoch

    @property
    def assignment(self) -> frozenset[Partition]:
        """Partitions this member consumes and may commit (those being revoked included)."""
        return self._owned | self._revoking

    @property
    def subscription(self) -> frozenset[str] | str:
        """The topic names subscribed to, or the regex."""
        return self._regex if self._regex is not None else self._topics

    @property
    def coordinator(self) -> CoordinatorFound | None:
        return self._coordinator

    @property
    def session_deadline(self) -> float | None:
        """When the session ends without a heartbeat answer (the partitions are then
        lost); None outside a session. An exchange answered later is worthless."""
        return self._session_deadline() if self._in_session() else None

    @property
    def heartbeat_interval(self) -> float:
        """Seconds between heartbeats: the coordinator's, once it answered."""
        return self._interval

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
        elif self._heartbeating() and not self.inflight(HEARTBEAT):
            times.append(self._heartbeat_due())
        if self._in_session():
            times.append(self._session_deadline())
        return min(times) if times else None

    # -- outcomes shared by handlers --------------------------------------------------

    def _reconcile(self, now: float) -> Step:
        """Kafka's reconciliation of the target: revoke first, then own what can be named."""
        target = self._target or {}
        resolved = frozenset(
            Partition(self._names[topic_id], index)
            for topic_id, indexes in target.items()
            if topic_id in self._names
            for index in indexes
        )
        revoke = self._owned - resolved
        if revoke:
            return Step(Outcome.REVOKE, partitions=revoke)
        unknown = frozenset(topic_id for topic_id in target if topic_id not in self._names)
        if not unknown:
            return Step(Outcome.RECONCILED, assignment=resolved)
        ask = unknown - self._asked
        if ask:
            return Step(Outcome.AWAIT_TOPIC_NAMES, assignment=resolved, topic_ids=ask)
        return Step(Outcome.PARTLY_RECONCILED, assignment=resolved)

    def _lost(self, reason: str, now: float) -> Step:
        return Step(Outcome.MEMBER_FENCED, lost=reason, at=now)

    def _leave_now(self) -> Step:
        """Leave with nothing left to revoke: the leaving heartbeat if there is a membership."""
        joined = self._member_epoch > 0 or (self._state is JOINING and self.inflight(HEARTBEAT))
        if self.config.leave_on_close and joined and self._coordinator is not None:
            return Step(Outcome.SEND_LEAVE)
        return Step(Outcome.LEAVE_QUIETLY, report=Left())

    def _leave_epoch(self) -> int:
        """-2 keeps a static member's assignment for its restart; -1 leaves for good."""
        if self.config.is_static and not self._leave_force:
            return LEAVE_GROUP_STATIC_MEMBER_EPOCH
        return LEAVE_GROUP_MEMBER_EPOCH

    def _fence(self, api: str) -> Step:
        reason = (
            f"{api}: FENCED_INSTANCE_ID: another member joined with group.instance.id "
            f"{self.config.group_instance_id!r}"
        )
        return Step(Outcome.FENCE, lost=reason, report=Fenced(reason))

    def _fail(self, code: int, context: str, detail: str | None = None) -> Step:
        """A fatal error code from the coordinator (or for it)."""
        info = error_for(code)
        if code == E.GROUP_AUTHORIZATION_FAILED:
            message = f"{context}: not authorized to use group {self.config.group_id!r}"
        else:
            message = f"{context}: {info.name}: {detail or info.description}"
        return Step(Outcome.FAIL, lost=message, report=Fatal(code, info.name, message))

    def _forget_coordinator(self, reason: str) -> None:
        """Recorded from an input: the coordinator is gone; ``_pump`` looks it up again."""
        if self._coordinator is not None:
            self._lookup_reason = reason
        self._coordinator = None

    # -- sending ----------------------------------------------------------------------

    def _send(
        self,
        out: list[ConsumerOutput],
        request: Request,
        version: int,
        *,
        epoch: Epoch | None = None,
        commit: Commit | None = None,
        partitions: frozenset[Partition] = frozenset(),
        sent_at: float = -math.inf,
    ) -> None:
        api_key = type(request).api_key
        sent = Sent(api_key, epoch or self._epoch(), commit, partitions, sent_at)
        self._inflight.add(sent)
        out.append(SendRequest(request, version))

    def _pump(self, now: float, out: list[ConsumerOutput]) -> None:
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
        version = coordinator.versions.consumer_group_heartbeat
        assert version is not None  # CoordinatorFound refuses a coordinator without it
        if self._heartbeating() and not self.inflight(HEARTBEAT) and now >= self._heartbeat_due():
            self._send(out, self._heartbeat_request(version), version, sent_at=now)
            self._next_heartbeat_at = now + self._interval

    def _heartbeat_request(self, version: int) -> ConsumerGroupHeartbeatRequest:
        """The next heartbeat: every field when joining or after an error, else what changed."""
        config = self.config
        joining = self._state is JOINING
        last = SentFields() if joining or self._sent is None else self._sent
        now_sent = SentFields(
            rebalance_timeout_ms=config.rebalance_timeout_ms,
            rack_id=config.rack_id,
            topics=self._topics if self._regex is None else frozenset(),
            regex=self._regex,
            server_assignor=config.server_assignor,
            owned=frozenset() if joining else self._owned | self._revoking,
        )
        names: tuple[str, ...] | None = None
        regex: str | None = None
        if self._regex is None:
            if self._topics != last.topics:
                names = tuple(sorted(self._topics))
            if last.regex is not None and version >= REGEX_VERSION:
                regex = ""  # an empty regex clears the one sent before (v1)
        else:
            if self._regex != last.regex:
                regex = self._regex
            if last.topics:
                names = ()  # an empty list clears the names sent before
        owned = frozenset() if joining else self._owned | self._revoking
        self._sent = now_sent
        return ConsumerGroupHeartbeatRequest(
            group_id=config.group_id,
            member_id=self._member_id,
            member_epoch=self._member_epoch,
            instance_id=config.group_instance_id,
            rack_id=config.rack_id if config.rack_id != last.rack_id else None,
            rebalance_timeout_ms=(
                config.rebalance_timeout_ms
                if config.rebalance_timeout_ms != last.rebalance_timeout_ms
                else -1
            ),
            subscribed_topic_names=names,
            subscribed_topic_regex=regex,
            server_assignor=(
                config.server_assignor if config.server_assignor != last.server_assignor else None
            ),
            topic_partitions=self._topic_partitions(owned) if owned != last.owned else None,
        )

    def _leave_request(self, epoch: int) -> ConsumerGroupHeartbeatRequest:
        return ConsumerGroupHeartbeatRequest(
            group_id=self.config.group_id,
            member_id=self._member_id,
            member_epoch=epoch,
            instance_id=self.config.group_instance_id,
        )

    def _topic_partitions(self, partitions: frozenset[Partition]) -> tuple[TopicPartitions, ...]:
        # A name may have had two ids (a topic deleted and created again): the target's wins.
        target = self._target or {}
        ids: dict[str, uuid.UUID] = {}
        for topic_id, name in self._names.items():
            if name not in ids or topic_id in target:
                ids[name] = topic_id
        return tuple(
            TopicPartitions(topic_id=ids[topic], partitions=tuple(indexes))
            for topic, indexes in partitions_by_topic(partitions).items()
        )

    # -- small predicates -------------------------------------------------------------

    def _take(self, api_key: int, input_type: type) -> Sent:
        sent = self._inflight.take(api_key)
        if sent is None:
            raise InvalidTransition(self._state, input_type, "no such request is in flight")
        return sent

    def _epoch(self) -> Epoch:
        return Epoch(self._round, self._member_epoch, self._member_id)

    def _backoff(self) -> float:
        return self.config.retry_backoff_ms / 1000

    def _heartbeat_due(self) -> float:
        """When the next heartbeat goes: at once when what the member owns changed."""
        sent = self._sent
        changed = sent is not None and sent.owned != self._owned | self._revoking
        if changed and self._member_epoch > 0:
            return -math.inf
        return self._next_heartbeat_at

    def _session_deadline(self) -> float:
        """The member's own session: ``session_timeout_ms``, but never less than two of the
        coordinator's heartbeat intervals, which the coordinator sets: a shorter one would
        expire between two answered heartbeats (a 2 s session against the broker's default
        5 s interval lost the partitions at every heartbeat)."""
        session = max(self.config.session_timeout_ms / 1000, 2 * self._interval)
        return self._session_anchor + session

    def _heartbeating(self) -> bool:
        """Joining (epoch 0), or a member: heartbeats are due."""
        state = self._state
        if state is JOINING:
            return True
        return self._in_session()

    def _in_session(self) -> bool:
        """A member epoch the coordinator gave, in a state that keeps it alive."""
        state = self._state
        member = state in (STABLE, RECONCILING, REVOKING) or (
            state is LEAVING and self._revocations_pending > 0
        )
        return member and self._member_epoch > 0

    def _can_commit(self) -> bool:
        return self._in_session()

    def _needs_coordinator(self) -> bool:
        return self._state in (JOINING, STABLE, RECONCILING, REVOKING) or self._heartbeating()
