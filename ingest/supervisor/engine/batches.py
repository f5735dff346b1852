"""What waits for Spark, when a batch starts, and the batch's own thread.

Each partition's sealed segments and corrupt reports wait in arrival order
(``PendingItems``). A batch takes a *prefix* of each partition's items: its
txn version for a partition is the last offset of the items it holds, so
skipping an earlier item would mark it landed without landing it. Partitions
are taken round-robin up to the trigger's byte and record bounds, so a
backlog in one partition does not starve the others.

``BatchThread`` runs ``run_batch`` on a daemon thread: the supervisor's main
thread keeps reading worker events and group events meanwhile, and a process
that must stop at once is not held by a Spark job.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ingest.handoff import CorruptRangeReported, SegmentSealed
from ingest.processes import start_thread
from ingest.protocol.partition import Partition

__all__ = [
    "BatchThread",
    "Item",
    "PendingItems",
    "Selection",
    "item_id",
    "item_next_offset",
    "select",
]

Item = SegmentSealed | CorruptRangeReported


def item_id(item: Item) -> str:
    return item.segment_id if isinstance(item, SegmentSealed) else item.corrupt_id


def item_records(item: Item) -> int:
    return item.record_count if isinstance(item, SegmentSealed) else 1


def item_next_offset(item: Item) -> int | None:
    """The offset after the span the item accounts for (None: unknown, broken framing)."""
    if isinstance(item, SegmentSealed):
        return item.next_offset
    return None if item.last_offset is None else item.last_offset + 1


@dataclass
class PendingItems:
    """One partition's items waiting for a batch, oldest first."""

    items: deque[tuple[float, Item]] = field(default_factory=deque)
    bytes: int = 0
    records: int = 0

    def add(self, item: Item, now: float) -> None:
        self.items.append((now, item))
        self.bytes += item.bytes
        self.records += item_records(item)

    def take(self, count: int) -> list[Item]:
        taken = [self.items.popleft()[1] for _ in range(count)]
        for item in taken:
            self.bytes -= item.bytes
            self.records -= item_records(item)
        return taken

    def put_back(self, items: Iterable[Item], now: float) -> None:
        """Returns a failed batch's items to the front, in their order."""
        for item in reversed(list(items)):
            self.items.appendleft((now, item))
            self.bytes += item.bytes
            self.records += item_records(item)

    def clear(self) -> list[Item]:
        return self.take(len(self.items))

    def oldest(self) -> float | None:
        return self.items[0][0] if self.items else None

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Selection:
    items: Mapping[Partition, tuple[Item, ...]]

    @property
    def bytes(self) -> int:
        return sum(i.bytes for items in self.items.values() for i in items)

    @property
    def records(self) -> int:
        return sum(item_records(i) for items in self.items.values() for i in items)

    def segments(self) -> tuple[SegmentSealed, ...]:
        return tuple(
            i for items in self.items.values() for i in items if isinstance(i, SegmentSealed)
        )

    def corrupt(self) -> tuple[CorruptRangeReported, ...]:
        return tuple(
            i for items in self.items.values() for i in items if isinstance(i, CorruptRangeReported)
        )


def select(
    pending: Mapping[Partition, PendingItems], *, max_bytes: int, max_records: int
) -> Selection:
    """Per-partition prefixes, round-robin, within the bounds (at least one item)."""
    counts: dict[Partition, int] = {}
    size = records = 0
    order = sorted(p for p, items in pending.items() if len(items))
    progress = True
    while progress:
        progress = False
        for partition in order:
            queue = pending[partition].items
            taken = counts.get(partition, 0)
            if taken >= len(queue):
                continue
            item = queue[taken][1]
            if counts and (
                size + item.bytes > max_bytes or records + item_records(item) > max_records
            ):
                return _take(pending, counts)
            counts[partition] = taken + 1
            size += item.bytes
            records += item_records(item)
            progress = True
    return _take(pending, counts)


def _take(pending: Mapping[Partition, PendingItems], counts: Mapping[Partition, int]) -> Selection:
    return Selection({p: tuple(pending[p].take(n)) for p, n in counts.items() if n})


class BatchThread:
    """One batch running ``work`` on a daemon thread; poll ``done``, then ``outcome``."""

    def __init__(
        self,
        number: int,
        selection: Selection,
        incarnations: Mapping[Partition, int],
        work: Callable[[], Any],
        on_done: Callable[[], None] | None = None,
    ) -> None:
        self.number = number
        self._on_done = on_done
        self.selection = selection
        self.incarnations = dict(incarnations)
        self.started = time.monotonic()
        self._work = work
        self._result: Any = None
        self._error: BaseException | None = None
        self._done = threading.Event()
        self._thread = start_thread(f"batch-{number}", self._run)

    def _run(self) -> None:
        try:
            self._result = self._work()
        except BaseException as exc:
            self._error = exc
        finally:
            self._done.set()
            if self._on_done is not None:
                self._on_done()

    @property
    def partitions(self) -> frozenset[Partition]:
        return frozenset(self.selection.items)

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout: float | None) -> bool:
        return self._done.wait(timeout)

    def outcome(self) -> tuple[Any, BaseException | None]:
        assert self.done()
        return self._result, self._error
