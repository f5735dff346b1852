"""The cluster tests' topic: 4 partitions x 50k records, produced once per session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from ingest.testing import KafkaCluster, create_topic, produce, unique_name
from tests.cluster.support import PARTITIONS, PER_PARTITION
from tests.runtime.support import records


@pytest.fixture(scope="session")
def cluster_topic(broker: KafkaCluster) -> Iterator[str]:
    topic = unique_name("t-cluster")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produced = produce(
        broker.bootstrap,
        topic,
        (r for p in range(PARTITIONS) for r in records(p, 0, PER_PARTITION)),
        compression="lz4",
    )
    assert produced == PARTITIONS * PER_PARTITION
    yield topic
