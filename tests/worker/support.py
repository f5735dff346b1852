"""Helpers for worker tests against the real broker: settings, running, comparing."""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Iterator, Sequence
from typing import Any, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ingest.client import ClientConfig
from ingest.handoff import HandoffStore, SegmentSealed
from ingest.testing import ConsumedRecord, ProducedRecord
from ingest.worker import (
    EndPosition,
    Event,
    FetchSettings,
    PartitionFetcher,
    StartPosition,
    WorkerFinished,
    WorkerHandle,
    WorkerSettings,
)

E = TypeVar("E")


def drain(fetcher: PartitionFetcher, end: int, *, timeout: float = 60.0) -> list[bytes]:
    """The values a ``PartitionFetcher`` hands on, one Fetch a poll, until its position
    reaches ``end``."""
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    while (fetcher.position or 0) < end:
        assert time.monotonic() < deadline, f"stuck at {fetcher.position} of {end}"
        result = fetcher.poll(prefetch=False)
        if result.batch is not None:
            values += result.batch.column("value").to_pylist()
    return values


class WatchedHandle(WorkerHandle):
    """A ``WorkerHandle`` a test can make wait for one kind of event.

    ``WatchedHandle.spawn(settings, store=store)`` starts the worker as
    ``WorkerHandle.spawn`` does. Events received after the one waited for are held for
    the next ``receive`` or ``wait_for``.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._held: deque[Event] = deque()

    def receive(self, timeout: float | None = 0.0) -> list[Event]:
        if not self._held:
            return super().receive(timeout)
        held = list(self._held)
        self._held.clear()
        return held + super().receive(0.0)

    def wait_for(self, kind: type[E], *, timeout: float, collect: list[Event] | None = None) -> E:
        """Receives until an event of ``kind`` arrives; others go to ``collect``.

        Raises TimeoutError, or RuntimeError when the worker ends first.
        """
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"{self!r}: no {kind.__name__} within {timeout}s")
            received = self.receive(min(remaining, 0.5))
            for index, event in enumerate(received):
                if isinstance(event, kind):
                    # What came after it stays for the next receive.
                    self._held.extendleft(reversed(received[index + 1 :]))
                    return event
                if collect is not None:
                    collect.append(event)
            if self.events_closed:
                self.join(1.0)
                raise RuntimeError(f"{self!r} ended before {kind.__name__}: {self.exit_reason()}")


def worker_settings(
    bootstrap: str,
    store: HandoffStore,
    topic: str,
    *,
    partition: int = 0,
    start: StartPosition | None = None,
    end: EndPosition | None = None,
    client: dict[str, Any] | None = None,
    fetch: dict[str, Any] | None = None,
    **settings: Any,
) -> WorkerSettings:
    return WorkerSettings(
        client=ClientConfig(bootstrap_servers=bootstrap, **(client or {})),
        topic=topic,
        partition=partition,
        handoff=store.location,
        start=start or StartPosition.earliest(),
        end=end,
        fetch=FetchSettings(**(fetch or {})),
        **settings,
    )


def run_to_end(
    settings: WorkerSettings, store: HandoffStore, *, timeout: float = 60.0
) -> tuple[list[Event], WorkerFinished, WatchedHandle]:
    """Spawns a worker, collects its events until it finishes, joins it."""
    with WatchedHandle.spawn(settings, store=store) as handle:
        events: list[Event] = []
        finished = handle.wait_for(WorkerFinished, timeout=timeout, collect=events)
        assert handle.join(10) == 0, handle.exit_reason()
    return events, finished, handle


def sealed(events: Sequence[Event]) -> list[SegmentSealed]:
    return [e for e in events if isinstance(e, SegmentSealed)]


def read_segments(store: HandoffStore, segments: Sequence[SegmentSealed]) -> pa.Table:
    return pa.concat_tables([store.read(s.uri) for s in segments])


def check_tiling(segments: Sequence[SegmentSealed], start: int, end: int) -> None:
    assert segments, "no segment"
    assert segments[0].from_offset == start
    assert segments[-1].next_offset == end
    for before, after in itertools.pairwise(segments):
        assert after.from_offset == before.next_offset, [
            (s.from_offset, s.first_offset, s.last_offset, s.next_offset) for s in segments
        ]


def varied_records(count: int, *, partition: int = 0) -> Iterator[ProducedRecord]:
    """Null and present keys, values of several sizes, some headers (one with a null value)."""
    pad = b"p" * 90
    for i in range(count):
        yield ProducedRecord(
            b"%010d" % i + pad[: 40 + i % 51],
            key=None if i % 3 == 0 else b"k%d" % i,
            partition=partition,
            headers=[("h", b"x%d" % i), ("n", None)] if i % 5 == 0 else None,
        )


def assert_same_records(table: pa.Table, reference: Sequence[ConsumedRecord]) -> None:
    """The worker's records equal the reference reader's, column by column (Arrow, not
    Python objects, on the worker's side)."""
    count = len(reference)
    assert table.num_rows == count, f"{table.num_rows} records, the reference has {count}"
    if count == 0:
        return

    def ints(name: str) -> np.ndarray:
        return np.fromiter((getattr(r, name) for r in reference), np.int64, count)

    np.testing.assert_array_equal(table.column("offset").to_numpy(), ints("offset"))
    np.testing.assert_array_equal(
        table.column("timestamp").cast(pa.int64()).to_numpy(), ints("timestamp_ms")
    )
    np.testing.assert_array_equal(
        table.column("timestamp_type").to_numpy().astype(np.int64), ints("timestamp_type")
    )
    np.testing.assert_array_equal(table.column("partition").to_numpy(), ints("partition"))
    assert set(table.column("topic").combine_chunks().dictionary.to_pylist()) == {
        reference[0].topic
    }
    for name in ("key", "value"):
        expected = pa.array([getattr(r, name) for r in reference], pa.binary())
        assert table.column(name).combine_chunks().equals(expected), f"{name} differs"
    headers = table.column("headers").combine_chunks()
    lengths = np.fromiter((len(r.headers) for r in reference), np.int64, count)
    np.testing.assert_array_equal(pc.list_value_length(headers).to_numpy(), lengths)
    flat = pc.list_flatten(headers)
    keys = [k for r in reference for k, _ in r.headers]
    header_values = [v for r in reference for _, v in r.headers]
    assert flat.field("key").equals(pa.array(keys, pa.string()))
    assert flat.field("value").equals(pa.array(header_values, pa.binary()))


def rss_kib(pid: int) -> int | None:
    """The process's resident set in KiB; None once it has exited, which it may do between
    a liveness check and this read (a zombie's status has no VmRSS, a reaped one no file)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except FileNotFoundError:
        return None
    for line in lines:
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    state = next((line.split()[1] for line in lines if line.startswith("State:")), "?")
    if state in ("Z", "X"):
        return None
    raise AssertionError(f"no VmRSS for pid {pid} (state {state})")
