"""Incremental fetch sessions (KIP-227) granted by Apache Kafka, and their recovery.

The fetcher's session (``ingest/worker/fetch_session.py``) is watched through its own two
calls: what ``next_request`` told the fetcher to send (session id, epoch, whether the
partition is named) and what ``on_response`` was told (error code, session id).
The session errors are caused the way they arise between real clients: another client
closes the session (FETCH_SESSION_ID_NOT_FOUND next), or a request with the session's
current epoch is answered to another sender (INVALID_FETCH_SESSION_EPOCH next).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from ingest.client import ClientConfig, Cluster
from ingest.protocol.error_codes import ErrorCode
from ingest.protocol.messages import FetchRequest, FetchResponse
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.worker import FetchSettings, PartitionFetcher, StartPosition
from tests.worker.support import drain

ROUND = 500


@dataclass
class Watched:
    """The session's requests (id, epoch, named) and answers (error, id), in order."""

    sent: list[tuple[int, int, bool]] = field(default_factory=list)
    answers: list[tuple[int, int]] = field(default_factory=list)
    states: list[tuple[int, int, int]] = field(default_factory=list)  # offset, bytes, epoch


def watch(fetcher: PartitionFetcher) -> Watched:
    watched = Watched()
    session = fetcher.session
    next_request, on_response = session.next_request, session.on_response

    def sent(state: tuple[int, int, int]) -> tuple[int, int, bool]:
        answer = next_request(state)
        watched.sent.append(answer)
        watched.states.append(state)
        return answer

    def answered(error_code: int, session_id: int) -> None:
        watched.answers.append((error_code, session_id))
        on_response(error_code, session_id)

    session.next_request = sent  # type: ignore[method-assign]
    session.on_response = answered  # type: ignore[method-assign]
    return watched


def _records(start: int, count: int) -> Iterator[ProducedRecord]:
    for n in range(start, start + count):
        yield ProducedRecord(b"v%d" % n, partition=0)


def _drain(fetcher: PartitionFetcher, end: int, *, idle_polls: int = 0) -> list[int]:
    """The record numbers up to ``end``, then ``idle_polls`` polls with nothing new."""
    values = [int(v[1:]) for v in drain(fetcher, end)]
    for _ in range(idle_polls):
        assert fetcher.poll(prefetch=False).batch is None
    return values


def _fetcher(cluster: Cluster, topic: str) -> PartitionFetcher:
    return PartitionFetcher(
        cluster,
        topic,
        0,
        FetchSettings(max_wait_ms=20, partition_max_bytes=4 * 1024),
        start=StartPosition.earliest(),
    )


def _raw_fetch(broker: KafkaCluster, topic: str, session_id: int, epoch: int) -> FetchResponse:
    """Another client's Fetch naming no partition, in the given session and epoch."""
    with Cluster(ClientConfig(bootstrap_servers=broker.bootstrap)) as other:
        response = other.leader_connection(topic, 0).request(
            FetchRequest(
                max_wait_ms=0,
                min_bytes=0,
                session_id=session_id,
                session_epoch=epoch,
                topics=(),
                forgotten_topics_data=(),
            )
        )
    assert isinstance(response, FetchResponse)
    return response


