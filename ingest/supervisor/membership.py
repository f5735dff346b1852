"""Group membership over a real cluster: the I/O driver of ``ingest.group.GroupMachine``.

``GroupMember`` owns one machine and does what its outputs ask: requests to
the coordinator (blocking, one at a time, on the coordinator connection),
coordinator lookups and metadata refreshes through ``ingest.client.Cluster``.
It returns the machine's events to the caller.

It is single-threaded, like the Cluster under it: call ``poll`` at least once
per heartbeat interval. A JoinGroup blocks until the rebalance completes (up
to the rebalance timeout); no heartbeats are due meanwhile.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from ingest.client import BrokerConnection, Cluster
from ingest.errors import BrokerError, KafkaConnectionError, ProtocolError
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
from ingest.protocol.messages import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

__all__ = ["GroupMember"]

# Events the application sees; the rest are instructions for this driver.
Event = Output
_JOIN_SLACK = 5.0
A = TypeVar("A")
B = TypeVar("B")  # Kafka gives JoinGroup the rebalance timeout plus 5 s


class GroupMember:
    """One consumer-group member over ``cluster``. Not thread-safe."""

    def __init__(
        self,
        cluster: Cluster,
        config: GroupConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.cluster = cluster
        self.config = config
        self.machine = GroupMachine(config)
        self._clock = clock
        self._sleep = sleep
        self._coordinator: BrokerConnection | None = None
        self._todo: deque[Output] = deque()
        self._events: list[Event] = []

    @property
    def state(self) -> MemberState:
        return self.machine.state

    @property
    def assignment(self) -> frozenset[Partition]:
        return self.machine.assignment

    # -- commands -------------------------------------------------------------------

    def subscribe(self, topics: Iterable[str]) -> list[Event]:
        self._feed(Subscribe(frozenset(topics)))
        return self._take_events()

    def poll(self, timeout: float) -> list[Event]:
        """Run the membership for up to ``timeout`` seconds; return as soon as there are events."""
        end = self._clock() + timeout
        while True:
            self._feed(Tick())
            if self._events:
                return self._take_events()
            now = self._clock()
            if now >= end:
                return []
            deadline = self.machine.next_deadline()
            wake = end if deadline is None else min(max(deadline, now + 0.001), end)
            self._sleep(wake - now)

    def revocation_done(self) -> list[Event]:
        """Acknowledge one PartitionsRevoked (after its partitions were committed and stopped)."""
        self._feed(RevocationDone())
        return self._take_events()

    def commit(
        self, offsets: Mapping[Partition, int], metadata: str | None = None
    ) -> OffsetsCommitted | CommitFailed:
        """Commit synchronously; other events that happen meanwhile wait for the next poll."""
        self._feed(Commit(offsets, metadata))
        return self._take_first(OffsetsCommitted, CommitFailed)

    def fetch_committed(
        self, partitions: Iterable[Partition]
    ) -> OffsetsFetched | OffsetFetchFailed:
        self._feed(FetchCommitted(frozenset(partitions)))
        return self._take_first(OffsetsFetched, OffsetFetchFailed)

    def leave(self, *, force: bool = False, timeout: float = 10.0) -> list[Event]:
        """Leave the group, acknowledging our own revocations; returns the events on the way."""
        self._feed(Leave(force=force))
        events: list[Event] = []
        end = self._clock() + timeout
        while self.machine.state is not MemberState.UNJOINED and self._clock() < end:
            batch = self._take_events()
            events += batch
            revoked = [e for e in batch if isinstance(e, PartitionsRevoked)]
            for _ in revoked:
                self._feed(RevocationDone())
            if self.machine.state in (MemberState.FENCED, MemberState.FAILED):
                break
            if not revoked:
                events += self.poll(min(0.1, max(end - self._clock(), 0.0)))
        return events + self._take_events()

    # -- the loop -------------------------------------------------------------------

    def _feed(self, event: Input) -> None:
        self._todo.extend(self.machine.handle(event, self._clock()))
        while self._todo:
            output = self._todo.popleft()
            if isinstance(output, SendRequest):
                self._send(output)
            elif isinstance(output, FindCoordinator):
                self._find_coordinator()
            elif isinstance(output, NeedMetadata):
                self._refresh_metadata(output.topics)
            else:
                self._events.append(output)

    def _handle(self, event: Input) -> None:
        self._todo.extend(self.machine.handle(event, self._clock()))

    def _send(self, output: SendRequest) -> None:
        api_key = type(output.request).api_key
        connection = self._coordinator
        if connection is None:
            self._handle(RequestFailed(api_key, "no coordinator connection"))
            return
        timeout = None
        if isinstance(output.request, JoinGroupRequest):
            timeout = (
                max(self.config.rebalance_timeout_ms / 1000, self.cluster.config.request_timeout)
                + _JOIN_SLACK
            )
        try:
            response = connection.request(output.request, version=output.version, timeout=timeout)
        except (KafkaConnectionError, ProtocolError) as exc:
            connection.close(str(exc))
            self._coordinator = None
            self._handle(RequestFailed(api_key, str(exc)))
            return
        self._handle(response)  # type: ignore[arg-type]  # the response to our group request

    def _find_coordinator(self) -> None:
        try:
            broker = self.cluster.find_coordinator(self.config.group_id)
            connection = self.cluster.connection(broker.node_id)
            versions = CoordinatorVersions(
                join_group=connection.version_for(JoinGroupRequest.api_key),
                sync_group=connection.version_for(SyncGroupRequest.api_key),
                heartbeat=connection.version_for(HeartbeatRequest.api_key),
                leave_group=connection.version_for(LeaveGroupRequest.api_key),
                offset_commit=connection.version_for(OffsetCommitRequest.api_key),
                offset_fetch=connection.version_for(OffsetFetchRequest.api_key),
            )
        except BrokerError as exc:
            self._handle(CoordinatorLookupFailed(exc.code, str(exc)))
            return
        except (KafkaConnectionError, ProtocolError) as exc:
            self._handle(CoordinatorLookupFailed(None, str(exc)))
            return
        self._coordinator = connection
        self._handle(CoordinatorFound(broker.node_id, broker.host, broker.port, versions))

    def _refresh_metadata(self, topics: Iterable[str]) -> None:
        wanted = sorted(topics)
        view = self.cluster.refresh_metadata(wanted)
        counts: dict[str, int] = {}
        for name in wanted:
            info = view.topic(name)
            counts[name] = len(info.partitions) if info is not None and not info.error_code else 0
        self._handle(MetadataUpdate(counts))

    def _take_events(self) -> list[Event]:
        events, self._events = self._events, []
        return events

    def _take_first(self, answer: type[A], failure: type[B]) -> A | B:
        for index, event in enumerate(self._events):
            if isinstance(event, answer | failure):
                del self._events[index]
                return event
        raise AssertionError(
            f"the machine answered neither {answer.__name__} nor {failure.__name__}"
        )
