"""Spark tasks for a batch: each partition's segments cut into pieces of equal size.

A task (and a Parquet file) per segment made small batches pay Spark's per-task
cost hundreds of times; one task per segment left cores idle when the count did
not divide by them. ``group_segments`` picks the piece size whose tasks finish
soonest on the session's cores (see its docstring for the measurements).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping, Sequence

from ingest.engines.plan import SegmentTask
from ingest.handoff import SegmentSealed
from ingest.protocol.partition import Partition

__all__ = ["group_segments"]

# A task's segments: at least this much (fewer, larger files), at most that much (memory).
_MIN_TASK_BYTES = 8 << 20
_MAX_TASK_BYTES = 128 << 20
# What a task costs besides its rows, in bytes of segment (~30 ms at ~70 MB/s per core).
_TASK_COST_BYTES = 2 << 20


def group_segments(
    segments: Sequence[SegmentSealed],
    *,
    skip_through: Mapping[Partition, int | None],
    dead_skip_through: Mapping[Partition, int | None],
    parallelism: int,
) -> tuple[SegmentTask, ...]:
    """Spark tasks for a batch: each partition's records cut into pieces of equal size,
    a piece spanning consecutive segments (or a row range of a local one).

    A task (and a Parquet file) per segment made small batches pay Spark's per-task
    cost hundreds of times (measured: 50k rows in 160 segments 8.2-10.7 s, in 4
    segments 0.5-1.3 s, warm session); one task per segment left cores idle when the
    count did not divide by them (3 segments on 2 cores: the last one alone). The
    piece size is the one, for 1 to 4 waves of tasks per core, whose tasks finish
    soonest when scheduled on ``parallelism`` cores, counting a fixed cost per task."""
    cores = max(parallelism, 1)
    by_partition: dict[Partition, list[SegmentSealed]] = {}
    for segment in sorted(segments, key=lambda s: (s.topic, s.partition, s.first_offset)):
        by_partition.setdefault(Partition(segment.topic, segment.partition), []).append(segment)
    sizes = {key: sum(s.bytes for s in run) for key, run in by_partition.items()}
    total = sum(sizes.values())
    if not total:
        return ()
    best: tuple[float, int, dict[Partition, int]] | None = None
    for waves in range(1, 5):
        piece = min(max(total / (cores * waves), _MIN_TASK_BYTES), _MAX_TASK_BYTES)
        counts = {key: _piece_count(size, piece) for key, size in sizes.items()}
        loads = sorted(
            (
                sizes[key] / count + _TASK_COST_BYTES
                for key, count in counts.items()
                for _ in range(count)
            ),
            reverse=True,
        )
        finish = [0.0] * cores
        for load in loads:  # longest first, each on the core free soonest
            finish[finish.index(min(finish))] += load
        candidate = (max(finish), len(loads), counts)
        if best is None or candidate[:2] < best[:2]:
            best = candidate
    assert best is not None
    tasks: list[SegmentTask] = []
    for key, run in by_partition.items():
        for uris, rows in _pieces(run, best[2][key]):
            tasks.append(
                SegmentTask(uris, key[0], key[1], skip_through[key], dead_skip_through[key], rows)
            )
    return tuple(tasks)


def _local(run: Sequence[SegmentSealed]) -> bool:
    """Segments a task can map instead of download (a row range of one is then cheap)."""
    return all("://" not in s.uri for s in run)


def _piece_count(size: int, piece: float) -> int:
    return max(1, round(size / piece), -(-size // _MAX_TASK_BYTES))


def _pieces(
    run: Sequence[SegmentSealed], count: int
) -> list[tuple[tuple[str, ...], tuple[int, int] | None]]:
    """``run`` (one partition's consecutive segments) cut into ``count`` pieces: the
    segments each covers, and the row range within them (None: all of their rows).
    Remote segments are not cut: consecutive ones are grouped up to a piece's size."""
    if count <= 1:
        return [(tuple(s.uri for s in run), None)]
    if not _local(run):
        piece = sum(s.bytes for s in run) / count
        groups: list[list[SegmentSealed]] = [[]]
        group_bytes = 0
        for segment in run:
            if groups[-1] and group_bytes + segment.bytes > piece:
                groups.append([])
                group_bytes = 0
            groups[-1].append(segment)
            group_bytes += segment.bytes
        return [(tuple(s.uri for s in group), None) for group in groups]
    # starts[i]: the first row of segment i within the run; starts[-1]: all rows.
    starts = list(itertools.accumulate((s.record_count for s in run), initial=0))
    bounds = [starts[-1] * i // count for i in range(count + 1)]
    pieces: list[tuple[tuple[str, ...], tuple[int, int] | None]] = []
    for low, high in itertools.pairwise(bounds):
        if low == high:
            continue
        first = bisect.bisect_right(starts, low) - 1  # the segment holding row ``low``
        last = bisect.bisect_left(starts, high) - 1  # the last one starting below ``high``
        window = (low - starts[first], high - starts[first])
        whole = (0, starts[last + 1] - starts[first])
        uris = tuple(s.uri for s in run[first : last + 1])
        pieces.append((uris, None if window == whole else window))
    return pieces
