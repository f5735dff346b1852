"""The cluster as one client sees it: bootstrap, connections, metadata, leaders.

``Cluster`` keeps one ``BrokerConnection`` per broker address and, like the
connections, is single-owner and starts no thread. Retriable failures
(``BrokerError.retriable`` and ``KafkaConnectionError``) are retried with
backoff for up to ``retry_timeout``; the leader cache is dropped for a topic
when a broker answers NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
LEADER_NOT_AVAILABLE (or a leader-epoch error) for it, and for every topic led
by a broker whose connection was lost.

Its parts: ``metadata_cache.py`` (what Metadata answers say, and the cache of them),
``offset_lookup.py`` (ListOffsets per leader), ``coordinators.py`` (FindCoordinator).
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TypeVar

from ingest.client.backoff import Backoff
from ingest.client.client_config import ClientConfig
from ingest.client.connection import BrokerConnection, InFlight, expect_response
from ingest.client.coordinators import find_coordinators
from ingest.client.metadata_cache import (
    LEADER_ERRORS,
    BrokerInfo,
    ClusterView,
    MetadataCache,
    TopicInfo,
    view_from_metadata,
)
from ingest.client.offset_lookup import READ_COMMITTED, ListedOffset, list_offsets
from ingest.errors import BrokerError, KafkaConnectionError, ProtocolError
from ingest.protocol.error_codes import ErrorCode, error_for, raise_for_error
from ingest.protocol.messages import (
    COORDINATOR_GROUP,
    LATEST_TIMESTAMP,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    OffsetForLeaderEpochRequest,
)
from ingest.protocol.partition import Partition
from ingest.protocol.schema import Request, Response

__all__ = ["Cluster"]

log = logging.getLogger("ingest.client")

T = TypeVar("T")


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
        self.metadata = MetadataCache(config.metadata_max_age)  # brokers, topics, staleness
        self.cluster_id: str | None = None
        self.controller_id = -1
        self._metadata_source = "Metadata"  # who answered the last Metadata, for errors
        self._trust_list_offsets: bool | None = None  # decided once (trusts_list_offsets)

    @property
    def clock(self) -> Callable[[], float]:
        """The monotonic clock its deadlines are on."""
        return self._clock

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        metadata = self.metadata
        return (
            f"Cluster(bootstrap={self.config.bootstrap_servers!r}, "
            f"brokers={len(metadata.brokers)}, topics={len(metadata.topics)}, "
            f"connections={len(self._connections)})"
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

    def connection(self, node_id: int, *, within: float | None = None) -> BrokerConnection:
        """A connected connection to broker ``node_id`` (reconnecting with backoff; a
        connect waits at most ``within`` seconds when given)."""
        broker = self.metadata.brokers.get(node_id)
        if broker is None:
            raise KafkaConnectionError(f"broker node {node_id} is not in the cluster metadata")
        connection = self._connection_for(broker.host, broker.port, node_id)
        try:
            connection.ensure_connected(within=within)
        except KafkaConnectionError:
            self._connection_lost(connection)
            raise
        return connection

    def any_connection(self, *, within: float | None = None) -> BrokerConnection:
        """A connected connection to some broker: an open one, else the first that answers.

        Known brokers are tried before the bootstrap servers, in order; with ``within``,
        all of them within that many seconds.
        """
        deadline = None if within is None else self._clock() + within
        for connection in self._connections.values():
            if connection.connected:
                return connection
        candidates: list[tuple[str, int, int | None]] = [
            (b.host, b.port, b.node_id) for b in self.metadata.brokers.values()
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
                connection.ensure_connected(within=_left(deadline, self._clock))
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
        self.metadata.invalidate_led_by(connection.host, connection.port)

    def send(
        self, connection: BrokerConnection, request: Request, *, timeout: float | None = None
    ) -> InFlight:
        try:
            return connection.send(request, timeout=timeout)
        except KafkaConnectionError:
            self._connection_lost(connection)
            raise

    def receive(self, connection: BrokerConnection, ticket: InFlight) -> Response:
        try:
            return connection.receive(ticket)
        except (KafkaConnectionError, ProtocolError):
            self._connection_lost(connection)
            raise

    def request(
        self, connection: BrokerConnection, request: Request, *, timeout: float | None = None
    ) -> Response:
        """One request; a lost connection marks the topics it leads stale."""
        return self.receive(connection, self.send(connection, request, timeout=timeout))

    # -- retries ------------------------------------------------------------------------

    def retrying(self, what: str, attempt: Callable[[], T], *, within: float | None = None) -> T:
        """Runs ``attempt`` until it succeeds, a fatal error, or ``retry_timeout`` (or
        ``within``, when shorter) passes.

        Broker errors wait the retry backoff; connection errors retry at once
        (the connection's own reconnect backoff spaces them).
        """
        limit = (
            self.config.retry_timeout if within is None else min(within, self.config.retry_timeout)
        )
        deadline = self._clock() + limit
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
        return dict(self.metadata.brokers)

    def topic(self, name: str) -> TopicInfo | None:
        """The cached metadata of ``name`` (None if never fetched)."""
        return self.metadata.topics.get(name)

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
        self.cluster_id = view.cluster_id
        self.controller_id = view.controller_id
        self.metadata.apply(view, self._clock())
        for broker in view.brokers:
            if (broker.host, broker.port) == (source.host, source.port):
                source.node_id = broker.node_id
        # Connections to brokers that left the cluster are closed.
        addresses = {(b.host, b.port) for b in view.brokers}
        for key, connection in list(self._connections.items()):
            if view.brokers and key not in addresses and connection is not source:
                connection.close()
                del self._connections[key]

    def invalidate(self, topic: str) -> None:
        """Marks ``topic``'s leaders stale: the next lookup refreshes them."""
        self.metadata.invalidate(topic)

    def note_error(self, code: int, topic: str) -> bool:
        """Acts on a partition error code; returns whether the request may be retried."""
        if code in LEADER_ERRORS:
            self.invalidate(topic)
        return error_for(code).retriable

    def leader(self, topic: str, partition: int) -> BrokerInfo:
        """The leader of (topic, partition), from the cache or a metadata refresh.

        Raises a retriable BrokerError when there is no usable leader; callers
        inside ``retrying`` get it retried.
        """
        info = self.metadata.fresh(topic, self._clock())
        if info is None or self.metadata.leader_of(info, partition) is None:
            self._fetch_metadata((topic,))
            info = self.metadata.topics.get(topic, None)
        context = f"{self._metadata_source}, {Partition(topic, partition)}"
        if info is None or info.error_code:
            code = info.error_code if info is not None else ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
            self.invalidate(topic)
            raise_for_error(code, context=context)
            raise AssertionError("unreachable")  # pragma: no cover
        leader = self.metadata.leader_of(info, partition)
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

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The leader epoch known for (topic, partition) (-1: none); a Fetch or ListOffsets
        carries it as ``current_leader_epoch`` so that a stale leader fences it."""
        return self.metadata.leader_epoch(topic, partition)

    def leader_connection(self, topic: str, partition: int) -> BrokerConnection:
        return self.connection(self.leader(topic, partition).node_id)

    # -- ListOffsets and coordinators (offset_lookup.py, coordinators.py) ------------------------

    def list_offsets(
        self,
        timestamps: Mapping[Partition, int],
        *,
        isolation_level: int = READ_COMMITTED,
    ) -> dict[Partition, ListedOffset]:
        """ListOffsets for each partition (timestamp, or EARLIEST/LATEST_TIMESTAMP).

        Requests to different leaders are pipelined; partitions whose leader
        moved are retried after a metadata refresh.
        """
        return list_offsets(self, timestamps, isolation_level=isolation_level)

    def trusts_list_offsets(self) -> bool:
        """Whether ListOffsets answers are taken at their word (``config.list_offsets``).

        ``auto`` trusts a broker that offers OffsetForLeaderEpoch: Apache Kafka (and the
        brokers that follow it closely) index offsets by epoch and time, and answer
        LATEST, a timestamp and MAX_TIMESTAMP right. Tansu 0.6.0 offers no
        OffsetForLeaderEpoch and answers LATEST and timestamps wrongly, so its answers are
        checked (``ingest.worker.positions``). Decided once, from the first broker asked.
        """
        if self._trust_list_offsets is None:
            mode = self.config.list_offsets
            if mode == "auto":
                negotiation = self.any_connection().negotiation
                key = OffsetForLeaderEpochRequest.api_key
                trusted = negotiation is not None and negotiation.speaks(key)
                log.debug("ListOffsets answers %s (auto)", "trusted" if trusted else "checked")
                self._trust_list_offsets = trusted
            else:
                self._trust_list_offsets = mode == "trust"
        return self._trust_list_offsets

    def latest_offsets(self, partitions: Iterable[Partition]) -> dict[Partition, int]:
        listed = self.list_offsets({tp: LATEST_TIMESTAMP for tp in partitions})
        return {tp: value.offset for tp, value in listed.items()}

    def find_coordinator(
        self, key: str, *, key_type: int = COORDINATOR_GROUP, within: float | None = None
    ) -> BrokerInfo:
        return self.find_coordinators((key,), key_type=key_type, within=within)[key]

    def find_coordinators(
        self,
        keys: Sequence[str],
        *,
        key_type: int = COORDINATOR_GROUP,
        within: float | None = None,
    ) -> dict[str, BrokerInfo]:
        """The coordinator of each key: FindCoordinator v4 batches them, older versions
        ask one key per request (pipelined). Retried on COORDINATOR_NOT_AVAILABLE,
        COORDINATOR_LOAD_IN_PROGRESS and NOT_COORDINATOR; with ``within``, connects,
        requests and retries end within that many seconds (a group member's session)."""
        return find_coordinators(self, keys, key_type=key_type, within=within)


def _left(deadline: float | None, clock: Callable[[], float]) -> float | None:
    """Seconds until ``deadline`` (None: no deadline), at least a millisecond."""
    return None if deadline is None else max(deadline - clock(), 0.001)
