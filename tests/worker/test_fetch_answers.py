"""Fetch answers the worker relies on, asserted as the protocol has them on Apache Kafka and
on Tansu; Tansu's deviations, which the worker works around, are strict xfails that start
failing loudly once Tansu behaves like Kafka."""

from __future__ import annotations

import pytest

from ingest.client import ClientConfig, Cluster
from ingest.protocol.messages import FetchPartition, FetchRequest, FetchResponse, FetchTopic
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from tests.brokers import tansu_deviates

OFFSET_OUT_OF_RANGE = 1


def fetch(
    broker: KafkaCluster, topic: str, offset: int, *, max_wait_ms: int, session_epoch: int = -1
) -> FetchResponse:
    with Cluster(ClientConfig(bootstrap_servers=broker.bootstrap)) as cluster:
        cluster.bootstrap()
        connection = cluster.leader_connection(topic, 0)
        request = FetchRequest(
            max_wait_ms=max_wait_ms,
            min_bytes=0,
            session_id=0,
            session_epoch=session_epoch,
            topics=(
                FetchTopic(
                    topic=topic,
                    partitions=(
                        FetchPartition(
                            partition=0, fetch_offset=offset, partition_max_bytes=1 << 20
                        ),
                    ),
                ),
            ),
            forgotten_topics_data=(),
        )
        response = connection.request(request)
        assert isinstance(response, FetchResponse)
        return response


@pytest.fixture
def ten_records(any_broker: KafkaCluster, topic: str) -> str:
    broker = any_broker
    create_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, [ProducedRecord(b"v", partition=0) for _ in range(10)])
    return topic


def test_a_fetch_that_does_not_wait_still_names_the_partition(
    any_broker: KafkaCluster, ten_records: str, request: pytest.FixtureRequest
) -> None:
    tansu_deviates(
        request,
        reason="Tansu 0.6.0 answers a Fetch with max_wait_ms=0 without any partition; the "
        "worker's end probe waits 10 ms instead",
        raises=AssertionError,
    )
    broker = any_broker
    response = fetch(broker, ten_records, 0, max_wait_ms=0)
    assert [p.partition_index for t in response.responses for p in t.partitions] == [0]


def test_a_fetch_past_the_log_end_is_out_of_range(
    any_broker: KafkaCluster, ten_records: str, request: pytest.FixtureRequest
) -> None:
    tansu_deviates(
        request,
        reason="Tansu 0.6.0 answers a Fetch past the log end with no error and no records "
        "instead of OFFSET_OUT_OF_RANGE, so auto_offset_reset never triggers there; the "
        "worker logs a warning and waits",
        raises=AssertionError,
    )
    broker = any_broker
    response = fetch(broker, ten_records, 500, max_wait_ms=10)
    codes = [p.error_code for t in response.responses for p in t.partitions]
    assert codes == [OFFSET_OUT_OF_RANGE]


def test_what_the_worker_relies_on_instead(any_broker: KafkaCluster, ten_records: str) -> None:
    broker = any_broker
    # A short wait names the partition with the right high watermark.
    response = fetch(broker, ten_records, 10, max_wait_ms=10)
    partitions = [p for t in response.responses for p in t.partitions]
    assert [(p.partition_index, p.error_code, p.high_watermark) for p in partitions] == [(0, 0, 10)]


def test_a_full_fetch_with_epoch_0_opens_an_incremental_session(
    any_broker: KafkaCluster, ten_records: str, request: pytest.FixtureRequest
) -> None:
    tansu_deviates(
        request,
        reason="Tansu 0.6.0 has no incremental fetch sessions (KIP-227) and always answers "
        "session_id 0; the spec allows it, and the fetcher then keeps sending full Fetches",
        raises=AssertionError,
    )
    response = fetch(any_broker, ten_records, 0, max_wait_ms=10, session_epoch=0)
    assert response.error_code == 0 and response.session_id != 0
