"""Worker processes against the real test broker (Tansu): what lands in segments is what
librdkafka reads, and stopping, killing and backpressure leave the handoff consistent."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.handoff import HandoffConfig, HandoffStore
from ingest.testing import (
    CODECS,
    ConsumedRecord,
    KafkaCluster,
    ProducedRecord,
    Transaction,
    create_topic,
    produce,
    produce_transactions,
    read_topic,
)
from ingest.worker import (
    BackpressureChanged,
    EndPosition,
    Event,
    SegmentSealed,
    StartPosition,
    WorkerFailed,
    WorkerFinished,
    WorkerStarted,
)
from tests.bounds import STOP_NOW_S
from tests.worker.support import (
    WatchedHandle,
    assert_same_records,
    check_tiling,
    read_segments,
    rss_kib,
    run_to_end,
    sealed,
    varied_records,
    worker_settings,
)

pytestmark = pytest.mark.slow

BIG = 1_000_000
MIB = 1024 * 1024
SEGMENT_BYTES = 16 * MIB
# The drain: 1M records of one partition in every codec. Each costs ~15 s here
# (producing, then librdkafka's reference read), well inside the suite's budget.
DRAIN_CASES = [pytest.param(codec, BIG, id=f"{codec}-{BIG}") for codec in CODECS]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[HandoffStore]:
    # shm mode, the default: segments in /dev/shm, memory-mapped by the reader.
    with HandoffStore(HandoffConfig(segment_max_bytes=SEGMENT_BYTES)) as opened:
        yield opened
        assert opened.namespace.startswith("/dev/shm/ingest-")


@pytest.fixture(scope="module")
def big_topic(broker: KafkaCluster) -> tuple[str, list[ConsumedRecord]]:
    """1M uncompressed records in one partition, with librdkafka's reading of them."""
    from ingest.testing import unique_name

    name = unique_name("t-worker-big")
    create_topic(broker.bootstrap, name, partitions=1)
    produce(broker.bootstrap, name, varied_records(BIG))
    return name, read_topic(broker.bootstrap, name)


@pytest.mark.parametrize(("codec", "count"), DRAIN_CASES)
def test_a_worker_drains_a_partition_exactly_as_librdkafka_reads_it(
    broker: KafkaCluster,
    topic: str,
    store: HandoffStore,
    codec: str,
    count: int,
    big_topic: tuple[str, list[ConsumedRecord]],
) -> None:
    if codec == "none" and count == BIG:
        topic, reference = big_topic
    else:
        create_topic(broker.bootstrap, topic, partitions=1)
        produce(broker.bootstrap, topic, varied_records(count), compression=codec)  # type: ignore[arg-type]
        reference = read_topic(broker.bootstrap, topic)
    settings = worker_settings(broker.bootstrap, store, topic, end=EndPosition.latest())
    events, finished, _ = run_to_end(settings, store)
    segments = sealed(events)
    assert finished.reason == "end" and finished.next_offset == count
    check_tiling(segments, 0, count)
    assert sum(s.record_count for s in segments) == count
    # Sealed at the bound even inside one Fetch answer (a compressed one decodes to ~10x).
    assert all(s.bytes <= 1.25 * SEGMENT_BYTES for s in segments)
    assert_same_records(read_segments(store, segments), reference)


@pytest.mark.quick
def test_read_committed_matches_librdkafka(
    broker: KafkaCluster, topic: str, store: HandoffStore
) -> None:
    # On Apache Kafka: the same records as librdkafka, no aborted one, never a control
    # marker. (On Tansu librdkafka shows the aborted records, and ingest drops them:
    # test_read_committed.py.)
    create_topic(broker.bootstrap, topic, partitions=1)
    produce_transactions(
        broker.bootstrap,
        topic,
        [
            Transaction([ProducedRecord(b"c1-%d" % i, partition=0) for i in range(3)]),
            Transaction(
                [ProducedRecord(b"a1-%d" % i, partition=0) for i in range(2)], commit=False
            ),
            Transaction([ProducedRecord(b"c2-%d" % i, partition=0) for i in range(3)]),
        ],
    )
    produce(broker.bootstrap, topic, [ProducedRecord(b"plain", partition=0)])
    reference = read_topic(broker.bootstrap, topic, isolation_level="read_committed")
    settings = worker_settings(
        broker.bootstrap,
        store,
        topic,
        end=EndPosition.latest(),
        fetch={"isolation_level": "read_committed"},
    )
    events, finished, _ = run_to_end(settings, store)
    table = read_segments(store, sealed(events))
    assert_same_records(table, reference)
    values = table.column("value").to_pylist()
    assert values == [b"c1-0", b"c1-1", b"c1-2", b"c2-0", b"c2-1", b"c2-2", b"plain"]
    # The markers took offsets: the end is past the last record.
    assert finished.next_offset > reference[-1].offset


