"""A worker process on a full handoff (a real small tmpfs, filled by another process):
it holds what did not fit, stops fetching, and its segments still tile the partition,
whether it is stopped while holding or goes on once there is room."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.handoff import HandoffConfig, HandoffStore
from ingest.testing import ConsumedRecord, KafkaCluster, create_topic, produce, read_topic
from ingest.testing.tmpfs import fill, mount_refusal, small_tmpfs
from ingest.worker import (
    BackpressureChanged,
    Event,
    StartPosition,
    WorkerFinished,
    WorkerSettings,
)
from ingest.worker.settings import EndPosition
from tests.worker.support import (
    WatchedHandle,
    assert_same_records,
    check_tiling,
    read_segments,
    sealed,
    varied_records,
    worker_settings,
)

MIB = 1024 * 1024
COUNT = 40_000

pytestmark = pytest.mark.skipif(mount_refusal() is not None, reason=str(mount_refusal()))


@pytest.fixture
def small_store(tmp_path: Path) -> Iterator[HandoffStore]:
    with (
        small_tmpfs(12 * MIB, base=tmp_path) as root,
        HandoffStore(HandoffConfig(mode="files", root=str(root), full_timeout=120)) as store,
    ):
        yield store


def _partition_and_a_full_handoff(
    broker: KafkaCluster, topic: str, store: HandoffStore
) -> tuple[list[ConsumedRecord], WorkerSettings]:
    """A one-partition topic of COUNT records (and librdkafka's reading of it), a handoff
    another writer has filled but for 1 MiB (about one 512 KiB segment, not the
    partition), and the settings of a worker for the whole partition."""
    create_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, varied_records(COUNT))
    reference = read_topic(broker.bootstrap, topic)
    fill(Path(store.config.resolved_root) / "another-writer", leave=MIB)
    settings = worker_settings(
        broker.bootstrap, store, topic, end=EndPosition.latest(), segment_max_bytes=512 * 1024
    )
    return reference, settings


def test_held_records_are_fetched_again_by_a_successor_and_nothing_is_lost(
    broker: KafkaCluster, topic: str, small_store: HandoffStore
) -> None:
    reference, settings = _partition_and_a_full_handoff(broker, topic, small_store)
    filler = Path(small_store.config.resolved_root) / "another-writer"
    events: list[Event] = []
    with WatchedHandle.spawn(settings, store=small_store) as handle:
        full = handle.wait_for(BackpressureChanged, timeout=60, collect=events)
        assert (full.paused, full.reason) == (True, "handoff_full")
        # Stopped while it holds records: its span must end before the first held one.
        handle.stop_after_seal()
        first = handle.wait_for(WorkerFinished, timeout=30, collect=events)
        assert handle.join(10) == 0, handle.exit_reason()
    assert first.reason == "stopped" and 0 < first.next_offset < COUNT, first
    before = sealed(events)
    check_tiling(before, 0, first.next_offset)
    table = read_segments(small_store, before)
    assert table.column("offset").to_pylist() == list(range(first.next_offset))
    small_store.release([s.segment_id for s in before])  # landed: the space comes back

    filler.unlink()
    settings = worker_settings(
        broker.bootstrap,
        small_store,
        topic,
        start=StartPosition.offset(first.next_offset),
        end=EndPosition.latest(),
        segment_max_bytes=512 * 1024,
    )
    events = []
    with WatchedHandle.spawn(settings, store=small_store) as handle:
        second = handle.wait_for(WorkerFinished, timeout=60, collect=events)
        assert handle.join(10) == 0, handle.exit_reason()
    after = sealed(events)
    assert second.reason == "end" and second.next_offset == COUNT
    check_tiling(after, first.next_offset, COUNT)
    assert_same_records(pa.concat_tables([table, read_segments(small_store, after)]), reference)


def test_a_worker_goes_on_when_releases_make_room(
    broker: KafkaCluster, topic: str, small_store: HandoffStore
) -> None:
    reference, settings = _partition_and_a_full_handoff(broker, topic, small_store)
    kept: list[pa.Table] = []
    changes: list[BackpressureChanged] = []
    with WatchedHandle.spawn(settings, store=small_store) as handle:
        # The parent's part: read what is sealed, then release it (the space comes back).
        while True:
            got = handle.receive(0.5)
            for event in got:
                if isinstance(event, BackpressureChanged):
                    changes.append(event)
            segments = sealed(got)
            if segments:
                # Copied, not mapped: a mapped page of a deleted tmpfs file still takes space.
                kept += [small_store.read(s.uri, memory_map=False) for s in segments]
                handle.release([s.segment_id for s in segments])
            finished = [e for e in got if isinstance(e, WorkerFinished)]
            if finished:
                break
            assert handle.alive or got, handle.exit_reason()
        assert handle.join(10) == 0, handle.exit_reason()
    assert finished[0].reason == "end" and finished[0].next_offset == COUNT
    full = [c for c in changes if c.reason == "handoff_full"]
    assert full and full[0].paused and not full[-1].paused, changes
    assert_same_records(pa.concat_tables(kept), reference)
