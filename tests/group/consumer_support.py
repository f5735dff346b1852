"""Test support for the consumer-protocol machine (KIP-848): answer builders and a
scripted member driven by hand to each state."""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ingest.group import CoordinatorFound, CoordinatorVersions, Subscribe, Tick
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import ConsumerOutput, TopicNames
from ingest.group.consumer.consumer_machine import ConsumerMachine
from ingest.group.consumer.consumer_transitions import ConsumerState
from ingest.protocol.error_codes import ErrorCode
from ingest.protocol.messages import (
    Assignment,
    ConsumerGroupHeartbeatRequest,
    ConsumerGroupHeartbeatResponse,
    TopicPartitions,
)
from ingest.protocol.partition import Partition
from tests.group.support import assert_encodable, requests_of

E = ErrorCode
S = ConsumerState
TOPIC = "orders"
MEMBER_ID = "4Ug3xYlCQvqJbLXZCI0mVw"  # what the driver draws (a UUID, KIP-1082)
IDS: dict[str, uuid.UUID] = {
    "orders": uuid.UUID(int=0x0D),
    "audit": uuid.UUID(int=0xAD),
    "mystery": uuid.UUID(int=0x99),
}


def config(**overrides: Any) -> ConsumerGroupConfig:
    settings: dict[str, Any] = {
        "group_id": "g",
        "session_timeout_ms": 10_000,
        "heartbeat_interval_ms": 1_000,
        "retry_backoff_ms": 100,
    }
    settings.update(overrides)
    return ConsumerGroupConfig(**settings)


def coordinator(heartbeat: int | None = 1, offset_commit: int = 9) -> CoordinatorFound:
    versions = CoordinatorVersions(consumer_group_heartbeat=heartbeat, offset_commit=offset_commit)
    return CoordinatorFound(node_id=1, host="127.0.0.1", port=9092, versions=versions)


def assignment(partitions: Mapping[str, Iterable[int]]) -> Assignment:
    return Assignment(
        topic_partitions=tuple(
            TopicPartitions(topic_id=IDS[topic], partitions=tuple(indexes))
            for topic, indexes in partitions.items()
        )
    )


def ok(
    epoch: int,
    partitions: Mapping[str, Iterable[int]] | None = None,
    *,
    interval_ms: int = 1_000,
    member_id: str | None = MEMBER_ID,
) -> ConsumerGroupHeartbeatResponse:
    """A successful answer; ``partitions`` None: no assignment (unchanged)."""
    return ConsumerGroupHeartbeatResponse(
        member_id=member_id,
        member_epoch=epoch,
        heartbeat_interval_ms=interval_ms,
        assignment=None if partitions is None else assignment(partitions),
    )


def error(code: int, message: str | None = None) -> ConsumerGroupHeartbeatResponse:
    return ConsumerGroupHeartbeatResponse(error_code=code, error_message=message, member_epoch=-1)


def tp(topic: str, *indexes: int) -> frozenset[Partition]:
    return frozenset(Partition(topic, i) for i in indexes)


def names(*topics: str) -> TopicNames:
    return TopicNames({IDS[t]: t for t in topics})


def heartbeats(outputs: Iterable[ConsumerOutput]) -> list[ConsumerGroupHeartbeatRequest]:
    return requests_of(outputs, ConsumerGroupHeartbeatRequest)


def only_heartbeat(outputs: Iterable[ConsumerOutput]) -> ConsumerGroupHeartbeatRequest:
    found = heartbeats(outputs)
    assert len(found) == 1, f"expected one heartbeat in {list(outputs)}"
    return found[0]


class Member:
    """One consumer-protocol machine driven by hand, with the clock in ``now``."""

    def __init__(self, cfg: ConsumerGroupConfig | None = None, *, now: float = 100.0) -> None:
        self.machine = ConsumerMachine(cfg or config(), member_id=MEMBER_ID)
        self.now = now

    @property
    def state(self) -> ConsumerState:
        return self.machine.state

    def __call__(self, event: Any, *, after: float = 0.0) -> list[ConsumerOutput]:
        self.now += after
        outputs = self.machine.handle(event, self.now)
        assert_encodable(outputs)
        return outputs

    # Scripted paths to each state; the coordinator knows "orders" and "audit" by id.

    def joining(self, topics: Iterable[str] = (TOPIC,), heartbeat: int = 1) -> list[ConsumerOutput]:
        self(Subscribe(frozenset(topics)))
        self(names("orders", "audit"))
        outputs = self(coordinator(heartbeat))
        assert only_heartbeat(outputs).member_epoch == 0
        assert self.state is S.JOINING
        return outputs

    def stable(self, partitions: Mapping[str, Iterable[int]] | None = None) -> list[ConsumerOutput]:
        """Joined at epoch 1 with ``partitions`` (orders-0/1), the acknowledgement answered."""
        self.joining()
        outputs = self(ok(1, {TOPIC: (0, 1)} if partitions is None else partitions))
        assert self.state is S.STABLE, outputs
        assert only_heartbeat(outputs).topic_partitions is not None  # the acknowledgement
        outputs += self(ok(1))
        return outputs

    def heartbeat(self, answer: ConsumerGroupHeartbeatResponse) -> list[ConsumerOutput]:
        """Let the next heartbeat go (if none is in flight) and answer it."""
        if not self.machine.inflight(ConsumerGroupHeartbeatRequest.api_key):
            sent = self(Tick(), after=self.machine.heartbeat_interval)
            assert heartbeats(sent), sent
        return self(answer)

    def revoking(self) -> list[ConsumerOutput]:
        """Stable with orders-0/1, then the target takes orders-1 away."""
        self.stable()
        outputs = self.heartbeat(ok(2, {TOPIC: (0,)}))
        assert self.state is S.REVOKING, outputs
        return outputs

    def reconciling(self) -> list[ConsumerOutput]:
        """Stable, then the target adds a partition of a topic id nobody named yet."""
        self.stable()
        outputs = self.heartbeat(ok(2, {TOPIC: (0, 1), "mystery": (0,)}))
        assert self.state is S.RECONCILING, outputs
        return outputs
