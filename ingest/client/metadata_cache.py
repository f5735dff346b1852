"""What Metadata answers say, and the cache of them a ``Cluster`` keeps.

``view_from_metadata`` turns one answer into a ``ClusterView`` (brokers sorted by
node id, each topic's partitions sorted by index). ``MetadataCache`` holds the
brokers and topics learned so far and which topics' leaders are stale; it does
no I/O and reads no clock (the time comes as an argument).
"""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass

from ingest.protocol.error_codes import ErrorCode
from ingest.protocol.messages import MetadataResponse

__all__ = [
    "LEADER_ERRORS",
    "BrokerInfo",
    "ClusterView",
    "MetadataCache",
    "PartitionInfo",
    "TopicInfo",
    "view_from_metadata",
]

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


def _newest_epochs(known: TopicInfo | None, answer: TopicInfo) -> tuple[TopicInfo, bool]:
    """``answer``, but with each partition whose leader epoch went back replaced by the
    known one; and whether any went back."""
    if known is None or answer.error_code or known.topic_id != answer.topic_id:
        return answer, False
    behind = False
    partitions = []
    for new in answer.partitions:
        old = known.partition(new.partition)
        if old is not None and 0 <= new.leader_epoch < old.leader_epoch:
            behind = True
            partitions.append(old)
        else:
            partitions.append(new)
    if not behind:
        return answer, False
    return dataclasses.replace(answer, partitions=tuple(partitions)), True


class MetadataCache:
    """The brokers and topics learned from Metadata answers, and the leader cache's
    staleness: a topic is stale once invalidated (a leader error, a lost connection to
    a broker leading it) until the next answer naming it, or when older than
    ``max_age`` seconds."""

    def __init__(self, max_age: float) -> None:
        self.max_age = max_age
        self.brokers: dict[int, BrokerInfo] = {}
        self.topics: dict[str, TopicInfo] = {}
        self._refreshed_at: dict[str, float] = {}
        self._stale: set[str] = set()

    def apply(self, view: ClusterView, now: float) -> None:
        """Takes in one answer: its brokers (when it names any) replace the known ones;
        its topics are fresh as of ``now``. A partition whose leader epoch is older than
        the one known (an answer from a broker that has not heard of a leader change) is
        kept as known, and its topic stays stale: the next lookup asks again (KIP-320)."""
        if view.brokers:
            self.brokers = {b.node_id: b for b in view.brokers}
        for topic in view.topics:
            merged, behind = _newest_epochs(self.topics.get(topic.name), topic)
            self.topics[topic.name] = merged
            self._refreshed_at[topic.name] = now
            if behind:
                self._stale.add(topic.name)
            else:
                self._stale.discard(topic.name)

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The known leader epoch of (topic, partition), or -1 when none is known."""
        info = self.topics.get(topic)
        known = None if info is None else info.partition(partition)
        return -1 if known is None else known.leader_epoch

    def learn_broker(self, broker: BrokerInfo) -> None:
        """A broker named outside Metadata (a coordinator); known ones are kept."""
        self.brokers.setdefault(broker.node_id, broker)

    def invalidate(self, topic: str) -> None:
        self._stale.add(topic)

    def invalidate_led_by(self, host: str, port: int) -> None:
        """Marks stale every topic with a partition led by the broker at host:port."""
        lost = {
            node_id
            for node_id, broker in self.brokers.items()
            if (broker.host, broker.port) == (host, port)
        }
        for name, topic in self.topics.items():
            if any(p.leader_id in lost for p in topic.partitions):
                self._stale.add(name)

    def fresh(self, topic: str, now: float) -> TopicInfo | None:
        """The cached topic, or None when unknown, stale or older than ``max_age``."""
        info = self.topics.get(topic)
        if info is None or topic in self._stale:
            return None
        if now - self._refreshed_at.get(topic, 0.0) > self.max_age:
            return None
        return info

    def leader_of(self, info: TopicInfo, partition: int) -> BrokerInfo | None:
        known = info.partition(partition)
        if known is None or known.leader_id < 0:
            return None
        return self.brokers.get(known.leader_id)
