"""The cluster as one client sees it: bootstrap, metadata, leader cache, coordinators.

``Cluster`` keeps one ``BrokerConnection`` per broker address and, like the
connections, is single-owner and starts no thread. Retriable failures
(``BrokerError.retriable`` and ``KafkaConnectionError``) are retried with
backoff for up to ``retry_timeout``; the leader cache is dropped for a topic
when a broker answers NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE (or a leader-epoch error) for it, and for every topic led
by a broker whose connection was lost.
"""

from __future__ import annotations

import logging
import random
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from ingest.client.backoff import Backoff
from ingest.client.config import ClientConfig
from ingest.client.connection import BrokerConnection, InFlight, expect_response
from ingest.errors import BrokerError, KafkaConnectionError, ProtocolError
from ingest.protocol.error_codes import ErrorCode, error_for, raise_for_error
from ingest.protocol.messages import (
    COORDINATOR_GROUP,
    LATEST_TIMESTAMP,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
)
from ingest.protocol.schema import Request, Response

__all__ = [
    "COORDINATOR_RETRY_ERRORS",
    "LEADER_ERRORS",
    "BrokerInfo",
    "Cluster",
    "ClusterView",
    "ListedOffset",
    "PartitionInfo",
    "TopicInfo",
    "TopicPartition",
]

log = logging.getLogger("ingest.client")

T = TypeVar("T")

READ_UNCOMMITTED = 0
READ_COMMITTED = 1

# Errors meaning "your metadata is stale": refresh the leader, then retry.
LEADER_ERRORS = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
    }
)
COORDINATOR_RETRY_ERRORS = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NOT_COORDINATOR,
    }
)


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"topic {self.topic} partition {self.partition}"


