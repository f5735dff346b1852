"""GroupMember against the real broker (Apache Kafka): one member's whole life.

The tests use a 2 s session timeout, short enough that those also run on Tansu
(which holds every JoinGroup for max(1 s, session_timeout / 2);
docs/kafka-compat.md) stay quick.
"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from ingest.errors import GroupError
from ingest.group import (
    CommitFailed,
    Left,
    MemberState,
    OffsetsCommitted,
    OffsetsFetched,
    PartitionsAssigned,
    PartitionsRevoked,
)
from ingest.membership.member import GroupMember, check_commit
from ingest.protocol.messages import HeartbeatRequest, LeaveGroupRequest, OffsetCommitRequest
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, create_topic
from tests.brokers import tansu_deviates
from tests.supervisor.support import (
    HEARTBEAT_MS,
    REBALANCE_WAIT,
    Recorder,
    client_config,
    group_config,
    partitions,
    pump_until,
)

PARTITIONS = 4


def committed_by_another_client(bootstrap: str, group: str, topic: str) -> dict[int, int]:
    """The group's committed offsets as confluent-kafka reads them (ground truth)."""
    reader = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        asked = [TopicPartition(topic, i) for i in range(PARTITIONS)]
        return {t.partition: t.offset for t in reader.committed(asked, timeout=10) if t.offset >= 0}
    finally:
        reader.close()


@pytest.mark.quick
def test_one_member_gets_every_partition_and_commits(
    broker: KafkaCluster, topic: str, group: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    everything = partitions(topic, PARTITIONS)
    member = GroupMember(client_config(broker.bootstrap), group_config(group))
    a = Recorder(member, "a")
    try:
        member.subscribe([topic])
        pump_until([a], lambda: a.owned == everything and a.stable, REBALANCE_WAIT, "the join")
        (assigned,) = a.of(PartitionsAssigned)
        assert isinstance(assigned, PartitionsAssigned)
        assert assigned.added == everything
        assert member.status.is_leader and member.generation_id == assigned.generation_id

        fetched = member.fetch_committed(everything)
        assert isinstance(fetched, OffsetsFetched)
        assert fetched.offsets == dict.fromkeys(everything)

        offsets = {Partition(topic, 0): 11, Partition(topic, 3): 5}
        committed = check_commit(member.commit(offsets, "delta-v7"))
        assert committed.offsets == offsets
        fetched = member.fetch_committed(everything)
        assert isinstance(fetched, OffsetsFetched)
        assert {p: c.offset for p, c in fetched.offsets.items() if c is not None} == offsets
        assert committed_by_another_client(broker.bootstrap, group, topic) == {0: 11, 3: 5}

        # Not ours: refused by the member itself, nothing sent.
        sent = member.requests_sent(OffsetCommitRequest.api_key)
        refused = member.commit({Partition(topic, PARTITIONS): 1})
        assert isinstance(refused, CommitFailed) and refused.error_name == "NOT_ASSIGNED"
        assert member.requests_sent(OffsetCommitRequest.api_key) == sent
        with pytest.raises(GroupError, match=rf"{topic}-{PARTITIONS}.*NOT_ASSIGNED"):
            check_commit(refused)

        # Async commits come back as events.
        member.commit_async({Partition(topic, 1): 7})
        pump_until([a], lambda: bool(a.of(OffsetsCommitted)), 10, "the async commit")

        # Heartbeats go on their own (test_liveness.py keeps the caller away for longer).
        heartbeats = member.requests_sent(HeartbeatRequest.api_key)
        deadline = time.monotonic() + 10  # generous: a heartbeat is due every HEARTBEAT_MS
        while member.requests_sent(HeartbeatRequest.api_key) <= heartbeats:
            assert time.monotonic() < deadline, "no heartbeat in 10 s"
            time.sleep(HEARTBEAT_MS / 4000)
        assert a.pump() == [] and member.state is MemberState.STABLE

        left = member.close()
        assert [type(e) for e in left] == [PartitionsRevoked, Left]
        assert isinstance(left[0], PartitionsRevoked) and left[0].partitions == everything
        assert left[1] == Left(error_name=None)
        assert member.requests_sent(LeaveGroupRequest.api_key) == 1
        assert member.status.state is MemberState.UNJOINED and not member.alive
        with pytest.raises(GroupError, match="closed"):
            member.commit({Partition(topic, 0): 12})
    finally:
        member.close()


def test_commit_metadata_round_trips(
    any_broker: KafkaCluster, topic: str, group: str, request: pytest.FixtureRequest
) -> None:
    tansu_deviates(
        request,
        reason="Tansu 0.6.0 drops OffsetCommit metadata (answers '' below OffsetFetch v8, "
        "null at v8; confluent-kafka's own commits lose it too)",
        raises=AssertionError,
    )
    broker = any_broker
    create_topic(broker.bootstrap, topic, partitions=1)
    with GroupMember(client_config(broker.bootstrap), group_config(group)) as member:
        a = Recorder(member, "a")
        member.subscribe([topic])
        pump_until([a], lambda: a.stable and bool(a.owned), REBALANCE_WAIT, "the join")
        assert isinstance(member.commit({Partition(topic, 0): 3}, "delta-v9"), OffsetsCommitted)
        fetched = member.fetch_committed([Partition(topic, 0)])
        assert isinstance(fetched, OffsetsFetched)
        committed = fetched.offsets[Partition(topic, 0)]
        assert committed is not None and committed.metadata == "delta-v9"
