"""How a batch's segments become Spark tasks (pure; no Spark), without pyspark locally."""

from __future__ import annotations

import itertools
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.engines.spark.python_worker.segment_source import SegmentTask
from ingest.engines.tasks import group_segments
from ingest.handoff import SegmentSealed

MiB = 1 << 20


def segment(
    partition: int, first: int, size: int, topic: str = "t", *, rows: int = 100, root: str = "/seg"
) -> SegmentSealed:
    return SegmentSealed(
        segment_id=f"{topic}-{partition}-{first}",
        uri=f"{root}/{topic}-{partition}-{first}",
        topic=topic,
        partition=partition,
        from_offset=first,
        first_offset=first,
        last_offset=first + rows - 1,
        next_offset=first + rows,
        record_count=rows,
        bytes=size,
        min_timestamp=0,
        max_timestamp=0,
    )


def tasks_of(segments: list[SegmentSealed], parallelism: int) -> tuple[SegmentTask, ...]:
    skip = {(s.topic, s.partition): None for s in segments}
    return group_segments(
        segments, skip_through=skip, dead_skip_through=skip, parallelism=parallelism
    )


def group(segments: list[SegmentSealed], parallelism: int) -> list[tuple[str, ...]]:
    return [t.uris for t in tasks_of(segments, parallelism)]


def row_ranges(
    segments: list[SegmentSealed], tasks: tuple[SegmentTask, ...]
) -> dict[int, list[tuple[int, int]]]:
    """Each partition's tasks as ranges of rows of all its segments, in task order."""
    start_of: dict[str, int] = {}
    total: dict[int, int] = {}
    for s in sorted(segments, key=lambda s: (s.partition, s.first_offset)):
        start_of[s.uri] = total.get(s.partition, 0)
        total[s.partition] = start_of[s.uri] + s.record_count
    rows_of = {s.uri: s.record_count for s in segments}
    ranges: dict[int, list[tuple[int, int]]] = {}
    for task in tasks:
        base = start_of[task.uris[0]]
        span = sum(rows_of[u] for u in task.uris)
        low, high = task.rows if task.rows is not None else (0, span)
        assert 0 <= low < high <= span
        ranges.setdefault(task.partition, []).append((base + low, base + high))
    return ranges


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


def test_partitions_that_do_not_divide_by_the_cores_are_cut_into_row_ranges() -> None:
    # 3 partitions of one 64 MiB segment on 2 cores: whole segments leave a core idle
    # for a third of the batch; halves make 3 even waves.
    segments = [segment(p, 0, 64 * MiB, rows=1000) for p in range(3)]
    tasks = tasks_of(segments, parallelism=2)
    assert len(tasks) == 6
    assert row_ranges(segments, tasks) == {p: [(0, 500), (500, 1000)] for p in range(3)}


def test_remote_segments_are_never_cut() -> None:
    segments = [segment(p, 0, 64 * MiB, rows=1000, root="s3://b/h") for p in range(3)]
    tasks = tasks_of(segments, parallelism=2)
    assert [(t.uris, t.rows) for t in tasks] == [((s.uri,), None) for s in segments]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(
            st.tuples(st.integers(1, 200 * MiB), st.integers(1, 5000)), min_size=1, max_size=6
        ),
        min_size=1,
        max_size=6,
    ),
    st.integers(1, 8),
)
def test_every_row_of_every_partition_is_in_exactly_one_task_in_order(
    layout: list[list[tuple[int, int]]], parallelism: int
) -> None:
    segments = []
    for partition, run in enumerate(layout):
        first = 0
        for size, rows in run:
            segments.append(segment(partition, first, size, rows=rows))
            first += rows
    tasks = tasks_of(segments, parallelism)
    ranges = row_ranges(segments, tasks)
    for partition, run in enumerate(layout):
        covered = ranges[partition]
        assert covered[0][0] == 0 and covered[-1][1] == sum(rows for _, rows in run)
        assert all(a[1] == b[0] for a, b in itertools.pairwise(covered)), covered
    for task in tasks:  # a task holds consecutive segments of one partition
        starts = [int(u.rsplit("-", 1)[1]) for u in task.uris]
        assert starts == sorted(starts)
        assert all(u.startswith(f"/seg/t-{task.partition}-") for u in task.uris)


def test_a_task_refuses_a_lone_uri_for_its_tuple_of_uris() -> None:
    # scripts/bench/sink.py once passed one URI: its tasks read "/" (a directory) and died
    # in Spark with "Expected file path, but / is a directory".
    with pytest.raises(TypeError, match="tuple of segment URIs"):
        SegmentTask("/seg/t-0-0", "t", 0, None, None)  # type: ignore[arg-type]
    assert SegmentTask(("/seg/t-0-0",), "t", 0, None, None).uris == ("/seg/t-0-0",)


def test_the_local_engine_path_does_not_import_pyspark() -> None:
    # pyspark costs ~0.1 s of imports; a run on the local engine (no transform) has no
    # use for it: not at the supervisor's start, nor at its first batch (ingest.engines.spark.job).
    code = (
        "import sys\n"
        "import ingest.supervisor.modes.group_run, ingest.engines.local.task_pool, ingest.engines.tasks, ingest.engines.spark.job\n"
        "import ingest.engines.local.task_process, ingest.worker.process\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('pyspark', 'pandas'))\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
