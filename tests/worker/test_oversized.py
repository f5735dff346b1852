"""``split_oversized``: a record whose key and value pass the cap is reported, not kept;
the rest, and an answer whose columns hold fewer bytes than the cap, pass as they are."""

from __future__ import annotations

from ingest.protocol.recordbatch.record_builder import Record, build_batch
from ingest.protocol.recordbatch.records import decode_records
from ingest.worker.results import split_oversized


def _batch(sizes: list[tuple[int, int]]):  # type: ignore[no-untyped-def]
    records = [Record(value=b"v" * v, key=b"k" * k, timestamp=1) for k, v in sizes]
    return decode_records(build_batch(records, base_offset=100), topic="t", partition=0).batch


def test_records_over_the_cap_are_reported_without_their_bytes() -> None:
    batch = _batch([(1, 10), (5, 96), (0, 101), (50, 50), (0, 0)])
    kept, reports = split_oversized(batch, 100, "t-0")
    assert kept.column("offset").to_pylist() == [100, 103, 104]
    assert [(r.first_offset, r.last_offset, r.raw, r.kind) for r in reports] == [
        (101, 101, b"", "oversized"),
        (102, 102, b"", "oversized"),
    ]
    assert "record of 101 bytes" in reports[0].reason and "(100)" in reports[0].reason


def test_an_answer_within_the_cap_in_all_is_passed_as_it_is() -> None:
    batch = _batch([(3, 30), (3, 30), (3, 31)])
    kept, reports = split_oversized(batch, 100, "t-0")
    assert kept is batch and reports == ()
    # One byte more than the cap in one record: reported, from a slice of the answer too.
    kept, reports = split_oversized(_batch([(0, 5), (0, 101), (0, 5)]).slice(1), 100, "t-0")
    assert [r.first_offset for r in reports] == [101] and kept.num_rows == 1