def test_latest_and_timestamp_starts_are_right(
    any_broker: KafkaCluster, topic: str, store: HandoffStore
) -> None:
    # Right on both, although Tansu answers ListOffsets LATEST too low and by-timestamp by
    # store time (docs/kafka-compat.md): the worker works around it.
    broker = any_broker
    create_topic(broker.bootstrap, topic, partitions=1)
    now = int(time.time() * 1000)
    produce(
        broker.bootstrap,
        topic,
        [
            ProducedRecord(b"%d" % i, partition=0, timestamp_ms=now - 100_000 + i * 1000)
            for i in range(100)
        ],
    )
    latest = worker_settings(
        broker.bootstrap, store, topic, start=StartPosition.latest(), end=EndPosition.latest()
    )
    events, finished, _ = run_to_end(latest, store)
    started = next(e for e in events if isinstance(e, WorkerStarted))
    assert started.start_offset == 100 and finished.next_offset == 100 and sealed(events) == []

    by_time = worker_settings(
        broker.bootstrap,
        store,
        topic,
        start=StartPosition.timestamp(now - 100_000 + 60_500),
        end=EndPosition.latest(),
    )
    events, finished, _ = run_to_end(by_time, store)
    table = read_segments(store, sealed(events))
    assert table.column("offset").to_pylist() == list(range(61, 100))


def test_stop_after_seal_mid_stream_leaves_consistent_segments(
    broker: KafkaCluster, big_topic: tuple[str, list[ConsumedRecord]], tmp_path: Path
) -> None:
    name, reference = big_topic
    config = HandoffConfig(segment_max_bytes=2 * 1024 * 1024)
    with HandoffStore(config) as store:
        # Nothing is released here: a cap of a few segments keeps the worker mid-stream
        # however late the stop arrives.
        settings = worker_settings(
            broker.bootstrap,
            store,
            name,
            max_unacked_bytes=8 * 1024 * 1024,
            resume_unacked_bytes=4 * 1024 * 1024,
        )
        with WatchedHandle.spawn(settings, store=store) as handle:
            events: list[Event] = []
            for _ in range(3):
                events.append(handle.wait_for(SegmentSealed, timeout=30, collect=events))
            handle.stop_after_seal()
            finished = handle.wait_for(WorkerFinished, timeout=10, collect=events)
            assert handle.join(5) == 0
        segments = sealed(events)
        assert finished.reason == "stopped"
        assert len(segments) >= 3 and finished.next_offset == segments[-1].next_offset < BIG
        check_tiling(segments, 0, finished.next_offset)
        assert store.visible() == sorted(s.segment_id for s in segments)
        assert store.temporary_files() == []
        table = read_segments(store, segments)
        assert table.column("offset").to_pylist() == list(range(finished.next_offset))
        assert_same_records(table, reference[: finished.next_offset])


def test_stop_now_exits_promptly_mid_stream(
    broker: KafkaCluster, big_topic: tuple[str, list[ConsumedRecord]]
) -> None:
    name, _ = big_topic
    with HandoffStore(HandoffConfig(segment_max_bytes=4 * 1024 * 1024)) as store:
        settings = worker_settings(broker.bootstrap, store, name)
        with WatchedHandle.spawn(settings, store=store) as handle:
            events: list[Event] = []
            events.append(handle.wait_for(SegmentSealed, timeout=30, collect=events))
            began = time.monotonic()
            code = handle.stop_now(wait=5.0)
            took = time.monotonic() - began
            events += handle.receive(1.0)
        assert code == 0 and took < STOP_NOW_S, f"exit {code} after {took:.3f}s"
        segments = sealed(events)
        # What was sealed stays readable; the open segment is gone, nothing partial remains.
        assert store.visible() == sorted(s.segment_id for s in segments)
        assert store.temporary_files() == []
        check_tiling(segments, 0, segments[-1].next_offset)
        for segment in segments:
            assert store.read(segment.uri).num_rows == segment.record_count


_POLL_SYSCALLS = {7, 271}  # x86_64 poll, ppoll (socket timeouts wait in one of these)


def _long_polls(pid: int) -> list[int]:
    """The timeouts (ms) of the poll calls the threads of ``pid`` are blocked in now."""
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "syscall").read_text().split()
        except OSError:
            continue
        if fields and fields[0].isdigit() and int(fields[0]) in _POLL_SYSCALLS:
            found.append(int(fields[3], 16) if int(fields[0]) == 7 else -1)
    return found


def wait_until_parked_in_a_long_poll(pid: int, *, at_least_ms: int, timeout: float = 30) -> None:
    """Until a thread of ``pid`` waits in poll() with a timeout of ``at_least_ms`` or more:
    the socket wait of a Fetch the broker holds (max_wait_ms) is the only wait that long.
    (A poll's timeout is its third argument in /proc/<pid>/syscall; ppoll's is a pointer,
    counted as -1.)"""
    deadline = time.monotonic() + timeout
    while not any(ms >= at_least_ms for ms in _long_polls(pid)):
        if time.monotonic() > deadline:
            raise AssertionError(f"pid {pid} never waited in a long poll: {_long_polls(pid)}")
        time.sleep(0.01)


