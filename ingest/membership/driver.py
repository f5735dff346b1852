"""The membership thread's loop: ``GroupMachine`` (classic protocol) or ``ConsumerMachine``
(KIP-848, when the member's config is a ``ConsumerGroupConfig``) fed the time, the
caller's commands and the coordinator's answers (``GroupMember`` in ``member.py`` starts it; its module
docstring tells the whole story).

``MembershipThread`` is everything the thread owns: the machine, the outputs
waiting to be acted on, where each commit's and offset fetch's answer goes, the
close in progress, and its ``CoordinatorLink`` (``link.py``). The
caller's thread shares only the two queues, ``status`` (replaced whole after
every step) and the link's request counts.
"""

from __future__ import annotations

import logging
import queue
import time
import uuid
from collections import deque
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import cast

from ingest.client import ClientConfig
from ingest.errors import GroupError
from ingest.group import (
    Commit,
    CommitFailed,
    ConsumerGroupConfig,
    ConsumerMachine,
    ConsumerState,
    FetchCommitted,
    FindCoordinator,
    GroupConfig,
    GroupMachine,
    GroupWarning,
    Input,
    Leave,
    MemberState,
    NeedMetadata,
    NeedTopicNames,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    Output,
    PartitionsRevoked,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
    TopicNames,
)
from ingest.group.consumer.consumer_events import CONSUMER_INPUT_TYPES, ConsumerInput
from ingest.membership.link import CoordinatorLink
from ingest.protocol.partition import Partition

__all__ = ["IDLE_WAIT", "Close", "Command", "MemberStatus", "MembershipThread", "Stopped"]

# One logger for the whole membership, whichever module logs.
log = logging.getLogger("ingest.membership.member")

IDLE_WAIT = 1.0  # the thread wakes at least this often, even with nothing due
_MIN_WAIT = 0.001
_TERMINAL = (MemberState.FENCED, MemberState.FAILED)


@dataclass(frozen=True)
class MemberStatus:
    """A consistent snapshot of the membership, published by the thread after every step."""

    state: MemberState
    generation_id: int
    member_id: str
    assignment: frozenset[Partition]
    is_leader: bool


Reply = Future[Output] | None


@dataclass(frozen=True)
class Command:
    """A machine input from the caller, with where its answer goes (None: the event queue)."""

    input: Input
    reply: Reply = None


@dataclass
class PatternWatch:
    """The topics a ``topic_pattern`` subscription matches, looked at again every
    ``interval`` seconds; a change of them is a new subscription."""

    pattern: str
    interval: float
    subscribed: frozenset[str] = frozenset()
    next_at: float = 0.0


@dataclass(frozen=True)
class Close:
    force: bool
    deadline: float


@dataclass(frozen=True)
class Stopped:
    """The last item the thread puts on the event queue; ``error`` when it died of one."""

    error: BaseException | None


