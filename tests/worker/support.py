"""Helpers for worker tests against the real broker: settings, running, comparing."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

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
    StartPosition,
    WorkerFinished,
    WorkerHandle,
    WorkerSettings,
)


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
) -> tuple[list[Event], WorkerFinished, WorkerHandle]:
    """Spawns a worker, collects its events until it finishes, joins it."""
    with WorkerHandle.spawn(settings, store=store) as handle:
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


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError(f"no VmRSS for pid {pid}")