@dataclass(frozen=True, slots=True)
class BrokerInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None

    @property
    def address(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class PartitionInfo:
    topic: str
    partition: int
    leader_id: int  # -1: no leader right now
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    offline_replicas: tuple[int, ...]
    error_code: int = 0


@dataclass(frozen=True, slots=True)
class TopicInfo:
    name: str
    topic_id: uuid.UUID
    is_internal: bool
    partitions: tuple[PartitionInfo, ...]  # sorted by partition
    error_code: int = 0

    def partition(self, index: int) -> PartitionInfo | None:
        for info in self.partitions:
            if info.partition == index:
                return info
        return None


@dataclass(frozen=True, slots=True)
class ClusterView:
    """One Metadata answer: brokers, controller and the topics asked for."""

    cluster_id: str | None
    controller_id: int
    brokers: tuple[BrokerInfo, ...]  # sorted by node id
    topics: tuple[TopicInfo, ...]  # in the broker's order

    def broker(self, node_id: int) -> BrokerInfo | None:
        for broker in self.brokers:
            if broker.node_id == node_id:
                return broker
        return None

    def topic(self, name: str) -> TopicInfo | None:
        for topic in self.topics:
            if topic.name == name:
                return topic
        return None


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp: int
    leader_epoch: int


def view_from_metadata(response: MetadataResponse) -> ClusterView:
    brokers = tuple(
        sorted(
            (BrokerInfo(b.node_id, b.host, b.port, b.rack) for b in response.brokers),
            key=lambda b: b.node_id,
        )
    )
    topics = []
    for topic in response.topics:
        name = topic.name or ""
        partitions = tuple(
            sorted(
                (
                    PartitionInfo(
                        topic=name,
                        partition=p.partition_index,
                        leader_id=p.leader_id,
                        leader_epoch=p.leader_epoch,
                        replicas=p.replica_nodes,
                        isr=p.isr_nodes,
                        offline_replicas=p.offline_replicas,
                        error_code=p.error_code,
                    )
                    for p in topic.partitions
                ),
                key=lambda p: p.partition,
            )
        )
        topics.append(
            TopicInfo(
                name=name,
                topic_id=topic.topic_id,
                is_internal=topic.is_internal,
                partitions=partitions,
                error_code=topic.error_code,
            )
        )
    return ClusterView(
        cluster_id=response.cluster_id,
        controller_id=response.controller_id,
        brokers=brokers,
        topics=tuple(topics),
    )


class Cluster:
    """Connections, metadata and the leader cache of one Kafka cluster. Single-owner."""

    def __init__(
        self,
        config: ClientConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self.config = config
        self._clock = clock
        self._sleep = sleep
        self._rand = rand
        self._connections: dict[tuple[str, int], BrokerConnection] = {}
        self._brokers: dict[int, BrokerInfo] = {}
        self._topics: dict[str, TopicInfo] = {}
        self._refreshed_at: dict[str, float] = {}
        self._stale: set[str] = set()
        self.cluster_id: str | None = None
        self.controller_id = -1
        self._metadata_source = "Metadata"  # who answered the last Metadata, for errors

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Cluster(bootstrap={self.config.bootstrap_servers!r}, brokers={len(self._brokers)}, "
            f"topics={len(self._topics)}, connections={len(self._connections)})"
        )

    def close(self) -> None:
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    # -- connections ------------------------------------------------------------------

    def _connection_for(self, host: str, port: int, node_id: int | None) -> BrokerConnection:
        connection = self._connections.get((host, port))
        if connection is None:
            connection = BrokerConnection(
                host,
                port,
                self.config,
                node_id=node_id,
                clock=self._clock,
                sleep=self._sleep,
                rand=self._rand,
            )
            self._connections[(host, port)] = connection
        elif node_id is not None:
            connection.node_id = node_id
        return connection

    def connection(self, node_id: int) -> BrokerConnection:
        """A connected connection to broker ``node_id`` (reconnecting with backoff)."""
        broker = self._brokers.get(node_id)
        if broker is None:
            raise KafkaConnectionError(f"broker node {node_id} is not in the cluster metadata")
        connection = self._connection_for(broker.host, broker.port, node_id)
        try:
            connection.ensure_connected()
        except KafkaConnectionError:
            self._connection_lost(connection)
            raise
        return connection

    def any_connection(self) -> BrokerConnection:
        """A connected connection to some broker: an open one, else the first that answers.

        Known brokers are tried before the bootstrap servers, in order.
        """
        for connection in self._connections.values():
            if connection.connected:
                return connection
        candidates: list[tuple[str, int, int | None]] = [
            (b.host, b.port, b.node_id) for b in self._brokers.values()
        ]
        candidates += [(h, p, None) for h, p in self.config.bootstrap_addresses]
        seen: set[tuple[str, int]] = set()
        failures: list[str] = []
        for host, port, node_id in candidates:
            if (host, port) in seen:
                continue
            seen.add((host, port))
            connection = self._connection_for(host, port, node_id)
            try:
                connection.ensure_connected()
            except KafkaConnectionError as exc:
                failures.append(str(exc))
                if not exc.retriable:
                    raise
                continue
            return connection
        raise KafkaConnectionError(
            "no broker answered: " + "; ".join(failures) if failures else "no broker known"
        )

    def _connection_lost(self, connection: BrokerConnection) -> None:
        """Closes it and marks every topic it leads stale."""
        connection.close()
        lost = {
            node_id
            for node_id, broker in self._brokers.items()
            if (broker.host, broker.port) == (connection.host, connection.port)
        }
        for name, topic in self._topics.items():
            if any(p.leader_id in lost for p in topic.partitions):
                self._stale.add(name)

    def send(self, connection: BrokerConnection, request: Request) -> InFlight:
        try:
            return connection.send(request)
        except KafkaConnectionError:
            self._connection_lost(connection)
            raise

    def receive(self, connection: BrokerConnection, ticket: InFlight) -> Response:
        try:
            return connection.receive(ticket)
        except (KafkaConnectionError, ProtocolError):
            self._connection_lost(connection)
            raise

    def request(self, connection: BrokerConnection, request: Request) -> Response:
        """One request; a lost connection marks the topics it leads stale."""
        return self.receive(connection, self.send(connection, request))

    # -- retries ------------------------------------------------------------------------

    def retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """Runs ``attempt`` until it succeeds, a fatal error, or ``retry_timeout`` passes.

        Broker errors wait the retry backoff; connection errors retry at once
        (the connection's own reconnect backoff spaces them).
        """
        deadline = self._clock() + self.config.retry_timeout
        backoff = Backoff(
            self.config.retry_backoff,
            self.config.retry_backoff_max,
            jitter=self.config.backoff_jitter,
            clock=self._clock,
            rand=self._rand,
        )
        attempts = 0
        while True:
            attempts += 1
            try:
                return attempt()
            except (BrokerError, KafkaConnectionError) as exc:
                if not exc.retriable:
                    raise
                wait = backoff.failed() if isinstance(exc, BrokerError) else 0.0
                if self._clock() + wait >= deadline:
                    log.warning("%s: giving up after %d attempts: %s", what, attempts, exc)
                    raise
                log.debug("%s: retrying in %.3fs after: %s", what, wait, exc)
                if wait > 0:
                    self._sleep(wait)

    # -- metadata -----------------------------------------------------------------------

    @property
    def brokers(self) -> dict[int, BrokerInfo]:
        return dict(self._brokers)

    def topic(self, name: str) -> TopicInfo | None:
        """The cached metadata of ``name`` (None if never fetched)."""
        return self._topics.get(name)

    def bootstrap(self) -> ClusterView:
        """Connects to the first bootstrap server that answers and learns the brokers."""
        return self.refresh_metadata(())

    def refresh_metadata(self, topics: Iterable[str] | None) -> ClusterView:
        """Fetches metadata for ``topics`` (None: every topic) and updates the cache."""
        wanted = None if topics is None else tuple(dict.fromkeys(topics))
        return self.retrying("Metadata", lambda: self._fetch_metadata(wanted))

    def _fetch_metadata(self, topics: tuple[str, ...] | None) -> ClusterView:
        connection = self.any_connection()
        request = MetadataRequest(
            topics=None
            if topics is None
            else tuple(MetadataRequestTopic(name=name) for name in topics),
            allow_auto_topic_creation=self.config.allow_auto_topic_creation,
        )
        ticket = self.send(connection, request)
        context = f"{connection.describe()}, Metadata v{ticket.version}"
        response = expect_response(self.receive(connection, ticket), MetadataResponse, context)
        view = view_from_metadata(response)
        self._apply(view, connection)
        # Named after _apply, which learns the node id of a bootstrap connection.
        self._metadata_source = f"{connection.describe()}, Metadata v{ticket.version}"
        return view

    def _apply(self, view: ClusterView, source: BrokerConnection) -> None:
        now = self._clock()
        self.cluster_id = view.cluster_id
        self.controller_id = view.controller_id
        if view.brokers:
            self._brokers = {b.node_id: b for b in view.brokers}
        for broker in view.brokers:
            if (broker.host, broker.port) == (source.host, source.port):
                source.node_id = broker.node_id
        for topic in view.topics:
            self._topics[topic.name] = topic
            self._refreshed_at[topic.name] = now
            self._stale.discard(topic.name)
        # Connections to brokers that left the cluster are closed.
        addresses = {(b.host, b.port) for b in view.brokers}
        for key, connection in list(self._connections.items()):
            if view.brokers and key not in addresses and connection is not source:
                connection.close()
                del self._connections[key]

    def invalidate(self, topic: str) -> None:
        """Marks ``topic``'s leaders stale: the next lookup refreshes them."""
        self._stale.add(topic)

    def note_error(self, code: int, topic: str) -> bool:
        """Acts on a partition error code; returns whether the request may be retried."""
        if code in LEADER_ERRORS:
            self.invalidate(topic)
        return error_for(code).retriable

    def _fresh(self, topic: str) -> TopicInfo | None:
        info = self._topics.get(topic)
        if info is None or topic in self._stale:
            return None
        if self._clock() - self._refreshed_at.get(topic, 0.0) > self.config.metadata_max_age:
            return None
        return info

    def leader(self, topic: str, partition: int) -> BrokerInfo:
        """The leader of (topic, partition), from the cache or a metadata refresh.

        Raises a retriable BrokerError when there is no usable leader; callers
        inside ``retrying`` get it retried.
        """
        info = self._fresh(topic)
        if info is None or self._leader_of(info, partition) is None:
            self._fetch_metadata((topic,))
            info = self._topics.get(topic, None)
        context = f"{self._metadata_source}, {TopicPartition(topic, partition)}"
        if info is None or info.error_code:
            code = info.error_code if info is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            self.invalidate(topic)
            raise_for_error(code, context=context)
            raise AssertionError("unreachable")  # pragma: no cover
        leader = self._leader_of(info, partition)
        if leader is None:
            self.invalidate(topic)
            known = info.partition(partition)
            if known is None:
                missing: int = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            elif known.error_code:
                missing = known.error_code
            else:
                missing = ErrorCode.LEADER_NOT_AVAILABLE
            raise_for_error(missing, context=context)
            raise AssertionError("unreachable")  # pragma: no cover
        return leader

    def _leader_of(self, info: TopicInfo, partition: int) -> BrokerInfo | None:
        known = info.partition(partition)
        if known is None or known.leader_id < 0:
            return None
        return self._brokers.get(known.leader_id)

    def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        return self.connection(self.leader(topic, partition).node_id)

    # -- ListOffsets ------------------------------------------------------------------

    def list_offsets(
        self,
        timestamps: Mapping[TopicPartition, int],
        *,
        isolation_level: int = READ_COMMITTED,
    ) -> dict[TopicPartition, ListedOffset]:
        """ListOffsets for each partition (timestamp, or EARLIEST/LATEST_TIMESTAMP).

        Requests to different leaders are pipelined; partitions whose leader
        moved are retried after a metadata refresh.
        """
        pending = {TopicPartition(*tp): ts for tp, ts in timestamps.items()}
        results: dict[TopicPartition, ListedOffset] = {}

        def attempt() -> dict[TopicPartition, ListedOffset]:
            by_node: dict[int, list[TopicPartition]] = {}
            for tp in pending:
                by_node.setdefault(self.leader(tp.topic, tp.partition).node_id, []).append(tp)
            sent: list[tuple[BrokerConnection, InFlight, list[TopicPartition]]] = []
            try:
                for node_id, tps in by_node.items():
                    connection = self.connection(node_id)
                    request = ListOffsetsRequest(
                        isolation_level=isolation_level,
                        topics=tuple(
                            ListOffsetsTopic(
                                name=name,
                                partitions=tuple(
                                    ListOffsetsPartition(
                                        partition_index=tp.partition, timestamp=pending[tp]
                                    )
                                    for tp in tps
                                    if tp.topic == name
                                ),
                            )
                            for name in dict.fromkeys(tp.topic for tp in tps)
                        ),
                    )
                    sent.append((connection, self.send(connection, request), tps))
            except BaseException:
                for connection, ticket, _ in sent:
                    connection.abandon(ticket)
                raise
            received: list[tuple[str, ListOffsetsResponse, list[TopicPartition]]] = []
            try:
                for connection, ticket, tps in sent:
                    context = f"{connection.describe()}, ListOffsets v{ticket.version}"
                    response = self.receive(connection, ticket)
                    received.append(
                        (context, expect_response(response, ListOffsetsResponse, context), tps)
                    )
            except BaseException:
                for other, later, _ in sent[len(received) + 1 :]:
                    other.abandon(later)
                raise
            retry: BrokerError | None = None
            for context, response, tps in received:
                answered: dict[TopicPartition, tuple[int, int, int, int]] = {}
                for topic in response.topics:
                    for p in topic.partitions:
                        answered[TopicPartition(topic.name, p.partition_index)] = (
                            p.error_code,
                            p.offset,
                            p.timestamp,
                            p.leader_epoch,
                        )
                for tp in tps:
                    if tp not in answered:
                        raise ProtocolError(f"{context}: no answer for {tp}")
                    code, offset, timestamp, epoch = answered[tp]
                    if code:
                        info = error_for(code)
                        error = BrokerError(
                            info.code,
                            info.name,
                            info.retriable,
                            context=f"{context}, {tp}",
                            message=info.description,
                        )
                        if not self.note_error(code, tp.topic):
                            raise error
                        retry = error
                        continue
                    results[tp] = ListedOffset(offset, timestamp, epoch)
                    del pending[tp]
            if retry is not None:
                raise retry
            return results

        return self.retrying("ListOffsets", attempt)

    def latest_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        listed = self.list_offsets({tp: LATEST_TIMESTAMP for tp in partitions})
        return {tp: value.offset for tp, value in listed.items()}

    # -- coordinators -----------------------------------------------------------------

    def find_coordinator(self, key: str, *, key_type: int = COORDINATOR_GROUP) -> BrokerInfo:
        return self.find_coordinators((key,), key_type=key_type)[key]

    def find_coordinators(
        self, keys: Sequence[str], *, key_type: int = COORDINATOR_GROUP
    ) -> dict[str, BrokerInfo]:
        """The coordinator of each key: FindCoordinator v4 batches them, older versions
        ask one key per request (pipelined). Retried on COORDINATOR_NOT_AVAILABLE,
        COORDINATOR_LOAD_IN_PROGRESS and NOT_COORDINATOR."""
        pending = list(dict.fromkeys(keys))
        found: dict[str, BrokerInfo] = {}

        def attempt() -> dict[str, BrokerInfo]:
            connection = self.any_connection()
            version = connection.version_for(FindCoordinatorRequest.api_key)
            context = f"{connection.describe()}, FindCoordinator v{version}"
            answers: list[tuple[str, int, str | None, int, str, int]] = []
            if version >= 4:
                request = FindCoordinatorRequest(key_type=key_type, coordinator_keys=tuple(pending))
                response = expect_response(
                    self.request(connection, request), FindCoordinatorResponse, context
                )
                answers = [
                    (c.key, c.error_code, c.error_message, c.node_id, c.host, c.port)
                    for c in response.coordinators
                ]
            else:
                tickets = [
                    (key, self.send(connection, FindCoordinatorRequest(key=key, key_type=key_type)))
                    for key in pending
                ]
                for index, (key, ticket) in enumerate(tickets):
                    try:
                        response = expect_response(
                            self.receive(connection, ticket), FindCoordinatorResponse, context
                        )
                    except BaseException:
                        for _, later in tickets[index + 1 :]:
                            connection.abandon(later)
                        raise
                    answers.append(
                        (
                            key,
                            response.error_code,
                            response.error_message,
                            response.node_id,
                            response.host,
                            response.port,
                        )
                    )
            retry: BrokerError | None = None
            for key, code, message, node_id, host, port in answers:
                if key not in pending:
                    continue
                if code:
                    info = error_for(code)
                    error = BrokerError(
                        info.code,
                        info.name,
                        info.retriable or code in COORDINATOR_RETRY_ERRORS,
                        context=f"{context}, key {key!r}",
                        message=message or info.description,
                    )
                    if not error.retriable:
                        raise error
                    retry = error
                    continue
                broker = BrokerInfo(node_id, host, port)
                self._brokers.setdefault(node_id, broker)
                found[key] = broker
                pending.remove(key)
            if pending:
                if retry is not None:
                    raise retry
                raise ProtocolError(f"{context}: no answer for keys {pending}")
            return found

        return self.retrying("FindCoordinator", attempt)
