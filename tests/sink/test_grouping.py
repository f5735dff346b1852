"""How a batch's segments become Spark tasks (pure; no Spark)."""

from __future__ import annotations

from ingest.handoff import SegmentSealed
from spark_jobs.job import group_segments

MiB = 1 << 20


def segment(partition: int, first: int, size: int, topic: str = "t") -> SegmentSealed:
    return SegmentSealed(
        segment_id=f"{topic}-{partition}-{first}",
        uri=f"/seg/{topic}-{partition}-{first}",
        topic=topic,
        partition=partition,
        from_offset=first,
        first_offset=first,
        last_offset=first + 99,
        next_offset=first + 100,
        record_count=100,
        bytes=size,
        min_timestamp=0,
        max_timestamp=0,
    )


def group(segments: list[SegmentSealed], parallelism: int) -> list[tuple[str, ...]]:
    skip = {(s.topic, s.partition): None for s in segments}
    tasks = group_segments(
        segments, skip_through=skip, dead_skip_through=skip, parallelism=parallelism
    )
    return [t.uris for t in tasks]


def test_small_segments_of_a_partition_share_one_task_in_offset_order() -> None:
    segments = [segment(0, first, MiB // 4) for first in (300, 0, 200, 100)]
    assert group(segments, parallelism=2) == [
        ("/seg/t-0-0", "/seg/t-0-100", "/seg/t-0-200", "/seg/t-0-300")
    ]


def test_partitions_never_share_a_task() -> None:
    segments = [segment(p, 0, MiB) for p in (1, 0)] + [segment(0, 100, MiB)]
    assert group(segments, parallelism=1) == [("/seg/t-0-0", "/seg/t-0-100"), ("/seg/t-1-0",)]


def test_a_large_partition_is_split_so_every_core_gets_a_task() -> None:
    segments = [segment(0, i * 100, 16 * MiB) for i in range(8)]  # 128 MiB in one partition
    tasks = group(segments, parallelism=4)
    assert len(tasks) == 4 and all(len(t) == 2 for t in tasks)
    # And never more than 128 MiB in one task, whatever the parallelism.
    many = [segment(0, i * 100, 64 * MiB) for i in range(6)]
    assert all(len(t) <= 2 for t in group(many, parallelism=1))
