"""Leader epochs in Fetch (KIP-320), on Apache Kafka.

The fetcher sends the leader epoch it knows as ``current_leader_epoch``. A broker whose
epoch is newer answers FENCED_LEADER_EPOCH: the fetcher refreshes the metadata and goes on
at the same offset. A leader change (here: the one node restarted, which Kafka answers
with a new leader epoch) is followed without losing or repeating a record.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest

from ingest.client import ClientConfig, Cluster
from ingest.protocol.messages import FetchRequest
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.worker import FetchSettings, PartitionFetcher, StartPosition
from tests.worker.support import drain

COUNT = 2_000


def _records(start: int, count: int) -> Iterator[ProducedRecord]:
    for n in range(start, start + count):
        yield ProducedRecord(b"v%d" % n, partition=0)


class _SentEpochs:
    """Records the ``current_leader_epoch`` of every Fetch the cluster's connections send."""

    def __init__(self, cluster: Cluster) -> None:
        self.epochs: list[int] = []
        send = cluster.connection.__func__  # type: ignore[attr-defined]

        def connection(node_id: int) -> object:
            real = send(cluster, node_id)
            if not getattr(real, "_epochs_watched", False):
                original = real.send

                def watched(request: object, **kwargs: object) -> object:
                    if isinstance(request, FetchRequest):
                        for topic in request.topics:
                            self.epochs += [p.current_leader_epoch for p in topic.partitions]
                    return original(request, **kwargs)

                real.send = watched
                real._epochs_watched = True
            return real

        cluster.connection = connection  # type: ignore[method-assign]


def _fetcher(cluster: Cluster, topic: str) -> PartitionFetcher:
    return PartitionFetcher(
        cluster,
        topic,
        0,
        FetchSettings(max_wait_ms=100, partition_max_bytes=16 * 1024),
        start=StartPosition.earliest(),
    )


def test_a_leader_change_is_followed_at_its_new_epoch_and_a_stale_epoch_is_fenced(
    restartable_broker: KafkaCluster, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    kafka = restartable_broker
    create_topic(kafka.bootstrap, topic, partitions=1)
    produce(kafka.bootstrap, topic, _records(0, COUNT))
    cluster = Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap, retry_backoff=0.05))
    sent = _SentEpochs(cluster)
    fetcher = _fetcher(cluster, topic)
    try:
        values = drain(fetcher, COUNT // 2)
        before = cluster.leader_epoch(topic, 0)
        assert before >= 0 and set(sent.epochs) == {before}, (before, sent.epochs)
        kafka.restart(kill=True)  # the node leads again, at a new leader epoch
        produce(kafka.bootstrap, topic, _records(COUNT, COUNT // 2))
        values += drain(fetcher, COUNT + COUNT // 2, timeout=120)
        after = cluster.leader_epoch(topic, 0)
        assert after > before, (before, after)
        assert sent.epochs[-1] == after and sent.epochs == sorted(sent.epochs)
        # Metadata from before the change (as a lagging broker would answer it): the
        # broker fences the Fetch; the fetcher refreshes and goes on at the same offset.
        info = cluster.metadata.topics[topic]
        stale = tuple(dataclasses.replace(p, leader_epoch=before) for p in info.partitions)
        cluster.metadata.topics[topic] = dataclasses.replace(info, partitions=stale)
        produce(kafka.bootstrap, topic, _records(COUNT + COUNT // 2, COUNT // 2))
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ingest.worker"):
            values += drain(fetcher, 2 * COUNT)
    finally:
        fetcher.close()
        cluster.close()
    assert "FENCED_LEADER_EPOCH" in caplog.text
    fenced = sent.epochs.index(before, sent.epochs.index(after))
    assert sent.epochs[fenced + 1 :] and set(sent.epochs[fenced + 1 :]) == {after}
    assert [int(v[1:]) for v in values] == list(range(2 * COUNT))
