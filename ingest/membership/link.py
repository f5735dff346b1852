"""The membership thread's exchanges with the cluster (``driver.py`` runs them).

``CoordinatorLink`` owns the thread's ``Cluster`` and the coordinator connection
(connections are single-owner: only the membership thread calls it). Each
exchange blocks and returns the machine input its outcome makes: the response
to a group request or ``RequestFailed``, ``CoordinatorFound`` or
``CoordinatorLookupFailed``, the ``MetadataUpdate`` the leader asked for.
Only the count of requests sent is read from another thread, under a lock.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter

from ingest.client import BrokerConnection, ClientConfig, Cluster
from ingest.client.admin import topics_matching
from ingest.errors import (
    BrokerError,
    EncodeError,
    KafkaConnectionError,
    ProtocolError,
    UnsupportedVersionError,
)
from ingest.group import (
    ConsumerGroupConfig,
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorVersions,
    GroupConfig,
    Input,
    MetadataUpdate,
    RequestFailed,
    SendRequest,
    TopicNames,
)
from ingest.protocol.codec import API_NAMES
from ingest.protocol.messages import (
    ConsumerGroupHeartbeatRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
    SyncGroupRequest,
)

__all__ = ["CoordinatorLink"]

# One logger for the whole membership, whichever module logs.
log = logging.getLogger("ingest.membership.member")

_JOIN_SLACK = 5.0  # Kafka gives a JoinGroup the rebalance timeout plus 5 s
_LEAST_WAIT = 0.05  # an exchange at the session's very end still gets this long


class CoordinatorLink:
    """The membership thread's cluster connections; ``open`` it on that thread."""

    def __init__(self, client: ClientConfig, config: GroupConfig | ConsumerGroupConfig) -> None:
        self.client_config = client
        self.config = config
        self._cluster: Cluster | None = None
        self._coordinator: BrokerConnection | None = None
        self._sent: Counter[int] = Counter()
        self._sent_lock = threading.Lock()
        self._metadata_wanted: frozenset[str] = frozenset()
        self._metadata_retry_at = 0.0

    def open(self) -> None:
        self._cluster = Cluster(self.client_config)

    def close(self) -> None:
        if self._cluster is not None:
            self._cluster.close()

    # -- read from the caller's thread ----------------------------------------------

    def requests_sent(self, api_key: int) -> int:
        with self._sent_lock:
            return self._sent[api_key]

    def requests_sent_by_api(self) -> dict[int, int]:
        with self._sent_lock:
            return dict(self._sent)

    # -- the exchanges --------------------------------------------------------------

    def send(self, output: SendRequest, *, session_end: float | None = None) -> Input:
        """Sends a group request to the coordinator; its response, or ``RequestFailed``.
        In a session (``session_end``, monotonic) no answer but JoinGroup's and
        SyncGroup's is waited for past its end: the partitions are lost then, whatever
        the answer says."""
        request = output.request
        api_key = type(request).api_key
        connection = self._coordinator
        if connection is None:
            return RequestFailed(api_key, "no coordinator connection")
        request_timeout = self.client_config.request_timeout
        timeout = request_timeout
        if isinstance(request, JoinGroupRequest):
            timeout = max(self.config.rebalance_timeout_ms / 1000, request_timeout) + _JOIN_SLACK
        elif isinstance(request, HeartbeatRequest | ConsumerGroupHeartbeatRequest):
            # An answer later than the session timeout is worthless: the session is over.
            timeout = min(request_timeout, self.config.session_timeout_ms / 1000)
        # A member waiting for its JoinGroup or SyncGroup answer is kept alive by the
        # coordinator (Kafka's shouldKeepAlive), and the answer renews the session: those
        # two wait their own timeouts.
        if session_end is not None and not isinstance(request, JoinGroupRequest | SyncGroupRequest):
            timeout = min(timeout, max(session_end - time.monotonic(), _LEAST_WAIT))
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
            return RequestFailed(api_key, str(exc))
        if log.isEnabledFor(logging.DEBUG):
            log.debug("group %r: %r -> %r", self.config.group_id, request, response)
        return response  # type: ignore[return-value]  # the response to our group request

    def find_coordinator(
        self, *, session_end: float | None = None
    ) -> CoordinatorFound | CoordinatorLookupFailed:
        """Looks the coordinator up and connects to it (its connection is kept for
        ``send``); in a session, within what is left of it (``session_end``, monotonic): a
        member cut off from the cluster sees its session end on time, not after a
        request timeout."""
        cluster = self._cluster
        assert cluster is not None
        within = None
        if session_end is not None:
            within = max(session_end - time.monotonic(), _LEAST_WAIT)
        try:
            broker = cluster.find_coordinator(self.config.group_id, within=within)
            if session_end is not None:
                within = max(session_end - time.monotonic(), _LEAST_WAIT)
            connection = cluster.connection(broker.node_id, within=within)
            negotiation = connection.negotiation
            assert negotiation is not None  # connected
            offered = {api.api_key: api.broker for api in negotiation.apis if api.broker}
            versions = CoordinatorVersions.negotiate(offered)
        except UnsupportedVersionError:
            raise  # no common version: nothing to retry
        except BrokerError as exc:
            return CoordinatorLookupFailed(exc.code, str(exc))
        except (KafkaConnectionError, ProtocolError) as exc:
            return CoordinatorLookupFailed(None, str(exc))
        self._coordinator = connection
        return CoordinatorFound(broker.node_id, broker.host, broker.port, versions)

    def want_metadata(self, topics: frozenset[str]) -> None:
        """The leader's NeedMetadata: ``fetch_metadata`` asks for ``topics`` from now on."""
        self._metadata_wanted = topics
        self._metadata_retry_at = 0.0

    def metadata_due(self) -> float | None:
        """When ``fetch_metadata`` has something to do (a monotonic time); None: nothing."""
        return self._metadata_retry_at if self._metadata_wanted else None

    def fetch_metadata(self) -> MetadataUpdate | None:
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

    def topics_matching(self, pattern: str) -> frozenset[str] | None:
        """The topics ``pattern`` matches now (None when the metadata could not be read:
        the caller tries again at its next refresh)."""
        cluster = self._cluster
        assert cluster is not None
        try:
            return frozenset(topics_matching(cluster, pattern))
        except (BrokerError, KafkaConnectionError, ProtocolError) as exc:
            log.info("group %r: listing the topics failed: %s", self.config.group_id, exc)
            return None

    def topic_names(self, topic_ids: frozenset[uuid.UUID]) -> TopicNames:
        """The names of ``topic_ids`` (Metadata v10+ by topic id; a consumer-protocol
        coordinator assigns by id). An id the cluster does not know (now) is None; one the
        request could not reach stays unnamed, and the machine asks again."""
        cluster = self._cluster
        assert cluster is not None
        request = MetadataRequest(
            topics=tuple(MetadataRequestTopic(topic_id=t, name=None) for t in sorted(topic_ids))
        )
        try:
            response = cluster.request(cluster.any_connection(), request)
        except (BrokerError, KafkaConnectionError, ProtocolError) as exc:
            log.info("group %r: topic names failed: %s", self.config.group_id, exc)
            return TopicNames({})
        if not isinstance(response, MetadataResponse):
            return TopicNames({})
        names: dict[uuid.UUID, str | None] = {}
        for topic in response.topics:
            if topic.topic_id in topic_ids:
                names[topic.topic_id] = topic.name if not topic.error_code else None
        return TopicNames(names)
