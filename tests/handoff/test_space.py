"""The handoff within the space it has: the plan, and ENOSPC on a real small tmpfs."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from ingest.handoff import HandoffConfig, HandoffStore, SegmentWriter
from ingest.handoff.space import (
    BUDGET_SHARE,
    MIN_SEGMENT_BYTES,
    HandoffTooSmall,
    Wanted,
    free_bytes,
    plan_space,
)
from ingest.handoff.store import HandoffFull
from ingest.protocol.recordbatch.records import RECORD_SCHEMA
from ingest.testing.tmpfs import fill, mount_refusal, small_tmpfs

MIB = 1024 * 1024
DEFAULTS = Wanted(64 * MIB, 1024 * MIB, 256 * MIB, 128 * MIB)


# -- the plan ------------------------------------------------------------------------


def test_no_bound_keeps_the_configured_sizes() -> None:
    plan = plan_space(DEFAULTS, None, 8, where="s3://b/p")
    assert (plan.segment_max_bytes, plan.max_buffered_bytes) == (64 * MIB, 1024 * MIB)
    assert (plan.max_unacked_bytes, plan.resume_unacked_bytes) == (256 * MIB, 128 * MIB)


def test_plenty_of_space_keeps_the_configured_sizes() -> None:
    plan = plan_space(DEFAULTS, 24 * 1024 * MIB, 4, where="/dev/shm")
    assert plan.segment_max_bytes == 64 * MIB
    assert plan.max_buffered_bytes == 1024 * MIB


@pytest.mark.parametrize("free_mib", [8, 32, 64, 100, 1024])
@pytest.mark.parametrize("partitions", [1, 4, 12])
def test_open_segments_and_the_cap_fit_the_budget(free_mib: int, partitions: int) -> None:
    free = free_mib * MIB
    if partitions * MIN_SEGMENT_BYTES > free * BUDGET_SHARE:
        with pytest.raises(HandoffTooSmall):
            plan_space(DEFAULTS, free, partitions, where="/x")
        return
    plan = plan_space(DEFAULTS, free, partitions, where="/x")
    assert MIN_SEGMENT_BYTES <= plan.segment_max_bytes <= DEFAULTS.segment_max_bytes
    held = plan.max_buffered_bytes + partitions * plan.segment_max_bytes
    assert held <= free * BUDGET_SHARE, plan
    assert plan.max_unacked_bytes <= max(2 * plan.segment_max_bytes, plan.max_buffered_bytes)
    workers = partitions * plan.max_unacked_bytes  # what they may hold before a pause lands
    assert workers <= max(plan.max_buffered_bytes, 2 * partitions * plan.segment_max_bytes)
    if plan.segment_max_bytes > MIN_SEGMENT_BYTES:  # at the floor, ENOSPC is the backstop
        assert 2 * partitions * plan.segment_max_bytes <= free * BUDGET_SHARE
    assert 0 < plan.resume_unacked_bytes < plan.max_unacked_bytes
    assert plan.resume_buffered_bytes < plan.max_buffered_bytes


def test_more_partitions_get_smaller_segments() -> None:
    sizes = [plan_space(DEFAULTS, 64 * MIB, n, where="/x").segment_max_bytes for n in (1, 4, 8)]
    assert sizes == sorted(sizes, reverse=True) and sizes[0] > sizes[-1]


def test_too_little_space_for_one_segment_per_partition_is_refused_with_the_knobs() -> None:
    with pytest.raises(HandoffTooSmall) as refused:
        plan_space(DEFAULTS, 6 * MIB, 8, where="/dev/shm")
    text = str(refused.value)
    for part in ("/dev/shm has 6.0 MiB free", "8 partition(s)", "--shm-size", "emptyDir"):
        assert part in text, text
    assert refused.value.key == "handoff"


def test_free_bytes_is_none_for_an_object_store_and_measured_locally(tmp_path: Path) -> None:
    assert free_bytes("s3://bucket/prefix") is None
    measured = free_bytes(str(tmp_path))
    assert measured is not None and measured > 0


# -- ENOSPC on a real filesystem -----------------------------------------------------------


@pytest.fixture
def tiny(tmp_path: Path) -> Iterator[Path]:
    reason = mount_refusal()
    if reason is not None:
        pytest.skip(reason)
    with small_tmpfs(4 * MIB, base=tmp_path) as root:
        yield root


def _records(first: int, count: int, size: int = 1000) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict(
        {
            "topic": pa.array(["t"] * count).dictionary_encode(),
            "partition": [0] * count,
            "offset": list(range(first, first + count)),
            "timestamp": pa.array([1_700_000_000_000 + i for i in range(count)], pa.int64()),
            "timestamp_type": [0] * count,
            "key": [None] * count,
            "value": [b"v" * size] * count,
            "headers": [[] for _ in range(count)],
        },
        schema=RECORD_SCHEMA,
    )


def test_a_full_filesystem_publishes_what_fit_and_refuses_the_rest(tiny: Path) -> None:
    store = HandoffStore(HandoffConfig(mode="files", root=str(tiny), segment_max_bytes=64 * MIB))
    with store:
        writer = SegmentWriter(store.location, "t", 0)
        filler = tiny / "filler"
        fill(filler, leave=600 * 1024)
        writer.append(_records(0, 200))  # ~200 kB: fits
        with pytest.raises(HandoffFull, match="No space left"):
            writer.append(_records(200, 600))  # ~600 kB: does not
        salvaged = writer.take_salvaged()
        assert salvaged is not None and writer.take_salvaged() is None
        assert not writer.is_open
        assert (salvaged.from_offset, salvaged.last_offset, salvaged.next_offset) == (0, 199, 200)
        assert writer.covered_until == 200
        table = store.read(salvaged.uri)  # no end-of-stream marker: still a whole stream
        assert table.column("offset").to_pylist() == list(range(200))
        assert store.temporary_files() == []
        assert salvaged.bytes == os.path.getsize(store.location.path_of(salvaged.segment_id))

        with pytest.raises(HandoffFull):  # nothing open and no room: nothing published
            writer.append(_records(200, 600))
        assert writer.take_salvaged() is None and store.temporary_files() == []
        with pytest.raises(HandoffFull):
            writer.write_corrupt(
                first_offset=200, last_offset=210, raw=b"x" * MIB, reason="r", kind="crc"
            )
        assert store.temporary_files() == []

        filler.unlink()  # the space is back: the refused records go in where they left off
        writer.append(_records(200, 600))
        sealed = writer.seal(800)
        assert sealed is not None and sealed.from_offset == 200
        assert store.read(sealed.uri).column("offset").to_pylist() == list(range(200, 800))
