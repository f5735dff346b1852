"""The window cuts on their own: pure functions over decoded batches (sliced ones too)."""

from __future__ import annotations

import pyarrow as pa

from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.protocol.recordbatch.records import decode_records
from ingest.worker.window import cut_at_end, cut_at_timestamp, skip_before_timestamp


def decoded(timestamps: list[int], *, base_offset: int = 100) -> pa.RecordBatch:
    records = [Record(value=b"v%d" % i, timestamp=ts) for i, ts in enumerate(timestamps)]
    batch = decode_records(build_batch(records, base_offset=base_offset), topic="t", partition=0)
    assert batch.batch is not None
    return batch.batch


def offsets(batch: pa.RecordBatch) -> list[int]:
    values: list[int] = batch.column("offset").to_pylist()
    return values


def test_cut_at_end_keeps_the_records_below_it() -> None:
    batch = decoded([1, 2, 3, 4, 5])  # offsets 100-104
    assert cut_at_end(batch, 105, 200) == (batch, 105)
    kept, position = cut_at_end(batch, 105, 103)
    assert (offsets(kept), position) == ([100, 101, 102], 103)
    kept, position = cut_at_end(batch.slice(2), 105, 104)  # a slice: buffer offset 2
    assert (offsets(kept), position) == ([102, 103], 104)


def test_cut_at_timestamp_stops_before_the_first_record_at_it() -> None:
    batch = decoded([10, 20, 5, 30, 40])
    assert cut_at_timestamp(batch, 105, 50) == (batch, 105, False)
    kept, position, reached = cut_at_timestamp(batch, 105, 20)
    assert (offsets(kept), position, reached) == ([100], 101, True)
    kept, position, reached = cut_at_timestamp(batch.slice(2), 105, 30)
    assert (offsets(kept), position, reached) == ([102], 103, True)


def test_skip_before_timestamp_drops_until_the_first_match_only() -> None:
    batch = decoded([10, 20, 5, 30, 40])
    kept, reached, dropped = skip_before_timestamp(batch, 15)
    # 102 (stamped 5) comes after the first match, so it is kept.
    assert (offsets(kept), reached, dropped) == ([101, 102, 103, 104], True, (100, 100))
    kept, reached, dropped = skip_before_timestamp(batch, 10)
    assert (offsets(kept), reached, dropped) == ([100, 101, 102, 103, 104], True, None)
    kept, reached, dropped = skip_before_timestamp(batch, 99)
    assert (offsets(kept), reached, dropped) == ([], False, None)
    kept, reached, dropped = skip_before_timestamp(batch.slice(1), 30)
    assert (offsets(kept), reached, dropped) == ([103, 104], True, (101, 102))