class MembershipThread:
    """What the membership thread owns; ``run`` is its body."""

    def __init__(
        self,
        client: ClientConfig,
        config: GroupConfig | ConsumerGroupConfig,
        commands: queue.SimpleQueue[Command | Close],
        events: queue.SimpleQueue[Output | Stopped],
        watch: PatternWatch | None = None,
    ) -> None:
        self.config = config
        self._watch = watch
        self.link = CoordinatorLink(client, config)
        # Published for the caller's thread, replaced whole:
        self.status = MemberStatus(MemberState.UNJOINED, -1, "", frozenset(), False)
        self._commands = commands
        self._events = events
        self._machine: GroupMachine | ConsumerMachine
        if isinstance(config, ConsumerGroupConfig):
            # KIP-1082: the member draws its own id, once for the life of the process.
            self._machine = ConsumerMachine(config, member_id=str(uuid.uuid4()))
        else:
            self._machine = GroupMachine(config)
        self._outputs: deque[Output | NeedTopicNames | GroupWarning] = deque()
        self._commit_replies: deque[tuple[Mapping[Partition, int], Reply]] = deque()
        self._fetch_replies: deque[Reply] = deque()
        self._unacknowledged_revocations = 0
        self._close: Close | None = None

    def run(self) -> None:
        error: BaseException | None = None
        try:
            self.link.open()
            while not self._finished():
                command = self._wait_for_command()
                # See member.py's docstring: time first, so a stall is noticed before a commit.
                self._handle(Tick())
                while command is not None:
                    self._apply(command)
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if not self._outputs:
                    update = self.link.fetch_metadata()
                    if update is not None:
                        self._handle(update)
                    self._look_at_topics()
                self._step()
        except BaseException as exc:
            error = exc
            log.exception("group %r: the membership thread failed", self.config.group_id)
        finally:
            self._stop(error)

    def _finished(self) -> bool:
        close = self._close
        if close is None:
            return False
        if time.monotonic() > close.deadline:
            return True
        state = self._state()
        return not self._outputs and (state is MemberState.UNJOINED or state in _TERMINAL)

    def _state(self) -> MemberState:
        """The machine's state; a consumer-protocol state as the classic one it acts like."""
        state = self._machine.state
        return state.for_offsets if isinstance(state, ConsumerState) else state

    def _wait_for_command(self) -> Command | Close | None:
        now = time.monotonic()
        wake = now + IDLE_WAIT
        deadline = self._machine.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        metadata_due = self.link.metadata_due()
        if metadata_due is not None:
            wake = min(wake, metadata_due)
        if self._watch is not None:
            wake = min(wake, self._watch.next_at)
        if self._close is not None:
            wake = min(wake, self._close.deadline)
        try:
            if self._outputs:  # work is waiting: only look for commands
                return self._commands.get_nowait()
            return self._commands.get(timeout=max(wake - now, _MIN_WAIT))
        except queue.Empty:
            return None

    def _apply(self, command: Command | Close) -> None:
        if isinstance(command, Close):
            self._close = command
            self._handle(Leave(force=command.force))
            # The caller is done with everything: acknowledge what it has not.
            while self._unacknowledged_revocations:
                self._acknowledge_revocation()
            return
        event = command.input
        if isinstance(event, RevocationDone):
            if self._unacknowledged_revocations:
                self._acknowledge_revocation()
            return  # else close already acknowledged it for the caller
        if isinstance(event, Subscribe) and self._watch is not None:
            self._watch.subscribed = event.topics
        if isinstance(event, Commit):
            self._commit_replies.append((event.offsets, command.reply))
        elif isinstance(event, FetchCommitted):
            self._fetch_replies.append(command.reply)
        self._handle(event)

    def _look_at_topics(self) -> None:
        """With a topic pattern, when due: subscribe to the topics it matches now (a new
        topic joins, a deleted one's partitions are released by the rebalance)."""
        watch = self._watch
        now = time.monotonic()
        if watch is None or self._close is not None or now < watch.next_at:
            return
        watch.next_at = now + watch.interval
        matched = self.link.topics_matching(watch.pattern)
        if matched is None or matched == watch.subscribed:
            return
        if not matched:
            log.warning(
                "group %r: no topic matches %r any more; keeping the subscription to %s",
                self.config.group_id,
                watch.pattern,
                sorted(watch.subscribed),
            )
            return
        log.info(
            "group %r: the topics matching %r are now %s (were %s)",
            self.config.group_id,
            watch.pattern,
            sorted(matched),
            sorted(watch.subscribed),
        )
        watch.subscribed = matched
        self._handle(Subscribe(matched))

    def _acknowledge_revocation(self) -> None:
        self._unacknowledged_revocations -= 1
        self._handle(RevocationDone())

    def _handle(self, event: Input | TopicNames) -> None:
        """Hand ``event`` to the machine; its outputs wait in order for ``_step``."""
        machine = self._machine
        if isinstance(machine, ConsumerMachine):
            # Only the classic machine asks for what the rest of Input answers (MetadataUpdate,
            # JoinGroup/SyncGroup/Heartbeat/LeaveGroup responses).
            assert isinstance(event, CONSUMER_INPUT_TYPES), event
            outputs: list[Output | NeedTopicNames | GroupWarning] = list(
                machine.handle(cast(ConsumerInput, event), time.monotonic())
            )
            generation, leader = machine.member_epoch, False
        else:
            assert not isinstance(event, TopicNames)
            outputs = list(machine.handle(event, time.monotonic()))
            generation, leader = machine.generation_id, machine.is_leader
        self._unacknowledged_revocations += sum(isinstance(o, PartitionsRevoked) for o in outputs)
        self._outputs.extend(outputs)
        self.status = MemberStatus(
            self._state(), generation, machine.member_id, machine.assignment, leader
        )

    def _step(self) -> None:
        """Deliver every event waiting, then act on the first exchange with the cluster.

        One exchange at a time, so that commands get in between the requests
        of a rebalance that takes many rounds; acting later than the machine
        emitted is the same, to it, as a command arriving while in flight.
        Events go first, even those emitted after a queued exchange: an event never
        waits for a request's answer (a session that expired while a coordinator
        lookup was queued must reach the caller at once, not after the lookup's
        timeout, so that its workers stop).
        """
        exchanges: deque[Output | NeedTopicNames | GroupWarning] = deque()
        while self._outputs:
            output = self._outputs.popleft()
            if isinstance(output, SendRequest | FindCoordinator | NeedMetadata | NeedTopicNames):
                exchanges.append(output)
            elif isinstance(output, GroupWarning):
                log.warning(
                    "group %r: %s: %s", self.config.group_id, output.error_name, output.message
                )
            else:
                self._deliver(output)
        self._outputs = exchanges
        if not exchanges:
            return
        output = exchanges.popleft()
        # In a session, no exchange outlasts it (the Tick after it expires the session).
        session_end = self._machine.session_deadline
        if isinstance(output, SendRequest):
            self._handle(self.link.send(output, session_end=session_end))
        elif isinstance(output, FindCoordinator):
            self._handle(self.link.find_coordinator(session_end=session_end))
        elif isinstance(output, NeedMetadata):
            self.link.want_metadata(output.topics)
            update = self.link.fetch_metadata()
            if update is not None:
                self._handle(update)
        elif isinstance(output, NeedTopicNames):
            self._handle(self.link.topic_names(output.topic_ids))

    def _deliver(self, event: Output) -> None:
        reply: Future[Output] | None = None
        if isinstance(event, OffsetsCommitted | CommitFailed):
            offsets, reply = self._commit_replies.popleft()
            assert event.offsets is offsets, "commit outcomes came back out of order"
        elif isinstance(event, OffsetsFetched | OffsetFetchFailed):
            reply = self._fetch_replies.popleft()
        if reply is not None:
            reply.set_result(event)
        else:
            self._events.put(event)

    def _stop(self, error: BaseException | None) -> None:
        failure = error if error is not None else GroupError("the membership thread stopped")
        if error is None:
            # Events the close deadline cut short still reach the caller; requests are dropped.
            for output in self._outputs:
                if not isinstance(
                    output,
                    SendRequest | FindCoordinator | NeedMetadata | NeedTopicNames | GroupWarning,
                ):
                    self._deliver(output)
        for _, reply in self._commit_replies:
            if reply is not None and not reply.done():
                reply.set_exception(failure)
        for fetch_reply in self._fetch_replies:
            if fetch_reply is not None and not fetch_reply.done():
                fetch_reply.set_exception(failure)
        # Commands that arrived too late get the same answer.
        while True:
            try:
                late = self._commands.get_nowait()
            except queue.Empty:
                break
            if isinstance(late, Command) and late.reply is not None:
                late.reply.set_exception(failure)
        self.link.close()
        self._events.put(Stopped(error))
