"""The metadata cache never takes a leader epoch back (KIP-320)."""

from __future__ import annotations

import uuid

from ingest.client.metadata_cache import (
    BrokerInfo,
    ClusterView,
    MetadataCache,
    PartitionInfo,
    TopicInfo,
)

TOPIC_ID = uuid.UUID(int=7)


def _view(*epochs: int, leader: int = 1, topic_id: uuid.UUID = TOPIC_ID) -> ClusterView:
    partitions = tuple(
        PartitionInfo("t", index, leader, epoch, (1, 2), (1, 2), ())
        for index, epoch in enumerate(epochs)
    )
    return ClusterView(
        cluster_id="c",
        controller_id=1,
        brokers=(BrokerInfo(1, "127.0.0.1", 9092, None), BrokerInfo(2, "127.0.0.1", 9093, None)),
        topics=(TopicInfo("t", topic_id, False, partitions),),
    )


def test_a_newer_epoch_replaces_the_known_one() -> None:
    cache = MetadataCache(max_age=300)
    cache.apply(_view(3, 5), now=0)
    cache.apply(_view(4, 5, leader=2), now=1)
    assert [cache.leader_epoch("t", p) for p in (0, 1)] == [4, 5]
    assert cache.fresh("t", 1) is not None


def test_an_answer_behind_the_known_epoch_is_not_taken_and_the_topic_stays_stale() -> None:
    cache = MetadataCache(max_age=300)
    cache.apply(_view(4, 5, leader=2), now=0)
    cache.apply(_view(3, 6, leader=1), now=1)  # partition 0 from a broker that lags
    info = cache.topics["t"]
    assert (info.partitions[0].leader_epoch, info.partitions[0].leader_id) == (4, 2)
    assert (info.partitions[1].leader_epoch, info.partitions[1].leader_id) == (6, 1)
    assert cache.fresh("t", 1) is None  # asked again on the next lookup
    cache.apply(_view(4, 6, leader=2), now=2)
    assert cache.fresh("t", 2) is not None


def test_a_recreated_topic_starts_its_epochs_over() -> None:
    cache = MetadataCache(max_age=300)
    cache.apply(_view(9), now=0)
    cache.apply(_view(0, topic_id=uuid.UUID(int=8)), now=1)
    assert cache.leader_epoch("t", 0) == 0


def test_an_unknown_partition_has_no_epoch() -> None:
    cache = MetadataCache(max_age=300)
    assert cache.leader_epoch("t", 0) == -1
    cache.apply(_view(2), now=0)
    assert cache.leader_epoch("t", 3) == -1
