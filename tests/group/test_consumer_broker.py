"""The consumer-protocol machine (KIP-848) against a real Apache Kafka 4.4 coordinator.

The one test of the group layer that talks to a broker: a tiny blocking driver,
written here, runs two ``ConsumerMachine``s of one group (FindCoordinator, then
ConsumerGroupHeartbeat through ``BrokerConnection``), acknowledges revocations at
once and answers topic-id lookups with Metadata. The coordinator's ``uniform``
assignor must split 6 partitions 3/3, and a member leaving (epoch -1) must hand all
6 to the other, with the kept partitions never revoked or re-announced.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

from ingest.client import BrokerConnection, ClientConfig
from ingest.group import (
    CoordinatorFound,
    CoordinatorLookupFailed,
    CoordinatorVersions,
    FindCoordinator,
    Leave,
    Left,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RevocationDone,
    SendRequest,
    Subscribe,
    Tick,
)
from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.consumer.consumer_events import (
    ConsumerOutput,
    NeedTopicNames,
    SubscribeRegex,
    TopicNames,
)
from ingest.group.consumer.consumer_machine import ConsumerMachine
from ingest.group.consumer.consumer_transitions import ConsumerState
from ingest.protocol.messages import (
    COORDINATOR_GROUP,
    FindCoordinatorRequest,
    FindCoordinatorResponse,
    MetadataRequest,
    MetadataRequestTopic,
    MetadataResponse,
)
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, create_topic, set_group_configs

S = ConsumerState
HEARTBEAT_INTERVAL_MS = 500  # the harness allows it (group.consumer.min.heartbeat.interval.ms)


class Driver:
    """One member: its machine, its own coordinator connection, what it consumes."""

    def __init__(
        self, broker: KafkaCluster, group: str, name: str, instance_id: str | None = None
    ) -> None:
        self.name = name
        self.config = ClientConfig(bootstrap_servers=(broker.bootstrap,), client_id=name)
        self.bootstrap = BrokerConnection(broker.host, broker.port, self.config)
        self.bootstrap.connect()
        self.coordinator: BrokerConnection | None = None
        # The member id is drawn here, by the driver: the machine draws nothing (KIP-1082).
        self.machine = ConsumerMachine(
            ConsumerGroupConfig(
                group_id=group, group_instance_id=instance_id, server_assignor="uniform"
            ),
            member_id=str(uuid.uuid4()),
        )
        self.consuming: set[Partition] = set()
        self.events: list[ConsumerOutput] = []
        self.inbox: deque[Any] = deque()

    def feed(self, event: Any) -> None:
        self.inbox.append(event)
        while self.inbox:
            outputs = self.machine.handle(self.inbox.popleft(), time.monotonic())
            for output in outputs:
                self._act(output)

    def _act(self, output: ConsumerOutput) -> None:
        if isinstance(output, SendRequest):
            assert self.coordinator is not None
            self.inbox.append(self.coordinator.request(output.request, version=output.version))
        elif isinstance(output, FindCoordinator):
            self.inbox.append(self._find_coordinator())
        elif isinstance(output, NeedTopicNames):
            self.inbox.append(self._topic_names(output.topic_ids))
        else:
            self.events.append(output)
            if isinstance(output, PartitionsAssigned):
                assert not output.added & self.consuming, "a kept partition was announced again"
                self.consuming |= output.added
            elif isinstance(output, PartitionsRevoked):
                self.consuming -= output.partitions  # stopped at once, then acknowledged
                self.inbox.append(RevocationDone())
            elif isinstance(output, PartitionsLost):
                self.consuming -= output.partitions

    def _find_coordinator(self) -> CoordinatorFound | CoordinatorLookupFailed:
        request = FindCoordinatorRequest(key_type=COORDINATOR_GROUP, coordinator_keys=(self.group,))
        answer = self.bootstrap.request(request, version=4)
        assert isinstance(answer, FindCoordinatorResponse)
        (found,) = answer.coordinators
        if found.error_code:  # COORDINATOR_NOT_AVAILABLE while __consumer_offsets is created
            return CoordinatorLookupFailed(found.error_code, found.error_message or "")
        self.coordinator = BrokerConnection(found.host, found.port, self.config)
        self.coordinator.connect()
        negotiation = self.coordinator.negotiation
        assert negotiation is not None
        offered = {api.api_key: api.broker for api in negotiation.apis if api.broker is not None}
        versions = CoordinatorVersions.negotiate(offered)
        return CoordinatorFound(found.node_id, found.host, found.port, versions)

    def _topic_names(self, topic_ids: frozenset[uuid.UUID]) -> TopicNames:
        request = MetadataRequest(
            topics=tuple(MetadataRequestTopic(topic_id=t, name=None) for t in topic_ids)
        )
        answer = self.bootstrap.request(request, version=12)
        assert isinstance(answer, MetadataResponse)
        return TopicNames({t.topic_id: t.name for t in answer.topics if t.error_code == 0})

    @property
    def group(self) -> str:
        return self.machine.config.group_id

    def close(self) -> None:
        for connection in (self.coordinator, self.bootstrap):
            if connection is not None:
                connection.close()


def _run_until(drivers: list[Driver], done: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, [
            (d.name, d.machine.state, d.consuming) for d in drivers
        ]
        for driver in drivers:
            if driver.machine.state not in (S.UNJOINED, S.FENCED, S.FAILED):
                driver.feed(Tick())
        time.sleep(0.02)


@pytest.fixture
def drivers(broker: KafkaCluster, group: str) -> Iterator[list[Driver]]:
    """Two members of ``group``, ``a`` static; a test may append more (closed alike)."""
    members = [Driver(broker, group, "a", instance_id="host-a"), Driver(broker, group, "b")]
    yield members
    for member in members:
        member.close()


def _set_heartbeat_interval(broker: KafkaCluster, group: str) -> None:
    """A group config of KIP-848 (Kafka 3.8+), so that the test takes seconds, not tens."""
    set_group_configs(
        broker.bootstrap, group, {"consumer.heartbeat.interval.ms": HEARTBEAT_INTERVAL_MS}
    )


def _split(
    broker: KafkaCluster, topic: str, group: str, drivers: list[Driver]
) -> frozenset[Partition]:
    """a joins and takes all 6 partitions, then b joins: 3 each."""
    create_topic(broker.bootstrap, topic, partitions=6)
    _set_heartbeat_interval(broker, group)
    a, b = drivers
    everything = frozenset(Partition(topic, i) for i in range(6))
    a.feed(Subscribe(frozenset({topic})))
    _run_until(drivers, lambda: a.machine.state is S.STABLE and a.consuming == everything)
    assert a.machine.heartbeat_interval == HEARTBEAT_INTERVAL_MS / 1000  # the coordinator's
    b.feed(Subscribe(frozenset({topic})))
    _run_until(
        drivers,
        lambda: (
            len(a.consuming) == len(b.consuming) == 3
            and a.machine.state is b.machine.state is S.STABLE
        ),
    )
    assert a.consuming | b.consuming == everything
    assert a.machine.assignment == a.consuming and b.machine.assignment == b.consuming
    return everything


@pytest.mark.quick
def test_two_members_split_six_partitions_and_a_leaver_hands_all_to_the_other(
    broker: KafkaCluster, topic: str, group: str, drivers: list[Driver]
) -> None:
    started = time.monotonic()
    everything = _split(broker, topic, group, drivers)
    a, b = drivers
    # a gave up exactly what b took, in one revocation; what a kept was never touched.
    kept = frozenset(a.consuming)
    revoked = [e.partitions for e in a.events if isinstance(e, PartitionsRevoked)]
    assert revoked == [everything - kept]
    after = a.events[a.events.index(PartitionsRevoked(everything - kept)) :]
    assert not [e for e in after if isinstance(e, PartitionsAssigned) and e.added & kept]
    assert b.machine.member_epoch > 0 and a.machine.member_epoch > 0

    a.feed(Leave(force=True))  # a static member leaving for good: epoch -1
    _run_until(drivers, lambda: a.machine.state is S.UNJOINED and b.consuming == everything)
    assert a.events[-1] == Left()
    assert not any(isinstance(e, PartitionsLost) for e in a.events + b.events)
    assert [e for e in b.events if isinstance(e, PartitionsRevoked)] == []  # b only gained
    assert time.monotonic() - started < 30


def test_a_static_member_leaving_at_minus_2_gets_its_partitions_back_on_restart(
    broker: KafkaCluster, topic: str, group: str, drivers: list[Driver]
) -> None:
    started = time.monotonic()
    _split(broker, topic, group, drivers)
    a, b = drivers
    held = frozenset(a.consuming)
    a.feed(Leave())  # epoch -2: the coordinator keeps a's assignment for its session
    _run_until(drivers, lambda: a.machine.state is S.UNJOINED)
    assert a.events[-1] == Left()
    b_before = frozenset(b.consuming)
    quiet_until = time.monotonic() + 4 * HEARTBEAT_INTERVAL_MS / 1000
    _run_until(drivers, lambda: time.monotonic() > quiet_until)
    assert b.consuming == b_before  # nothing of a's moved to b meanwhile
    # The restart: a new process (a new member id) with the same instance id, at epoch 0.
    restarted = Driver(broker, group, "a2", instance_id="host-a")
    drivers.append(restarted)
    assert restarted.machine.member_id != a.machine.member_id
    restarted.feed(Subscribe(frozenset({topic})))
    _run_until(drivers, lambda: restarted.consuming == held)
    assert b.consuming == b_before
    assert [e for e in b.events if isinstance(e, PartitionsRevoked)] == []
    assert time.monotonic() - started < 30


def test_a_regex_subscription_is_resolved_by_the_coordinator(
    broker: KafkaCluster, topic: str, group: str, drivers: list[Driver]
) -> None:
    """SubscribedTopicRegex (ConsumerGroupHeartbeat v1): the coordinator resolves the
    pattern to the topics it matches, and a topic created later that matches joins."""
    _set_heartbeat_interval(broker, group)
    create_topic(broker.bootstrap, f"{topic}-a", partitions=2)
    create_topic(broker.bootstrap, f"{topic}-b", partitions=1)
    create_topic(broker.bootstrap, f"other-{topic}", partitions=1)  # does not match
    a = drivers[0]
    a.feed(SubscribeRegex(f"{re.escape(topic)}-.*"))
    matched = {Partition(f"{topic}-a", 0), Partition(f"{topic}-a", 1), Partition(f"{topic}-b", 0)}
    _run_until(drivers, lambda: a.consuming == matched, timeout=30)
    assert a.machine.assignment == matched
    # A new matching topic: the coordinator's regex refresh (Kafka resolves regexes
    # asynchronously) brings it in without a new subscription.
    create_topic(broker.bootstrap, f"{topic}-c", partitions=1)
    _run_until(drivers, lambda: a.consuming == matched | {Partition(f"{topic}-c", 0)}, timeout=60)
