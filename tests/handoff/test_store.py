"""Segments in a local namespace: atomic publication, sealing bounds, release, stale cleanup."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.errors import ConfigError
from ingest.handoff import HandoffConfig, HandoffError, HandoffStore, SegmentWriter
from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.protocol.recordbatch.records import RECORD_SCHEMA, decode_records


def records(first: int, count: int, *, timestamp: int = 5_000, size: int = 100) -> pa.RecordBatch:
    batch = build_batch(
        [
            Record(
                value=bytes([i % 251]) * size,
                key=f"k{first + i}".encode(),
                timestamp=timestamp + i,
                headers=(("n", str(first + i).encode()),),
            )
            for i in range(count)
        ],
        base_offset=first,
    )
    return decode_records(batch, topic="events", partition=3).batch


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path) -> HandoffStore:
    with HandoffStore(HandoffConfig(mode="shm", root=str(tmp_path))) as opened:
        yield opened  # type: ignore[misc]


def test_a_segment_is_invisible_until_sealed_then_read_back_exactly(store: HandoffStore) -> None:
    writer = SegmentWriter(store.location, "events", 3, start_offset=10)
    first, second = records(10, 50), records(60, 30, timestamp=4_000)
    writer.append(first)
    writer.append(second)
    assert store.visible() == []
    assert len(store.temporary_files()) == 1
    sealed = writer.seal(next_offset=92)  # 90-91: say, a control batch
    assert sealed is not None
    assert store.visible() == [sealed.segment_id]
    assert store.temporary_files() == []
    assert sealed.uri == f"{store.namespace}/{sealed.segment_id}.arrows"
    assert (sealed.from_offset, sealed.first_offset, sealed.last_offset, sealed.next_offset) == (
        10,
        10,
        89,
        92,
    )
    assert sealed.record_count == 80
    assert (sealed.min_timestamp, sealed.max_timestamp) == (4_000, 5_049)
    assert sealed.bytes == os.path.getsize(sealed.uri)
    table = store.read(sealed.uri)
    assert table.schema == RECORD_SCHEMA
    assert table.equals(pa.Table.from_batches([first, second]))
    assert writer.covered_until == 92


def test_reading_a_local_segment_maps_it_instead_of_copying(store: HandoffStore) -> None:
    writer = SegmentWriter(store.location, "events", 3)
    writer.append(records(0, 20_000))
    sealed = writer.seal(next_offset=20_000)
    assert sealed is not None and sealed.bytes > 2_000_000
    before = pa.total_allocated_bytes()
    mapped = store.read(sealed.uri)
    mapped_growth = pa.total_allocated_bytes() - before
    copied = store.read(sealed.uri, memory_map=False)
    copied_growth = pa.total_allocated_bytes() - before - mapped_growth
    assert mapped.equals(copied)
    # Mapped buffers come from the file's pages, not Arrow's memory pool.
    assert mapped_growth < 100_000 < sealed.bytes // 2 < copied_growth


def test_consecutive_segments_tile_the_offsets(store: HandoffStore) -> None:
    writer = SegmentWriter(store.location, "events", 3, start_offset=0)
    writer.append(records(0, 10))
    one = writer.seal(next_offset=10)
    assert writer.seal(next_offset=15) is None  # offsets 10-14 held no data record
    writer.append(records(15, 5))
    two = writer.seal(next_offset=20)
    writer.skip_to(100)  # an offset reset
    writer.append(records(100, 5))
    three = writer.seal(next_offset=105)
    assert one is not None and two is not None and three is not None
    assert [(s.from_offset, s.next_offset) for s in (one, two, three)] == [
        (0, 10),
        (10, 20),
        (100, 105),
    ]


def test_appending_offsets_that_go_back_is_refused(store: HandoffStore) -> None:
    writer = SegmentWriter(store.location, "events", 3, start_offset=10)
    writer.append(records(10, 10))
    with pytest.raises(HandoffError, match="offset 15 appended after 19"):
        writer.append(records(15, 5))
    with pytest.raises(HandoffError, match="cannot end at 12"):
        writer.seal(next_offset=12)
    with pytest.raises(HandoffError, match="seal the open segment"):
        writer.skip_to(50)


def test_a_segment_is_due_at_its_size_or_its_age(tmp_path: Path) -> None:
    clock = Clock()
    config = HandoffConfig(root=str(tmp_path), segment_max_bytes=50_000, segment_max_age=2.0)
    with HandoffStore(config) as store:
        writer = SegmentWriter(store.location, "events", 3, clock=clock)
        assert not writer.due() and writer.seconds_until_due() is None
        writer.append(records(0, 10))
        assert not writer.due()
        clock.now += 1.5
        assert not writer.due() and writer.seconds_until_due() == pytest.approx(0.5)
        clock.now += 0.5
        assert writer.due()
        writer.seal(next_offset=10)
        writer.append(records(10, 1000))  # ~100 KB, past the size bound
        assert writer.open_bytes > 50_000 and writer.due()


def test_abort_leaves_nothing_behind(store: HandoffStore) -> None:
    writer = SegmentWriter(store.location, "events", 3)
    writer.append(records(0, 10))
    partial = writer.temporary_path
    assert partial is not None and os.path.exists(partial)
    writer.abort()
    assert not os.path.exists(partial)
    assert store.visible() == [] and store.temporary_files() == []


def test_release_deletes_what_it_names_once(store: HandoffStore) -> None:
    writer = SegmentWriter(store.location, "events", 3)
    sealed = []
    for first in (0, 10, 20):
        writer.append(records(first, 10))
        segment = writer.seal(next_offset=first + 10)
        assert segment is not None
        sealed.append(segment)
    corrupt = writer.write_corrupt(
        first_offset=30, last_offset=39, raw=b"\x00bad batch", reason="CRC mismatch", kind="crc"
    )
    assert Path(corrupt.uri).read_bytes() == b"\x00bad batch"
    assert corrupt.bytes == 10 and corrupt.uri.endswith(".bin")
    assert store.visible() == sorted([s.segment_id for s in sealed] + [corrupt.corrupt_id])
    assert store.release([sealed[0].segment_id, corrupt.corrupt_id]) == 2
    assert store.release([sealed[0].segment_id]) == 0  # twice is harmless
    assert store.visible() == [sealed[1].segment_id, sealed[2].segment_id]
    with pytest.raises(HandoffError, match="not a segment"):
        store.release(["../../etc/passwd"])


def test_close_removes_the_namespace(tmp_path: Path) -> None:
    store = HandoffStore(HandoffConfig(root=str(tmp_path)), run_id="r1").open()
    writer = SegmentWriter(store.location, "events", 0)
    writer.append(records(0, 5))
    writer.seal(next_offset=5)
    assert (tmp_path / "ingest-r1").is_dir()
    store.close()
    assert not (tmp_path / "ingest-r1").exists()


OWNER_SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    from ingest.handoff import HandoffConfig, HandoffStore, SegmentWriter
    store = HandoffStore(HandoffConfig(root=sys.argv[1]), run_id=sys.argv[2]).open()
    writer = SegmentWriter(store.location, "events", 0)
    print("ready", flush=True)
    if sys.argv[3] == "die":
        os._exit(9)  # no cleanup: a crashed run
    time.sleep(60)
    """
)


