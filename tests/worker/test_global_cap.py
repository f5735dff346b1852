"""The supervisor's global cap holds the sum of all workers' unreleased bytes."""

from __future__ import annotations

import time

import pytest

from ingest.errors import ConfigError
from ingest.handoff import HandoffConfig, HandoffStore
from ingest.handoff.messages import SegmentSealed
from ingest.supervisor.engine.backpressure import CapDecision, GlobalBufferCap
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from ingest.worker.parent_messages import WorkerFinished, WorkerStarted
from ingest.worker.settings import EndPosition
from tests.worker.support import WatchedHandle, worker_settings

MIB = 1024 * 1024


def test_pauses_at_the_cap_and_resumes_below_the_low_water_mark() -> None:
    cap = GlobalBufferCap(max_bytes=100, resume_bytes=40)

    assert cap.sealed("p0", 60) is None
    assert cap.sealed("p1", 40) is CapDecision.PAUSE_ALL
    assert cap.sealed("p1", 10) is None  # already paused: no second decision
    assert cap.released("p0", 60) is None  # 50 held: still above the low-water mark
    assert cap.released("p1", 20) is CapDecision.RESUME_ALL
    assert (cap.held_bytes, cap.paused) == (30, False)


def test_a_forgotten_worker_no_longer_counts() -> None:
    cap = GlobalBufferCap(max_bytes=100, resume_bytes=50)
    cap.sealed("p0", 80)
    assert cap.sealed("p1", 30) is CapDecision.PAUSE_ALL
    assert cap.forget("p0") is CapDecision.RESUME_ALL


def test_releasing_more_than_held_is_a_bug_not_a_negative_count() -> None:
    cap = GlobalBufferCap(max_bytes=100, resume_bytes=50)
    cap.sealed("p0", 10)
    with pytest.raises(ValueError, match="holds 10"):
        cap.released("p0", 11)


def test_a_low_water_mark_at_or_above_the_cap_is_refused() -> None:
    with pytest.raises(ConfigError, match="resume_bytes"):
        GlobalBufferCap(max_bytes=10, resume_bytes=10)


ANSWER_BYTES = 2 * MIB


@pytest.mark.slow
def test_two_workers_stay_under_the_global_cap_and_lose_nothing(
    broker: KafkaCluster, topic: str
) -> None:
    per_partition = 400_000
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(
        broker.bootstrap,
        topic,
        (ProducedRecord(b"x" * 100, partition=i % 2) for i in range(2 * per_partition)),
    )
    # Each worker alone could hold 64 MiB; together they may hold only 6 MiB (+ slack).
    cap = GlobalBufferCap(max_bytes=6 * MIB, resume_bytes=2 * MIB)
    with HandoffStore(HandoffConfig(segment_max_bytes=1 * MIB)) as store:
        handles = {
            partition: WatchedHandle.spawn(
                worker_settings(
                    broker.bootstrap,
                    store,
                    topic,
                    partition=partition,
                    end=EndPosition.latest(),
                    max_unacked_bytes=64 * MIB,
                    resume_unacked_bytes=32 * MIB,
                    fetch={"max_bytes": ANSWER_BYTES, "partition_max_bytes": ANSWER_BYTES},
                ),
                store=store,
            )
            for partition in (0, 1)
        }
        try:
            for handle in handles.values():
                handle.wait_for(WorkerStarted, timeout=30)
            pending: list[tuple[int, SegmentSealed]] = []
            records = {0: 0, 1: 0}
            finished: set[int] = set()
            most_held = pauses = 0
            deadline = time.monotonic() + 120
            next_release = 0.0
            while len(finished) < 2 or pending:
                assert time.monotonic() < deadline, "workers did not finish"
                decisions = []
                for partition, handle in handles.items():
                    for event in handle.receive(0.0):
                        if isinstance(event, SegmentSealed):
                            pending.append((partition, event))
                            decisions.append(cap.sealed(partition, event.bytes))
                        elif isinstance(event, WorkerFinished):
                            finished.add(partition)
                most_held = max(most_held, cap.held_bytes)
                # A slow consumer, one segment every 20 ms, while events are handled
                # as they come (as the supervisor's event loop does).
                if pending and time.monotonic() >= next_release:
                    partition, segment = pending.pop(0)
                    records[partition] += store.read(segment.uri).num_rows
                    handles[partition].release([segment.segment_id])
                    decisions.append(cap.released(partition, segment.bytes))
                    next_release = time.monotonic() + 0.02
                else:
                    time.sleep(0.001)
                for decision in decisions:
                    if decision is CapDecision.PAUSE_ALL:
                        pauses += 1
                        for handle in handles.values():
                            handle.pause()
                    elif decision is CapDecision.RESUME_ALL:
                        for handle in handles.values():
                            handle.resume()
            for handle in handles.values():
                assert handle.join(10) == 0
        finally:
            for handle in handles.values():
                handle.close()
    print(f"most held {most_held / MIB:.1f} MiB, {pauses} pauses")
    assert records == {0: per_partition, 1: per_partition}
    assert pauses >= 1
    # ~110 MiB of Arrow flows through; each worker's own cap would let 2 x 64 MiB pile up.
    # The global cap holds it to 6 MiB plus what each worker had under way when the pause
    # landed: the answer it was decoding and the one Fetch in flight, each at most
    # ANSWER_BYTES of wire bytes (Kafka honours max_bytes), 100 B records decoding to
    # about 1.4x that in Arrow (2x for headroom).
    assert most_held <= 6 * MIB + 2 * 2 * 2 * ANSWER_BYTES
