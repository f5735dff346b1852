"""Group membership over a real cluster: the threaded I/O driver of ``GroupMachine``.

``GroupMember`` runs the pure ``ingest.group.GroupMachine`` on its own
*membership thread*, which owns a ``Cluster`` of its own (and so the
coordinator connection: connections are single-owner). That thread feeds the
machine ``time.monotonic()``, the coordinator's responses and the caller's
commands, sends heartbeats every ``heartbeat_interval_ms`` and does every
blocking exchange (a JoinGroup waits for the whole rebalance). The caller's
thread never touches the machine or a socket: it talks to the membership
thread through two queues.

* commands (caller -> thread): subscribe, revocation acknowledgements,
  commits, offset fetches, close. ``commit`` and ``fetch_committed`` wait
  for their own answer; ``commit_async`` gets it later as an event.
* events (thread -> caller, read with ``poll``): the machine's events
  (PartitionsAssigned, PartitionsRevoked, PartitionsLost, Fenced, Fatal,
  Left, and the outcome of async commits).

So a caller busy for minutes (a Spark job) keeps its membership, as long as
it acknowledges PartitionsRevoked within the rebalance timeout.

The thread acts on the machine's outputs in order, one exchange with the
cluster at a time, and takes in commands between exchanges, so a commit or a
close is not starved by a rebalance of many rounds. An exchange in progress
is not interrupted: ``close`` may wait for a JoinGroup the coordinator holds
(up to the rebalance timeout on Kafka).

Before each command the thread lets the machine see the time (a Tick): if the
thread itself was stalled past the session timeout (the process was stopped,
say), the partitions are declared lost before any commit could go out for a
generation that may have moved on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TypeVar

from ingest.client import BrokerConnection, ClientConfig, Cluster
from ingest.errors import (
    BrokerError,
    EncodeError,
    FencedError,
    GroupError,
    KafkaConnectionError,
    ProtocolError,
    UnsupportedVersionError,
)
from ingest.group import (
    Commit,
    CommitFailed,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorVersions,
    FetchCommitted,
    FindCoordinator,
    GroupConfig,
    GroupMachine,
    Input,
    Leave,
    MemberState,
    MetadataUpdate,
    NeedMetadata,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    Output,
    Partition,
    PartitionsRevoked,
    RequestFailed,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.protocol.codec import API_NAMES
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

__all__ = ["Event", "GroupMember", "MemberStatus", "check_commit"]

log = logging.getLogger("ingest.supervisor.membership")

# What poll() returns: the machine's events (its driver instructions never leave the thread).
Event = Output
A = TypeVar("A")
B = TypeVar("B")

_JOIN_SLACK = 5.0  # Kafka gives a JoinGroup the rebalance timeout plus 5 s
_IDLE_WAIT = 1.0  # the thread wakes at least this often, even with nothing due
_MIN_WAIT = 0.001
_TERMINAL = (MemberState.FENCED, MemberState.FAILED)
# Commit errors meaning "the group moved on without us": never resend, wait for an assignment.
_FENCING_ERRORS = frozenset(
    {
        "ILLEGAL_GENERATION",
        "UNKNOWN_MEMBER_ID",
        "FENCED_INSTANCE_ID",
        "REBALANCE_IN_PROGRESS",
        "NOT_A_MEMBER",  # refused by the machine: no active generation
    }
)


@dataclass(frozen=True)
class MemberStatus:
    """A consistent snapshot of the membership, published by the thread after every step."""

    state: MemberState
    generation_id: int
    member_id: str
    assignment: frozenset[Partition]
    is_leader: bool


def check_commit(outcome: OffsetsCommitted | CommitFailed) -> OffsetsCommitted:
    """``outcome`` if the commit succeeded; otherwise the error to raise for it.

    A fenced commit (the generation moved on, the member id or instance id was
    taken, a rebalance is under way) raises ``FencedError``: resending it as
    it is can never succeed and could commit for partitions now owned by
    another member. Commit again only what is still owned after the next
    PartitionsAssigned.
    """
    if isinstance(outcome, OffsetsCommitted):
        return outcome
    partitions = ", ".join(str(p) for p in sorted(outcome.offsets))
    text = f"OffsetCommit of {partitions} failed: {outcome.error_name}: {outcome.message}"
    if outcome.error_name in _FENCING_ERRORS:
        raise FencedError(text)
    raise GroupError(text + (" (retriable)" if outcome.retriable else ""))


_Reply = Future[Output] | None


@dataclass(frozen=True)
class _Command:
    """A machine input from the caller, with where its answer goes (None: the event queue)."""

    input: Input
    reply: _Reply = None


@dataclass(frozen=True)
class _Close:
    force: bool
    deadline: float


@dataclass(frozen=True)
class _Stopped:
    """The last item the thread puts on the event queue; ``error`` when it died of one."""

    error: BaseException | None


class GroupMember:
    """One consumer-group member; its membership runs on a thread of its own.

    Every public method is for the caller's thread (one caller thread: the
    supervisor's). ``client`` configures the connections the membership
    thread opens for itself; they are closed when the thread ends.
    """

    def __init__(self, client: ClientConfig, config: GroupConfig, *, name: str = "") -> None:
        self.client_config = client
        self.config = config
        self._commands: queue.SimpleQueue[_Command | _Close] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[Event | _Stopped] = queue.SimpleQueue()
        self._status = MemberStatus(MemberState.UNJOINED, -1, "", frozenset(), False)
        self._sent: Counter[int] = Counter()
        self._sent_lock = threading.Lock()
        self._closing = False
        self._stopped: _Stopped | None = None
        # Owned by the membership thread only:
        self._machine = GroupMachine(config)
        self._cluster: Cluster | None = None
        self._coordinator: BrokerConnection | None = None
        self._outputs: deque[Output] = deque()
        self._commit_replies: deque[tuple[Mapping[Partition, int], _Reply]] = deque()
        self._fetch_replies: deque[_Reply] = deque()
        self._unacknowledged_revocations = 0
        self._close: _Close | None = None
        self._metadata_wanted: frozenset[str] = frozenset()
        self._metadata_retry_at = 0.0
        self._thread = threading.Thread(
            target=self._run,
            name=f"membership-{name or config.group_instance_id or config.group_id}",
            daemon=True,
        )
        self._thread.start()

    def __enter__(self) -> GroupMember:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the caller's view ----------------------------------------------------------

    @property
    def status(self) -> MemberStatus:
        return self._status

    @property
    def state(self) -> MemberState:
        return self._status.state

    @property
    def generation_id(self) -> int:
        return self._status.generation_id

    @property
    def member_id(self) -> str:
        return self._status.member_id

    @property
    def assignment(self) -> frozenset[Partition]:
        return self._status.assignment

    @property
    def alive(self) -> bool:
        """Whether the membership thread still runs."""
        return self._thread.is_alive()

    def requests_sent(self, api_key: int) -> int:
        """How many requests of ``api_key`` went to the coordinator so far."""
        with self._sent_lock:
            return self._sent[api_key]

    def requests_sent_by_api(self) -> dict[int, int]:
        """Requests sent to the coordinator so far, per API key (the run exports them as
        ``ingest_group_requests_total``: a JoinGroup storm or missing heartbeats show)."""
        with self._sent_lock:
            return dict(self._sent)

    # -- commands -------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join (or change the subscription to) ``topics``; the join happens on the thread."""
        self._put(_Command(Subscribe(frozenset(topics))))

    def revocation_done(self) -> None:
        """Acknowledge one PartitionsRevoked, once its partitions are committed and stopped."""
        self._put(_Command(RevocationDone()))

    def commit(
        self,
        offsets: Mapping[Partition, int],
        metadata: str | None = None,
        *,
        timeout: float | None = None,
    ) -> OffsetsCommitted | CommitFailed:
        """Commit ``offsets`` (next offset to read) and wait for the outcome.

        A failed commit is never resent by the driver; see ``check_commit``.
        """
        reply: Future[Output] = Future()
        self._put(_Command(Commit(offsets, metadata), reply))
        return self._answer(reply, timeout, OffsetsCommitted, CommitFailed)

    def commit_async(self, offsets: Mapping[Partition, int], metadata: str | None = None) -> None:
        """Commit without waiting; the OffsetsCommitted or CommitFailed comes from ``poll``."""
        self._put(_Command(Commit(offsets, metadata)))

    def fetch_committed(
        self, partitions: Iterable[Partition], *, timeout: float | None = None
    ) -> OffsetsFetched | OffsetFetchFailed:
        """The group's committed offsets for ``partitions`` (OffsetFetch)."""
        reply: Future[Output] = Future()
        self._put(_Command(FetchCommitted(frozenset(partitions)), reply))
        return self._answer(reply, timeout, OffsetsFetched, OffsetFetchFailed)

    def poll(self, timeout: float) -> list[Event]:
        """Events so far, waiting up to ``timeout`` seconds for the first one.

        Raises ``GroupError`` once the membership thread has died of an error
        (after the events it produced before dying were returned).
        """
        self._raise_if_failed()
        events: list[Event] = []
        try:
            item = self._events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return events
        while True:
            if isinstance(item, _Stopped):
                self._stopped = item
                break
            events.append(item)
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                break
        if not events:
            self._raise_if_failed()
        return events

    def close(self, *, force: bool = False, timeout: float | None = None) -> list[Event]:
        """Leave the group and stop the membership thread; returns the undelivered events.

        The caller must have committed what it wants kept: revocations still
        pending are acknowledged by the thread. Dynamic members send
        LeaveGroup; static members do not (so a restart within the session
        timeout keeps the assignment) unless ``force`` or ``leave_on_close``.
        """
        if timeout is None:
            timeout = self.client_config.request_timeout + 5.0
        if not self._closing and self._thread.is_alive():
            self._closing = True
            self._commands.put(_Close(force, time.monotonic() + timeout))
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise GroupError(
                f"group {self.config.group_id!r}: the membership thread did not stop "
                f"within {timeout:.3g}s"
            )
        events: list[Event] = []
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, _Stopped):
                self._stopped = item
            else:
                events.append(item)
        return events

    def _put(self, command: _Command) -> None:
        if self._closing or not self._thread.is_alive():
            self._raise_if_failed()
            raise GroupError(f"group {self.config.group_id!r}: the member is closed")
        self._commands.put(command)

    def _answer(
        self, reply: Future[Output], timeout: float | None, ok: type[A], failed: type[B]
    ) -> A | B:
        end = None if timeout is None else time.monotonic() + timeout
        while True:
            # In slices: a command that raced with the thread's end would never be answered.
            left = _IDLE_WAIT if end is None else min(end - time.monotonic(), _IDLE_WAIT)
            try:
                result = reply.result(max(left, 0.0))
                break
            except TimeoutError:
                if not self._thread.is_alive() and not reply.done():
                    self._raise_if_failed()
                    raise GroupError(
                        f"group {self.config.group_id!r}: the membership thread stopped"
                    ) from None
                if end is not None and time.monotonic() >= end:
                    raise
        if isinstance(result, ok):
            return result
        if isinstance(result, failed):
            return result
        raise AssertionError(f"expected {ok.__name__} or {failed.__name__}, got {result!r}")

    def _raise_if_failed(self) -> None:
        stopped = self._stopped
        if stopped is not None and stopped.error is not None:
            raise GroupError(
                f"group {self.config.group_id!r}: the membership thread failed: {stopped.error!r}"
            ) from stopped.error

    # -- the membership thread ----------------------------------------------------------

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            self._cluster = Cluster(self.client_config)
            while not self._finished():
                command = self._wait_for_command()
                # See the module docstring: time first, so a stall is noticed before a commit.
                self._handle(Tick())
                while command is not None:
                    self._apply(command)
                    try:
                        command = self._commands.get_nowait()
                    except queue.Empty:
                        command = None
                if not self._outputs:
                    update = self._fetch_metadata()
                    if update is not None:
                        self._handle(update)
                self._step()
        except BaseException as exc:
            error = exc
            log.exception("group %r: the membership thread failed", self.config.group_id)
        finally:
            self._stop_thread(error)

    def _finished(self) -> bool:
        close = self._close
        if close is None:
            return False
        if time.monotonic() > close.deadline:
            return True
        state = self._machine.state
        return not self._outputs and (state is MemberState.UNJOINED or state in _TERMINAL)

    def _wait_for_command(self) -> _Command | _Close | None:
        now = time.monotonic()
        wake = now + _IDLE_WAIT
        deadline = self._machine.next_deadline()
        if deadline is not None:
            wake = min(wake, deadline)
        if self._metadata_wanted:
            wake = min(wake, self._metadata_retry_at)
        if self._close is not None:
            wake = min(wake, self._close.deadline)
        try:
            if self._outputs:  # work is waiting: only look for commands
                return self._commands.get_nowait()
            return self._commands.get(timeout=max(wake - now, _MIN_WAIT))
        except queue.Empty:
            return None

    def _apply(self, command: _Command | _Close) -> None:
        if isinstance(command, _Close):
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
        if isinstance(event, Commit):
            self._commit_replies.append((event.offsets, command.reply))
        elif isinstance(event, FetchCommitted):
            self._fetch_replies.append(command.reply)
        self._handle(event)

    def _acknowledge_revocation(self) -> None:
        self._unacknowledged_revocations -= 1
        self._handle(RevocationDone())

    def _handle(self, event: Input) -> None:
        """Hand ``event`` to the machine; its outputs wait in order for ``_step``."""
        outputs = self._machine.handle(event, time.monotonic())
        self._unacknowledged_revocations += sum(isinstance(o, PartitionsRevoked) for o in outputs)
        self._outputs.extend(outputs)
        machine = self._machine
        self._status = MemberStatus(
            machine.state,
            machine.generation_id,
            machine.member_id,
            machine.assignment,
            machine.is_leader,
        )

    def _step(self) -> None:
        """Act on the outputs in order, up to and including one exchange with the cluster.

        One exchange at a time, so that commands get in between the requests
        of a rebalance that takes many rounds; acting later than the machine
        emitted is the same, to it, as a command arriving while in flight.
        """
        while self._outputs:
            output = self._outputs.popleft()
            if isinstance(output, SendRequest):
                self._send(output)
                return
            if isinstance(output, FindCoordinator):
                self._find_coordinator()
                return
            if isinstance(output, NeedMetadata):
                self._metadata_wanted = output.topics
                self._metadata_retry_at = 0.0
                update = self._fetch_metadata()
                if update is not None:
                    self._handle(update)
                return
            self._deliver(output)

    def _deliver(self, event: Event) -> None:
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

    def _send(self, output: SendRequest) -> None:
        request = output.request
        api_key = type(request).api_key
        connection = self._coordinator
        if connection is None:
            self._handle(RequestFailed(api_key, "no coordinator connection"))
            return
        request_timeout = self.client_config.request_timeout
        timeout = request_timeout
        if isinstance(request, JoinGroupRequest):
            timeout = max(self.config.rebalance_timeout_ms / 1000, request_timeout) + _JOIN_SLACK
        elif isinstance(request, HeartbeatRequest):
            # An answer later than the session timeout is worthless: the session is over.
            timeout = min(request_timeout, self.config.session_timeout_ms / 1000)
        with self._sent_lock:
            self._sent[api_key] += 1
        try:
            response = connection.request(request, version=output.version, timeout=timeout)
        except (KafkaConnectionError, ProtocolError) as exc:
            if isinstance(exc, UnsupportedVersionError | EncodeError):
                raise  # our bug or a coordinator we cannot talk to: retrying cannot help
            connection.close(str(exc))
            self._coordinator = None
            log.info("group %r: %s failed: %s", self.config.group_id, API_NAMES[api_key], exc)
            self._handle(RequestFailed(api_key, str(exc)))
            return
        if log.isEnabledFor(logging.DEBUG):
            log.debug("group %r: %r -> %r", self.config.group_id, request, response)
        self._handle(response)  # type: ignore[arg-type]  # the response to our group request

    def _find_coordinator(self) -> None:
        cluster = self._cluster
        assert cluster is not None
        try:
            broker = cluster.find_coordinator(self.config.group_id)
            connection = cluster.connection(broker.node_id)
            versions = CoordinatorVersions(
                join_group=connection.version_for(JoinGroupRequest.api_key),
                sync_group=connection.version_for(SyncGroupRequest.api_key),
                heartbeat=connection.version_for(HeartbeatRequest.api_key),
                leave_group=connection.version_for(LeaveGroupRequest.api_key),
                offset_commit=connection.version_for(OffsetCommitRequest.api_key),
                offset_fetch=connection.version_for(OffsetFetchRequest.api_key),
            )
        except UnsupportedVersionError:
            raise  # no common version: nothing to retry
        except BrokerError as exc:
            self._handle(CoordinatorLookupFailed(exc.code, str(exc)))
            return
        except (KafkaConnectionError, ProtocolError) as exc:
            self._handle(CoordinatorLookupFailed(None, str(exc)))
            return
        self._coordinator = connection
        self._handle(CoordinatorFound(broker.node_id, broker.host, broker.port, versions))

    def _fetch_metadata(self) -> MetadataUpdate | None:
        """The answer to the leader's NeedMetadata, when due; a failure retries after a backoff."""
        wanted = self._metadata_wanted
        if not wanted or time.monotonic() < self._metadata_retry_at:
            return None
        cluster = self._cluster
        assert cluster is not None
        names = sorted(wanted)
        try:
            view = cluster.refresh_metadata(names)
        except (BrokerError, KafkaConnectionError, ProtocolError) as exc:
            log.info("group %r: metadata for %s failed: %s", self.config.group_id, names, exc)
            self._metadata_retry_at = time.monotonic() + self.config.retry_backoff_ms / 1000
            return None
        self._metadata_wanted = frozenset()
        counts: dict[str, int] = {}
        for name in names:
            info = view.topic(name)
            counts[name] = len(info.partitions) if info is not None and not info.error_code else 0
        return MetadataUpdate(counts)

    def _stop_thread(self, error: BaseException | None) -> None:
        failure = error if error is not None else GroupError("the membership thread stopped")
        if error is None:
            # Events the close deadline cut short still reach the caller; requests are dropped.
            for output in self._outputs:
                if not isinstance(output, SendRequest | FindCoordinator | NeedMetadata):
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
            if isinstance(late, _Command) and late.reply is not None:
                late.reply.set_exception(failure)
        if self._cluster is not None:
            self._cluster.close()
        self._events.put(_Stopped(error))