@pytest.mark.skipif(
    not Path("/proc/self/syscall").exists() or os.uname().machine != "x86_64",
    reason="needs /proc/<pid>/syscall on x86_64 to see the worker parked in its Fetch",
)
def test_stop_now_exits_promptly_while_blocked_in_a_long_fetch(
    broker: KafkaCluster, topic: str, store: HandoffStore
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    settings = worker_settings(
        broker.bootstrap, store, topic, start=StartPosition.latest(), fetch={"max_wait_ms": 30_000}
    )
    with WatchedHandle.spawn(settings, store=store) as handle:
        handle.wait_for(WorkerStarted, timeout=30)
        assert handle.pid is not None
        # Other requests wait request_timeout (30 s); the Fetch waits that plus max_wait_ms.
        request_ms = int(settings.client.request_timeout * 1000)
        wait_until_parked_in_a_long_poll(handle.pid, at_least_ms=request_ms + 1)
        began = time.monotonic()
        code = handle.stop_now(wait=5.0)
        took = time.monotonic() - began
    assert code == 0 and took < STOP_NOW_S, f"exit {code} after {took:.3f}s"


def test_a_killed_worker_is_reported_dead_with_its_exit_code(
    broker: KafkaCluster, topic: str, store: HandoffStore
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    settings = worker_settings(broker.bootstrap, store, topic, fetch={"max_wait_ms": 100})
    with WatchedHandle.spawn(settings, store=store) as handle:
        handle.wait_for(WorkerStarted, timeout=30)
        handle.kill(signal.SIGKILL)
        assert handle.join(5) == -signal.SIGKILL
        assert not handle.alive
        assert handle.exit_reason() == "killed by SIGKILL (exit code -9)"
        assert handle.receive(0.5) == [] and handle.events_closed
        assert handle.last_error is None


def test_a_failing_worker_reports_why_before_exiting(
    broker: KafkaCluster, store: HandoffStore
) -> None:
    settings = worker_settings(
        broker.bootstrap,
        store,
        "no-such-topic",
        client={"retry_timeout": 0.5, "retry_backoff": 0.05, "retry_backoff_max": 0.1},
    )
    with WatchedHandle.spawn(settings, store=store) as handle:
        failure = handle.wait_for(WorkerFailed, timeout=30)
        assert handle.join(5) == 1
    assert failure.error_type == "BrokerError"
    assert "UNKNOWN_TOPIC_OR_PARTITION" in failure.message
    assert "no-such-topic" in failure.message
    assert handle.exit_reason() == f"failed with BrokerError: {failure.message} (exit code 1)"


def test_backpressure_bounds_unreleased_bytes_and_rss_with_a_slow_consumer(
    broker: KafkaCluster, big_topic: tuple[str, list[ConsumedRecord]]
) -> None:
    name, _ = big_topic
    cap, resume, decode_cache = 8 * MIB, 4 * MIB, 8 * MIB
    with HandoffStore(HandoffConfig(segment_max_bytes=2 * MIB)) as store:
        settings = worker_settings(
            broker.bootstrap,
            store,
            name,
            end=EndPosition.latest(),
            max_unacked_bytes=cap,
            resume_unacked_bytes=resume,
            decode_buffer_cache_bytes=decode_cache,
        )
        with WatchedHandle.spawn(settings, store=store) as handle:
            assert handle.pid is not None
            handle.wait_for(WorkerStarted, timeout=30)
            rss: list[int] = []  # KiB, sampled once per event batch
            unreleased: list[SegmentSealed] = []
            drained = read_offsets = pauses = most_unreleased = 0
            finished = None
            while finished is None:
                for event in handle.receive(0.0 if unreleased else 1.0):
                    if isinstance(event, SegmentSealed):
                        unreleased.append(event)
                        drained += event.bytes
                    elif isinstance(event, BackpressureChanged) and event.paused:
                        pauses += 1
                    elif isinstance(event, WorkerFinished):
                        finished = event
                most_unreleased = max(most_unreleased, sum(s.bytes for s in unreleased))
                sample = rss_kib(handle.pid) if handle.alive else None
                if sample is not None:
                    rss.append(sample)
                # The slow consumer: one segment at a time, 30 ms each, then released.
                if unreleased:
                    segment = unreleased.pop(0)
                    table = store.read(segment.uri)
                    assert table.column("offset")[0].as_py() == read_offsets
                    read_offsets += table.num_rows
                    del table
                    time.sleep(0.03)
                    handle.release([segment.segment_id])
            for segment in unreleased:
                read_offsets += store.read(segment.uri).num_rows
            assert handle.join(10) == 0
    assert read_offsets == BIG and pauses >= 3
    assert most_unreleased <= cap + 16 * MIB  # the cap, plus one Fetch answer
    # The first Fetch sets up the decoder's working set (a fixed cost); after that the
    # worker's memory must not follow the backlog: what it drains (~115 MiB) flows
    # through, and only the caps (unreleased bytes, one Fetch answer, the decoder's
    # buffer cache) may add to it.
    warm = max(rss[: max(1, len(rss) // 8)])
    later = max(rss)
    allowance = (cap + decode_cache + 8 * MIB) // 1024
    assert drained > 100 * MIB
    assert later - warm <= allowance, f"RSS {warm} KiB after warm-up, then up to {later} KiB"
