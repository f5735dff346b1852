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

This module is the caller's side; the thread's loop is ``driver.py``
and its exchanges with the cluster ``link.py``.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future
from typing import TypeVar

from ingest.client import ClientConfig
from ingest.errors import FencedError, GroupError
from ingest.group import (
    Commit,
    CommitFailed,
    ConsumerGroupConfig,
    FetchCommitted,
    GroupConfig,
    MemberState,
    OffsetFetchFailed,
    OffsetsCommitted,
    OffsetsFetched,
    Output,
    RevocationDone,
    Subscribe,
)
from ingest.membership.driver import (
    IDLE_WAIT,
    Close,
    Command,
    MembershipThread,
    MemberStatus,
    PatternWatch,
    Stopped,
)
from ingest.processes import start_thread
from ingest.protocol.partition import Partition

__all__ = ["Event", "GroupMember", "MemberStatus", "check_commit"]

# What poll() returns: the machine's events (its driver instructions never leave the thread).
Event = Output


class _NotifyingQueue(queue.SimpleQueue["Event | Stopped"]):
    """The events queue, calling ``notify`` after each put (``notify`` of ``GroupMember``:
    the caller's loop wakes up for the event)."""

    def __init__(self, notify: Callable[[], None]) -> None:
        self._notify = notify

    def put(self, item: Event | Stopped, block: bool = True, timeout: float | None = None) -> None:
        super().put(item, block, timeout)
        self._notify()


A = TypeVar("A")
B = TypeVar("B")

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


class GroupMember:
    """One consumer-group member; its membership runs on a thread of its own.

    Every public method is for the caller's thread (one caller thread: the
    supervisor's). ``client`` configures the connections the membership
    thread opens for itself; they are closed when the thread ends. With
    ``topic_pattern`` the thread lists the cluster's topics every
    ``pattern_refresh`` seconds and subscribes to those the pattern matches.
    """

    def __init__(
        self,
        client: ClientConfig,
        config: GroupConfig | ConsumerGroupConfig,
        *,
        name: str = "",
        notify: Callable[[], None] | None = None,
        topic_pattern: str | None = None,
        pattern_refresh: float = 300.0,
    ) -> None:
        self.client_config = client
        self.config = config
        self._commands: queue.SimpleQueue[Command | Close] = queue.SimpleQueue()
        self._events: queue.SimpleQueue[Event | Stopped] = (
            queue.SimpleQueue() if notify is None else _NotifyingQueue(notify)
        )
        self._closing = False
        self._stopped: Stopped | None = None
        # Everything the membership thread owns (the machine, the cluster connections):
        watch = PatternWatch(topic_pattern, pattern_refresh) if topic_pattern else None
        self._membership = MembershipThread(client, config, self._commands, self._events, watch)
        self._thread = start_thread(
            f"membership-{name or config.group_instance_id or config.group_id}",
            self._membership.run,
        )

    def __enter__(self) -> GroupMember:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the caller's view ----------------------------------------------------------

    @property
    def status(self) -> MemberStatus:
        return self._membership.status

    @property
    def state(self) -> MemberState:
        return self._membership.status.state

    @property
    def generation_id(self) -> int:
        return self._membership.status.generation_id

    @property
    def member_id(self) -> str:
        return self._membership.status.member_id

    @property
    def assignment(self) -> frozenset[Partition]:
        return self._membership.status.assignment

    @property
    def alive(self) -> bool:
        """Whether the membership thread still runs."""
        return self._thread.is_alive()

    def requests_sent(self, api_key: int) -> int:
        """How many requests of ``api_key`` went to the coordinator so far."""
        return self._membership.link.requests_sent(api_key)

    def requests_sent_by_api(self) -> dict[int, int]:
        """Requests sent to the coordinator so far, per API key (the run exports them as
        ``ingest_group_requests_total``: a JoinGroup storm or missing heartbeats show)."""
        return self._membership.link.requests_sent_by_api()

    # -- commands -------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> None:
        """Join (or change the subscription to) ``topics``; the join happens on the thread."""
        self._put(Command(Subscribe(frozenset(topics))))

    def revocation_done(self) -> None:
        """Acknowledge one PartitionsRevoked, once its partitions are committed and stopped."""
        self._put(Command(RevocationDone()))

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
        self._put(Command(Commit(offsets, metadata), reply))
        return self._answer(reply, timeout, OffsetsCommitted, CommitFailed)

    def commit_async(
        self,
        offsets: Mapping[Partition, int],
        metadata: str | None = None,
        leader_epochs: Mapping[Partition, int] | None = None,
        *,
        generation: int | None = None,
    ) -> None:
        """Commit without waiting; the OffsetsCommitted or CommitFailed comes from ``poll``.
        ``generation``: the one the caller owns the partitions in (``Commit``)."""
        self._put(Command(Commit(offsets, metadata, leader_epochs or {}, generation)))

    def fetch_committed(
        self, partitions: Iterable[Partition], *, timeout: float | None = None
    ) -> OffsetsFetched | OffsetFetchFailed:
        """The group's committed offsets for ``partitions`` (OffsetFetch)."""
        reply: Future[Output] = Future()
        self._put(Command(FetchCommitted(frozenset(partitions)), reply))
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
            if isinstance(item, Stopped):
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
            self._commands.put(Close(force, time.monotonic() + timeout))
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
            if isinstance(item, Stopped):
                self._stopped = item
            else:
                events.append(item)
        return events

    def _put(self, command: Command) -> None:
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
            left = IDLE_WAIT if end is None else min(end - time.monotonic(), IDLE_WAIT)
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