def test_kafka_grants_a_session_whose_epochs_rise_and_whose_idle_fetches_name_nothing(
    broker: KafkaCluster, topic: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    cluster = Cluster(ClientConfig(bootstrap_servers=broker.bootstrap))
    fetcher = _fetcher(cluster, topic)
    watched = watch(fetcher)
    values: list[int] = []
    try:
        for n in range(3):
            produce(broker.bootstrap, topic, _records(n * ROUND, ROUND))
            values += _drain(fetcher, (n + 1) * ROUND, idle_polls=3)
    finally:
        fetcher.close()
        cluster.close()
    assert values == list(range(3 * ROUND))
    first_id, first_epoch, first_named = watched.sent[0]
    assert (first_id, first_epoch, first_named) == (0, 0, True)  # a full Fetch asks for one
    granted = watched.answers[0][1]
    assert watched.answers[0] == (0, granted) and granted != 0
    rest = watched.sent[1:]
    assert {sid for sid, _, _ in rest} == {granted}
    assert [epoch for _, epoch, _ in rest] == list(range(1, len(rest) + 1))
    assert all(answer == (0, granted) for answer in watched.answers)
    # The partition is named exactly when its fetch position moved since the last request
    # (the first idle poll after each round); the rounds' records come to requests that do
    # not name it, since the broker's session holds the position.
    named = [n for _, _, n in rest]
    moved = [a != b for a, b in zip(watched.states, watched.states[1:], strict=False)]
    assert named == moved, (named, moved)
    assert named.count(False) >= 6  # at least the last two idle polls of each round


@pytest.mark.parametrize(
    ("error", "interference"),
    [
        # Another client closes the session (epoch -1): the next incremental Fetch is
        # FETCH_SESSION_ID_NOT_FOUND, and the fetcher starts a new session (id 0, epoch 0).
        ("FETCH_SESSION_ID_NOT_FOUND", -1),
        # Another client's Fetch is answered at the session's current epoch: ours comes at
        # an epoch the broker has passed, INVALID_FETCH_SESSION_EPOCH, and the fetcher
        # closes and reopens its session (same id, epoch 0).
        ("INVALID_FETCH_SESSION_EPOCH", 0),
    ],
)
def test_a_session_error_from_kafka_means_a_new_session_and_no_record_lost_or_repeated(
    broker: KafkaCluster, topic: str, error: str, interference: int
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, _records(0, ROUND))
    cluster = Cluster(ClientConfig(bootstrap_servers=broker.bootstrap))
    fetcher = _fetcher(cluster, topic)
    watched = watch(fetcher)
    try:
        values = _drain(fetcher, ROUND, idle_polls=1)
        session_id, epoch = fetcher.session.session_id, fetcher.session.epoch
        assert session_id != 0 and epoch > 0
        answer = _raw_fetch(broker, topic, session_id, epoch if interference == 0 else interference)
        assert answer.error_code == 0
        produce(broker.bootstrap, topic, _records(ROUND, ROUND))
        values += _drain(fetcher, 2 * ROUND, idle_polls=1)
    finally:
        fetcher.close()
        cluster.close()
    assert values == list(range(2 * ROUND))
    code = ErrorCode[error]
    failed = [i for i, (e, _) in enumerate(watched.answers) if e]
    assert [watched.answers[i][0] for i in failed] == [code]
    after = watched.sent[failed[0] + 1]
    if code == ErrorCode.FETCH_SESSION_ID_NOT_FOUND:
        assert after == (0, 0, True)
    else:
        assert after == (session_id, 0, True)
    new_id = watched.answers[failed[0] + 1][1]
    assert new_id != 0 and watched.sent[-1][0] == new_id and watched.sent[-1][1] >= 1


def test_after_a_broker_restart_the_fetcher_opens_a_new_session(
    restartable_broker: KafkaCluster, topic: str
) -> None:
    kafka = restartable_broker
    create_topic(kafka.bootstrap, topic, partitions=1)
    produce(kafka.bootstrap, topic, _records(0, ROUND))
    cluster = Cluster(ClientConfig(bootstrap_servers=kafka.bootstrap, retry_backoff=0.05))
    fetcher = _fetcher(cluster, topic)
    watched = watch(fetcher)
    try:
        values = _drain(fetcher, ROUND, idle_polls=1)
        old_id = fetcher.session.session_id
        kafka.restart(kill=True)
        produce(kafka.bootstrap, topic, _records(ROUND, ROUND))
        values += _drain(fetcher, 2 * ROUND, idle_polls=1)
    finally:
        fetcher.close()
        cluster.close()
    assert values == list(range(2 * ROUND))
    # The lost connection closed the session: the next Fetch is full, epoch 0, and the
    # restarted broker (which knows no session) grants a new one.
    reopened = watched.sent.index((old_id, 0, True), 1)
    assert all(e == 0 for e, _ in watched.answers)
    new_id = watched.sent[-1][0]
    assert new_id not in (0, old_id) and watched.sent[-1][1] >= 1
    assert reopened < len(watched.sent) - 1