def start_owner(root: Path, run_id: str, mode: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", OWNER_SCRIPT, str(root), run_id, mode],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stdout.readline().strip() == "ready"
    return process


def test_the_next_start_removes_dead_runs_and_keeps_live_ones(tmp_path: Path) -> None:
    live = start_owner(tmp_path, "live", "live")
    dead = start_owner(tmp_path, "dead", "die")
    assert dead.wait(10) == 9
    foreign = tmp_path / "ingest-not-ours"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("no owner file: never touched")
    try:
        assert (tmp_path / "ingest-dead").is_dir()
        with HandoffStore(HandoffConfig(root=str(tmp_path)), run_id="next") as store:
            assert not (tmp_path / "ingest-dead").exists()
            assert (tmp_path / "ingest-live").is_dir()
            assert (foreign / "keep.txt").exists()
            assert store.clean_stale() == []
            # A second store cannot take a namespace a live process holds.
            with pytest.raises(HandoffError, match="owned by another live run"):
                HandoffStore(HandoffConfig(root=str(tmp_path)), run_id="live").open()
    finally:
        live.kill()
        live.wait(10)
    time.sleep(0.05)
    with HandoffStore(HandoffConfig(root=str(tmp_path)), run_id="after"):
        assert not (tmp_path / "ingest-live").exists()


def test_config_is_checked_and_never_shows_secrets() -> None:
    with pytest.raises(ConfigError, match=r"handoff\.mode"):
        HandoffConfig(mode="tape")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"handoff\.root"):
        HandoffConfig(mode="files")
    with pytest.raises(ConfigError, match=r"handoff\.root"):
        HandoffConfig(mode="shm", root="s3://bucket/x")
    with pytest.raises(ConfigError, match="segment_max_bytes"):
        HandoffConfig(segment_max_bytes=0)
    config = HandoffConfig(
        mode="files",
        root="s3://bucket/prefix",
        storage_options={"access_key": "AKIA", "secret_key": "hunter2", "session_token": "tok"},
    )
    text = repr(config)
    assert "hunter2" not in text and "tok'" not in text and "AKIA" in text
    with pytest.raises(ConfigError, match="run_id"):
        HandoffStore(HandoffConfig(), run_id="../x")


def test_a_dead_writers_open_segment_is_dropped_and_its_sealed_ones_kept(
    store: HandoffStore,
) -> None:
    """What a worker SIGKILLed mid-segment leaves (its hidden open file) goes when the
    supervisor sees it exit (``drop_unsealed``); sealed segments, and other partitions'
    open ones, stay. A 60-minute soak with a kill every 2 minutes kept ~4 MiB of them."""
    dead = SegmentWriter(store.location, "events", 3, start_offset=0)
    dead.append(records(0, 20))
    sealed = dead.seal(next_offset=20)
    assert sealed is not None
    dead.append(records(20, 20))  # open when the process dies: never sealed
    other = SegmentWriter(store.location, "events", 4, start_offset=0)
    other.append(records(0, 5))
    assert len(store.temporary_files()) == 2
    dropped = store.drop_unsealed("events", 3)
    assert len(dropped) == 1 and dropped[0].startswith(f"{store.namespace}/events/3/.")
    assert [os.path.dirname(p) for p in store.temporary_files()] == [f"{store.namespace}/events/4"]
    assert store.visible() == [sealed.segment_id]
    assert store.drop_unsealed("events", 3) == [] and store.drop_unsealed("absent", 0) == []
