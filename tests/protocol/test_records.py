"""RecordBatch v2 decoding: the fast decoder against the reference, and against the spec.

Every vector goes through both decoders (``decode_both``) and must come out
identical; the tests then check the result against what Kafka's format says.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
from typing import Any

import pyarrow as pa
import pytest

from ingest.errors import DecodeError
from ingest.protocol.recordbatch import _records
from ingest.protocol.recordbatch.compression import XERIAL_MAGIC, Codec, compress, decompress
from ingest.protocol.recordbatch.record_builder import (
    Record,
    build_batch,
    control_batch,
    encode_record,
    legacy_message,
)
from ingest.protocol.recordbatch.records import (
    RECORD_SCHEMA,
    DecodedRecords,
    crc32c,
    decode_records,
)
from ingest.protocol.recordbatch.records_reference import crc32c_python, decode_records_reference
from ingest.protocol.recordbatch.transactions import UnlistedAbort

CODECS = ("none", "gzip", "snappy", "lz4", "zstd")
T0 = 1_700_000_000_000


# -- helpers (also used by test_records_fuzz.py) ---------------------------------------


def decode_both(records: bytes, **kwargs: Any) -> DecodedRecords:
    """Decodes with both decoders, checks they agree, and returns the fast decoder's result."""
    kwargs.setdefault("topic", "topic-a")
    kwargs.setdefault("partition", 3)
    kwargs.setdefault("check_crc", True)  # the builder's CRCs must hold too
    fast = decode_records(records, **kwargs)
    reference = decode_records_reference(records, **kwargs)
    assert_same(fast, reference)
    return fast


def assert_same(fast: DecodedRecords, reference: DecodedRecords) -> None:
    assert fast.batch.schema == reference.batch.schema == RECORD_SCHEMA
    fast.batch.validate(full=True)
    if not fast.batch.equals(reference.batch):
        raise AssertionError(
            f"batches differ:\nfast: {fast.batch.to_pylist()[:3]}\n"
            f"reference: {reference.batch.to_pylist()[:3]}"
        )
    assert fast.next_offset == reference.next_offset
    assert fast.incomplete_batch_size == reference.incomplete_batch_size
    assert fast.corrupt == reference.corrupt
    assert fast.unlisted_aborts == reference.unlisted_aborts
    assert fast.carried_aborts == reference.carried_aborts
    assert fast.open_transactions == reference.open_transactions
    assert fast.epochs == reference.epochs


def column(decoded: DecodedRecords, name: str) -> list[Any]:
    return decoded.batch.column(name).to_pylist()


def mixed_records(count: int, *, start: int = 0, value_size: int = 20) -> list[Record]:
    """Records with every shape: null and empty keys/values, headers with null values."""
    out = []
    for i in range(start, start + count):
        key: bytes | None = f"key-{i}".encode()
        if i % 5 == 0:
            key = None
        elif i % 11 == 0:
            key = b""
        value: bytes | None = (f"value-{i}-".encode() * value_size)[: value_size + i % 7]
        if i % 7 == 0:
            value = None
        elif i % 13 == 0:
            value = b""
        headers: list[tuple[str, bytes | None]] = []
        if i % 3 == 0:
            headers = [("trace", f"t{i}".encode()), ("empty", b""), ("none", None)]
        out.append(Record(value, key=key, headers=headers, timestamp=T0 + i * 3))
    return out


def expected_rows(records: list[Record], base_offset: int, **extra: Any) -> list[dict[str, Any]]:
    """What the decoder must produce for CreateTime records, as plain Python values."""
    out = []
    for i, r in enumerate(records):
        out.append(
            {
                "offset": base_offset + i,
                "timestamp_ms": r.timestamp,
                "timestamp_type": 0,
                "key": r.key,
                "value": r.value,
                "headers": [
                    {"key": k if isinstance(k, str) else k.decode("utf-8", "replace"), "value": v}
                    for k, v in r.headers
                ],
            }
            | extra
        )
    return out


def actual_rows(decoded: DecodedRecords) -> list[dict[str, Any]]:
    table = decoded.batch
    timestamps = table.column("timestamp").cast(pa.int64()).to_pylist()
    out = []
    for i, row in enumerate(table.to_pylist()):
        assert row["topic"] == "topic-a" and row["partition"] == 3
        out.append(
            {
                "offset": row["offset"],
                "timestamp_ms": timestamps[i],
                "timestamp_type": row["timestamp_type"],
                "key": row["key"],
                "value": row["value"],
                "headers": row["headers"],
            }
        )
    return out


# -- golden vector ----------------------------------------------------------------------

# One batch, two records, written field by field from the Kafka protocol guide.
GOLDEN_BATCH = bytes.fromhex(
    "".join(
        line.split("#")[0].strip()
        for line in """
    0000000000000005      # base_offset 5
    00000049              # batch_length 73 (bytes after this field)
    ffffffff              # partition_leader_epoch -1
    02                    # magic 2
    16ea3d29              # crc: CRC32C of attributes .. end
    0000                  # attributes: no compression, CreateTime, not transactional/control
    00000001              # last_offset_delta 1
    0000018bcfe56800      # base_timestamp 1700000000000
    0000018bcfe56807      # max_timestamp 1700000000007
    ffffffffffffffff      # producer_id -1
    ffff                  # producer_epoch -1
    ffffffff              # base_sequence -1
    00000002              # record count 2
    20                    # record 0: length 16 (zigzag varint)
    00                    #   attributes
    00                    #   timestamp_delta 0
    00                    #   offset_delta 0
    02 6b                 #   key length 1, "k"
    0a 68656c6c6f         #   value length 5, "hello"
    02                    #   header count 1
    02 68                 #     header key length 1, "h"
    02 76                 #     header value length 1, "v"
    0c                    # record 1: length 6
    00                    #   attributes
    0e                    #   timestamp_delta 7
    02                    #   offset_delta 1
    01                    #   key length -1: null
    01                    #   value length -1: null
    00                    #   header count 0
    """.splitlines()
    ).replace(" ", "")
)


def test_golden_vector_decodes_field_by_field() -> None:
    decoded = decode_both(GOLDEN_BATCH)
    assert decoded.corrupt == ()
    assert decoded.next_offset == 7
    assert decoded.incomplete_batch_size is None
    assert actual_rows(decoded) == [
        {
            "offset": 5,
            "timestamp_ms": 1_700_000_000_000,
            "timestamp_type": 0,
            "key": b"k",
            "value": b"hello",
            "headers": [{"key": "h", "value": b"v"}],
        },
        {
            "offset": 6,
            "timestamp_ms": 1_700_000_000_007,
            "timestamp_type": 0,
            "key": None,
            "value": None,
            "headers": [],
        },
    ]
    topic = decoded.batch.column("topic")
    assert topic.type == pa.dictionary(pa.int32(), pa.string())
    assert topic.to_pylist() == ["topic-a", "topic-a"]


def test_golden_vector_is_what_the_builder_writes() -> None:
    built = build_batch(
        [
            Record(b"hello", key=b"k", headers=[("h", b"v")], timestamp=T0),
            Record(None, key=None, timestamp=T0 + 7),
        ],
        base_offset=5,
    )
    assert built == GOLDEN_BATCH
    assert crc32c_python(GOLDEN_BATCH[21:]) == 0x16EA3D29


def test_schema_is_exact() -> None:
    assert RECORD_SCHEMA.names == [
        "topic",
        "partition",
        "offset",
        "timestamp",
        "timestamp_type",
        "key",
        "value",
        "headers",
    ]
    assert RECORD_SCHEMA.field("timestamp").type == pa.timestamp("ms", tz="UTC")
    assert RECORD_SCHEMA.field("headers").type.value_type == pa.struct(
        [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
    )
    assert RECORD_SCHEMA.field("key").nullable and RECORD_SCHEMA.field("value").nullable


# -- CRC32C -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"123456789", 0xE3069283),
        (bytes(32), 0x8A9136AA),  # RFC 3720 B.4 test vectors
        (b"\xff" * 32, 0x62A8AB43),
        (bytes(range(32)), 0x46DD794E),
        (bytes(range(31, -1, -1)), 0x113FDB5C),
        (b"", 0),
    ],
)
def test_crc32c_known_vectors(data: bytes, expected: int) -> None:
    assert crc32c(data) == expected
    assert _records.crc32c(data, 0, False) == expected  # the software path too
    assert crc32c_python(data) == expected


@pytest.mark.parametrize(
    "size", [1, 7, 8, 9, 255, 767, 768, 769, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 13, 100_003]
)
def test_crc32c_paths_agree_at_lane_boundaries(size: int) -> None:
    data = os.urandom(size + 3)
    for skew in range(3):  # unaligned starts too
        chunk = memoryview(data)[skew : skew + size]
        expected = _records.crc32c(chunk, 0, False)
        assert _records.crc32c(chunk) == expected
        split = size // 3
        assert _records.crc32c(chunk[split:], _records.crc32c(chunk[:split])) == expected
    assert crc32c_python(data[:size]) == _records.crc32c(data[:size])


# -- vectors across codecs ---------------------------------------------------------------


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec_decodes_every_record_shape(codec: str) -> None:
    first = mixed_records(60)
    second = mixed_records(40, start=60, value_size=200)
    records = build_batch(first, base_offset=100, compression=codec) + build_batch(
        second, base_offset=160, compression=codec
    )
    decoded = decode_both(records)
    assert decoded.corrupt == ()
    assert decoded.next_offset == 200
    assert actual_rows(decoded) == expected_rows(first, 100) + expected_rows(second, 160)
    assert decoded.batch.column("key").null_count == 20
    assert decoded.batch.column("value").null_count == 15


def test_snappy_raw_and_xerial_framing_both_decode() -> None:
    records = mixed_records(30, value_size=3000)  # > 32 KiB: several xerial chunks
    xerial = build_batch(records, compression="snappy", snappy_framing="xerial")
    raw = build_batch(records, compression="snappy", snappy_framing="raw")
    assert XERIAL_MAGIC in xerial and XERIAL_MAGIC not in raw
    for batch in (xerial, raw):
        assert actual_rows(decode_both(batch)) == expected_rows(records, 0)


@pytest.mark.parametrize("codec", ["none", "lz4", "zstd"])
def test_large_values(codec: str) -> None:
    big = [
        Record(os.urandom(900 * 1024), key=b"big", timestamp=T0),
        Record(b"x" * 900 * 1024, key=None, headers=[("h", b"y" * 1000)], timestamp=T0 + 1),
    ]
    decoded = decode_both(build_batch(big, base_offset=7, compression=codec))
    assert actual_rows(decoded) == expected_rows(big, 7)


def test_many_batches_concatenate_into_one_arrow_batch() -> None:
    batches = [build_batch(mixed_records(5, start=i * 5), base_offset=i * 5) for i in range(40)]
    decoded = decode_both(b"".join(batches))
    assert decoded.batch.num_rows == 200
    assert column(decoded, "offset") == list(range(200))
    assert isinstance(decoded.batch.column("value"), pa.BinaryArray)  # one contiguous array


def test_explicit_offset_deltas_with_gaps_like_a_compacted_log() -> None:
    records = [
        Record(b"a", offset_delta=0, timestamp=T0),
        Record(b"b", offset_delta=4, timestamp=T0 + 1),
        Record(b"c", offset_delta=9, timestamp=T0 + 2),
    ]
    decoded = decode_both(build_batch(records, base_offset=50, last_offset_delta=11))
    assert column(decoded, "offset") == [50, 54, 59]
    assert decoded.next_offset == 62  # the batch's last offset (61) + 1, not the last record's


def test_empty_batch_advances_next_offset() -> None:
    decoded = decode_both(build_batch([], base_offset=30, last_offset_delta=4))
    assert decoded.batch.num_rows == 0
    assert decoded.next_offset == 35


def test_empty_input() -> None:
    decoded = decode_both(b"")
    assert decoded.batch.num_rows == 0
    assert decoded.batch.schema == RECORD_SCHEMA
    assert (decoded.next_offset, decoded.incomplete_batch_size, decoded.corrupt) == (None, None, ())


def test_timestamps_are_base_plus_delta_including_negative_deltas() -> None:
    records = [Record(b"a", timestamp=T0 + 50), Record(b"b", timestamp=T0), Record(b"c")]
    decoded = decode_both(build_batch(records))
    assert column(decoded, "timestamp_type") == [0, 0, 0]
    timestamps = decoded.batch.column("timestamp").cast(pa.int64()).to_pylist()
    assert timestamps == [T0 + 50, T0, T0 + 50]


def test_log_append_time_uses_the_batch_max_timestamp() -> None:
    records = [Record(b"a", timestamp=T0), Record(b"b", timestamp=T0 + 9)]
    batches = build_batch(records, base_offset=0, log_append_time=T0 + 12345) + build_batch(
        records, base_offset=2
    )
    decoded = decode_both(batches)
    timestamps = decoded.batch.column("timestamp").cast(pa.int64()).to_pylist()
    assert timestamps == [T0 + 12345, T0 + 12345, T0, T0 + 9]
    assert column(decoded, "timestamp_type") == [1, 1, 0, 0]


def test_header_keys_that_are_not_utf8_are_replaced_like_java_does() -> None:
    records = [
        Record(b"v", headers=[(b"ok", b"1"), (b"bad\xff\xfekey", b"2"), (b"\xed\xa0\x80", None)])
    ]
    decoded = decode_both(build_batch(records))
    assert column(decoded, "headers") == [
        [
            {"key": "ok", "value": b"1"},
            {"key": "bad\ufffd\ufffdkey", "value": b"2"},
            {"key": "\ufffd\ufffd\ufffd", "value": None},
        ]
    ]


@pytest.mark.parametrize(
    "data",
    [b"", b"abc", "é€😀".encode(), b"\xc0\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xe2\x82",
     b"a" * 9 + b"\xff", "x" * 8 + "é", b"\xf0\x9f\x98\x80" * 3],
)  # fmt: skip
def test_kernel_utf8_check_matches_python(data: bytes | str) -> None:
    raw = data.encode() if isinstance(data, str) else data
    try:
        raw.decode("utf-8")
        valid = True
    except UnicodeDecodeError:
        valid = False
    assert _records.utf8_valid(raw) is valid


# -- fetch_offset and partial batches ----------------------------------------------------


def test_records_below_fetch_offset_are_dropped() -> None:
    first = mixed_records(10)
    second = mixed_records(10, start=10)
    records = build_batch(first, base_offset=0, compression="lz4") + build_batch(
        second, base_offset=10
    )
    decoded = decode_both(records, fetch_offset=4)
    assert column(decoded, "offset") == list(range(4, 20))
    assert decoded.next_offset == 20
    decoded = decode_both(records, fetch_offset=13)
    assert column(decoded, "offset") == list(range(13, 20))
    decoded = decode_both(records, fetch_offset=25)
    assert decoded.batch.num_rows == 0
    assert decoded.next_offset == 25  # never behind where the caller asked to be


def test_partial_trailing_batch_is_reported_with_its_declared_size() -> None:
    whole = build_batch(mixed_records(10), base_offset=0)
    cut = build_batch(mixed_records(10, start=10), base_offset=10)
    for keep in (12, 16, 17, 40, 61, 62, len(cut) - 1):
        decoded = decode_both(whole + cut[:keep])
        assert decoded.incomplete_batch_size == len(cut), keep
        assert decoded.next_offset == 10
        assert decoded.corrupt == ()
        assert decoded.batch.num_rows == 10


def test_tail_shorter_than_the_framing_is_ignored() -> None:
    whole = build_batch(mixed_records(3), base_offset=0)
    decoded = decode_both(whole + b"\x00" * 11)
    assert (decoded.batch.num_rows, decoded.incomplete_batch_size, decoded.corrupt) == (3, None, ())


def test_only_a_partial_batch() -> None:
    cut = build_batch(mixed_records(10), base_offset=0)
    decoded = decode_both(cut[:100])
    assert decoded.batch.num_rows == 0
    assert decoded.next_offset is None
    assert decoded.incomplete_batch_size == len(cut)


# -- control batches and transactions ----------------------------------------------------


def txn(records: list[Record], base_offset: int, producer_id: int, **kwargs: Any) -> bytes:
    return build_batch(
        records,
        base_offset=base_offset,
        producer_id=producer_id,
        producer_epoch=0,
        transactional=True,
        **kwargs,
    )


def values(decoded: DecodedRecords) -> list[bytes]:
    return column(decoded, "value")


def two_producers_log() -> tuple[bytes, list[tuple[int, int]]]:
    """Producer 7 aborts offsets 0-1, producer 8 commits 2-3, producer 7 commits 6-7,
    producer 7 aborts 10 (compressed), plus a non-transactional batch at 9."""
    log = b"".join(
        [
            txn([Record(b"7a"), Record(b"7b")], 0, 7),
            txn([Record(b"8a"), Record(b"8b")], 2, 8),
            control_batch("abort", base_offset=4, producer_id=7),
            control_batch("commit", base_offset=5, producer_id=8),
            txn([Record(b"7c"), Record(b"7d")], 6, 7),
            control_batch("commit", base_offset=8, producer_id=7),
            build_batch([Record(b"plain")], base_offset=9),
            txn([Record(b"7e")], 10, 7, compression="zstd"),
            control_batch("abort", base_offset=11, producer_id=7),
        ]
    )
    return log, [(7, 0), (7, 10)]


def test_read_uncommitted_skips_only_control_batches() -> None:
    log, aborted = two_producers_log()
    decoded = decode_both(log, aborted_transactions=aborted)
    assert values(decoded) == [b"7a", b"7b", b"8a", b"8b", b"7c", b"7d", b"plain", b"7e"]
    assert decoded.next_offset == 12


def test_read_committed_drops_aborted_transactions() -> None:
    log, aborted = two_producers_log()
    decoded = decode_both(log, read_committed=True, aborted_transactions=aborted)
    assert values(decoded) == [b"8a", b"8b", b"7c", b"7d", b"plain"]
    assert column(decoded, "offset") == [2, 3, 6, 7, 9]
    assert decoded.next_offset == 12  # past the control and aborted batches


def test_an_abort_the_broker_did_not_list_is_dropped_and_reported() -> None:
    # A broker that lists no aborted transaction (Tansu 0.6.0): the ABORT markers that
    # follow producer 7's data show them aborted all the same.
    log, _ = two_producers_log()
    for aborted in (None, []):
        decoded = decode_both(log, read_committed=True, aborted_transactions=aborted)
        assert values(decoded) == [b"8a", b"8b", b"7c", b"7d", b"plain"]
        assert decoded.unlisted_aborts == (UnlistedAbort(7, 0, 4), UnlistedAbort(7, 10, 11))
        assert decoded.next_offset == 12 and decoded.open_transactions == ()


def test_listed_aborts_are_not_reported_as_unlisted() -> None:
    log, aborted = two_producers_log()
    assert decode_both(log, read_committed=True, aborted_transactions=aborted).unlisted_aborts == ()
    assert decode_both(log, aborted_transactions=aborted).unlisted_aborts == ()


def test_transactional_data_without_its_marker_is_carried_to_the_next_answer() -> None:
    log = b"".join(
        [
            build_batch([Record(b"plain")], base_offset=0),
            txn([Record(b"8a")], 1, 8),
            control_batch("commit", base_offset=2, producer_id=8),
            txn([Record(b"7a"), Record(b"7b")], 3, 7),  # no marker in this answer
            build_batch([Record(b"after")], base_offset=5),
            txn([Record(b"9a")], 6, 9),
        ]
    )
    decoded = decode_both(log, read_committed=True)
    assert values(decoded) == [b"plain", b"8a", b"7a", b"7b", b"after", b"9a"]
    assert decoded.next_offset == 7
    assert decoded.open_transactions == ((7, 3), (9, 6))
    # The next answer: 7 commits, 9 aborts. 9's record was handed on: a broker fault
    # the fetcher must stop on; 10, opened and aborted within the answer, is dropped.
    more = b"".join(
        [
            control_batch("commit", base_offset=7, producer_id=7),
            txn([Record(b"10a")], 8, 10),
            control_batch("abort", base_offset=9, producer_id=9),
            control_batch("abort", base_offset=10, producer_id=10),
            txn([Record(b"11a")], 11, 11),
        ]
    )
    carried = dict(decoded.open_transactions)
    decoded = decode_both(more, read_committed=True, fetch_offset=7, carried=carried)
    assert values(decoded) == [b"11a"]
    assert decoded.carried_aborts == (UnlistedAbort(9, 6, 9),)
    assert decoded.unlisted_aborts == (UnlistedAbort(10, 8, 10),)
    assert decoded.open_transactions == ((11, 11),)
    # read_uncommitted tracks nothing.
    assert decode_both(log).open_transactions == ()


def test_a_carried_producer_that_commits_is_no_fault() -> None:
    marker = control_batch("commit", base_offset=5, producer_id=7)
    decoded = decode_both(marker, read_committed=True, fetch_offset=5, carried={7: 3, 9: 4})
    assert decoded.carried_aborts == () and decoded.open_transactions == ((9, 4),)
    # A marker below the fetch offset was read by an earlier answer: it decides nothing.
    abort = control_batch("abort", base_offset=2, producer_id=9)
    decoded = decode_both(abort, read_committed=True, fetch_offset=5, carried={9: 4})
    assert decoded.carried_aborts == () and decoded.open_transactions == ((9, 4),)


def test_read_committed_from_a_fetch_offset_inside_the_log() -> None:
    log, aborted = two_producers_log()
    decoded = decode_both(log, read_committed=True, aborted_transactions=aborted, fetch_offset=3)
    assert column(decoded, "offset") == [3, 6, 7, 9]


def test_abort_only_ends_the_range_of_its_own_producer() -> None:
    def log(marker_of_7: str) -> bytes:
        return b"".join(
            [
                txn([Record(b"7a")], 0, 7),
                txn([Record(b"9a")], 1, 9),
                control_batch("abort", base_offset=2, producer_id=9),
                txn([Record(b"7b")], 3, 7),
                control_batch(marker_of_7, base_offset=4, producer_id=7),
            ]
        )

    decoded = decode_both(log("abort"), read_committed=True, aborted_transactions=[(9, 1), (7, 0)])
    assert values(decoded) == [] and decoded.unlisted_aborts == ()
    decoded = decode_both(log("commit"), read_committed=True, aborted_transactions=[(9, 1)])
    assert values(decoded) == [b"7a", b"7b"] and decoded.unlisted_aborts == ()


def test_malformed_control_record_is_reported_under_read_committed() -> None:
    bad_marker = build_batch(
        [Record(b"", key=b"\x00")],  # a control key needs 4 bytes
        base_offset=0,
        control=True,
        transactional=True,
        producer_id=7,
    )
    decoded = decode_both(bad_marker, read_committed=True, aborted_transactions=[(7, 0)])
    assert [c.kind for c in decoded.corrupt] == ["control"]
    assert decoded.corrupt[0].raw == bad_marker
    assert decode_both(bad_marker).corrupt == ()  # read_uncommitted never reads markers


# -- corrupt input -----------------------------------------------------------------------


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0x40]) + data[position + 1 :]


def test_crc_mismatch_is_reported_and_decoding_goes_on() -> None:
    good_a = build_batch(mixed_records(3), base_offset=0)
    bad = flip(build_batch(mixed_records(4, start=3), base_offset=3), 70)
    good_b = build_batch(mixed_records(2, start=7), base_offset=7)
    decoded = decode_both(good_a + bad + good_b)
    assert column(decoded, "offset") == [0, 1, 2, 7, 8]
    (report,) = decoded.corrupt
    assert report.kind == "crc" and report.reason.startswith("CRC mismatch")
    assert (report.base_offset, report.last_offset, report.raw) == (3, 6, bad)
    assert report.position == len(good_a)
    assert decoded.next_offset == 9


def test_crc_checks_are_off_by_default() -> None:
    batch = build_batch([Record(b"abcdef")])
    damaged = flip(batch, batch.index(b"abcdef"))
    assert values(decode_both(damaged, check_crc=False)) == [b"\x21bcdef"]
    assert decode_records(damaged, topic="t", partition=0).corrupt == ()
    assert decode_both(damaged, check_crc=True).corrupt[0].kind == "crc"


def test_broken_framing_reports_the_rest_of_the_buffer() -> None:
    good = build_batch(mixed_records(3), base_offset=0)
    broken = struct.pack(">qi", 3, 5) + b"\x00" * 40  # length 5 is below any message
    decoded = decode_both(good + broken + good)
    assert decoded.batch.num_rows == 3
    (report,) = decoded.corrupt
    assert report.kind == "framing"
    assert report.raw == broken + good
    assert report.base_offset == 3 and report.last_offset is None
    assert decoded.next_offset == 3
    assert decoded.incomplete_batch_size is None


def test_truncated_garbage_is_broken_framing_not_a_partial_batch() -> None:
    garbage = struct.pack(">qi", 0, 10_000) + b"\x00" * 4 + b"\x07" + b"\x00" * 20
    decoded = decode_both(garbage)
    assert [c.kind for c in decoded.corrupt] == ["framing"]
    assert decoded.incomplete_batch_size is None


def test_unknown_magic_is_skipped_by_its_length() -> None:
    odd = bytearray(build_batch([Record(b"x")], base_offset=3))
    odd[16] = 3
    good = build_batch([Record(b"y")], base_offset=4)
    decoded = decode_both(bytes(odd) + good)
    assert values(decoded) == [b"y"]
    (report,) = decoded.corrupt
    assert report.reason == "unknown magic 3 at offset 3" and report.kind == "magic"
    # Its header cannot say where it ends; the next batch's base offset does.
    assert (report.base_offset, report.last_offset) == (3, 3)


def test_a_skipped_batch_is_bounded_by_the_next_one_or_left_open_when_last() -> None:
    odd = bytearray(build_batch([Record(b"x")] * 5, base_offset=10))
    odd[16] = 9
    before = build_batch([Record(b"a")] * 10, base_offset=0)
    after = build_batch([Record(b"y")] * 5, base_offset=15)
    (bounded,) = decode_both(before + bytes(odd) + after).corrupt
    assert (bounded.base_offset, bounded.last_offset) == (10, 14)
    # Last in the answer: the end is unknown, and the position stops before it.
    last = decode_both(before + bytes(odd))
    assert last.corrupt[0].last_offset is None and last.next_offset == 10


@pytest.mark.parametrize("magic", [0, 1])
def test_old_message_formats_are_reported_with_their_offset(magic: int) -> None:
    old = legacy_message(41, b"legacy", key=b"k", magic=magic)
    good = build_batch([Record(b"new")], base_offset=42)
    decoded = decode_both(old + good)
    assert values(decoded) == [b"new"]
    (report,) = decoded.corrupt
    assert report.reason == "unsupported magic v0/v1 at offset 41"
    assert (report.base_offset, report.last_offset, report.raw) == (41, 41, old)
    assert decoded.next_offset == 43


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"extra_attributes": 5}, "bad structure: unknown compression codec 5"),
        ({"record_count": -1}, "bad structure: negative record count -1"),
        ({"last_offset_delta": -2}, "bad structure: negative last offset delta"),
        ({"record_count": 3}, "bad structure: batch declares 3 records but holds 2"),
        ({"record_count": 1}, "bad structure: bytes left after the last of 1 records"),
        (
            {"last_offset_delta": 0},
            "bad structure: record 1 offset delta is not increasing or exceeds the last offset "
            "delta",
        ),
    ],
)
def test_bad_batch_structure_is_reported(overrides: dict[str, int], reason: str) -> None:
    bad = build_batch([Record(b"a"), Record(b"b")], base_offset=10, **overrides)
    good = build_batch([Record(b"c")], base_offset=12)
    decoded = decode_both(bad + good)
    assert values(decoded) == [b"c"]
    assert [(c.reason, c.raw) for c in decoded.corrupt] == [(reason, bad)]


def with_records(body: bytes, count: int) -> bytes:
    """A batch whose records section is ``body`` verbatim (CRC recomputed)."""
    template = build_batch([], base_offset=0, record_count=count, last_offset_delta=count)
    batch = bytearray(template + body)
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    return bytes(batch)


GOOD_RECORD = encode_record(Record(b"v", key=b"k"), offset_delta=0, timestamp_delta=0)


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"\x7f" + GOOD_RECORD[1:], "record 0 length runs past the end of the batch"),
        (b"\x01" + GOOD_RECORD[1:], "record 0 length runs past the end of the batch"),
        (b"\xff\xff\xff\xff\xff\x01", "record 0 has a varint longer than Kafka allows"),
        (
            b"\x16\x00" + b"\xff" * 10,
            "record 0 has a varint longer than Kafka allows",
        ),
        (b"\x0a\x00\x00\x00\x02k", "record 0 has a field past its length"),
        (b"\x10\x00\x00\x00\x01\x01\x00\x00\x00", "record 0 fields end before its declared length"),
        (b"\x0c\x00\x00\x00\x01\x01\x01", "record 0 has a negative header count"),
        (b"\x10\x00\x00\x00\x01\x01\x02\x01\x00", "record 0 has a negative header key length"),
        (GOOD_RECORD + b"\x00", "bytes left after the last of 1 records"),
    ],
)
def test_malformed_records_are_reported(body: bytes, reason: str) -> None:
    bad = with_records(body, 1)
    decoded = decode_both(bad + build_batch([Record(b"after")], base_offset=5))
    assert values(decoded) == [b"after"]
    assert [c.reason for c in decoded.corrupt] == [f"bad structure: {reason}"]
    assert decoded.corrupt[0].raw == bad


def test_a_bad_record_rolls_back_the_whole_batch() -> None:
    good_records = b"".join(
        encode_record(Record(b"v%d" % i, headers=[("h", b"x")]), offset_delta=i, timestamp_delta=0)
        for i in range(3)
    )
    bad = with_records(good_records + b"\x03", 4)
    decoded = decode_both(build_batch([Record(b"first")]) + bad)
    assert values(decoded) == [b"first"]
    assert column(decoded, "headers") == [[]]


def test_negative_key_and_value_lengths_mean_null() -> None:
    # Java reads any negative length as null; -5 is zigzag 9.
    body = b"\x0c\x00\x00\x00\x09\x09\x00"
    decoded = decode_both(with_records(body, 1))
    assert decoded.corrupt == ()
    assert (column(decoded, "key"), values(decoded)) == ([None], [None])


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_undecompressable_batch_is_reported(codec: str) -> None:
    batch = bytearray(build_batch([Record(b"payload" * 20)], compression=codec))
    batch[61:] = b"\x00not compressed at all" + bytes(len(batch) - 61 - 22)
    struct.pack_into(">I", batch, 17, crc32c(bytes(batch[21:])))
    decoded = decode_both(bytes(batch))
    assert [c.kind for c in decoded.corrupt] == ["decompression"]
    assert decoded.corrupt[0].reason.startswith("decompression failed")


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_decompression_is_capped(codec: str) -> None:
    bomb = build_batch([Record(bytes(2_000_000))], compression=codec)
    assert len(bomb) < 200_000
    decoded = decode_both(bomb, max_batch_bytes=1_000_000)
    assert [c.kind for c in decoded.corrupt] == ["decompression"]
    assert "1000000" in decoded.corrupt[0].reason
    assert decode_both(bomb, max_batch_bytes=3_000_000).batch.num_rows == 1


# -- compression module ------------------------------------------------------------------


@pytest.mark.parametrize("codec", [Codec.GZIP, Codec.SNAPPY, Codec.LZ4, Codec.ZSTD])
def test_compression_round_trip(codec: Codec) -> None:
    data = os.urandom(5000) + b"z" * 100_000
    assert bytes(decompress(codec, compress(codec, data), max_size=len(data))) == data
    with pytest.raises(DecodeError):
        decompress(codec, compress(codec, data), max_size=len(data) - 1)
    with pytest.raises(DecodeError):
        decompress(codec, compress(codec, data)[:-9], max_size=len(data))


def test_raw_snappy_declaring_a_huge_size_is_refused_before_allocating() -> None:
    huge = b"\xff\xff\xff\xff\x0f" + b"\x00" * 10  # preamble: 4 GiB
    with pytest.raises(DecodeError, match="declares more"):
        decompress(Codec.SNAPPY, huge, max_size=64 << 20)


def test_gzip_output_is_real_gzip() -> None:
    import gzip

    assert gzip.decompress(compress("gzip", b"hello" * 10)) == b"hello" * 10


def test_kernel_buffer_cache_can_be_disabled() -> None:
    records = build_batch(mixed_records(50), base_offset=0)
    expected = decode_records(records, topic="t", partition=0).batch
    previous = _records.set_buffer_cache(0)
    try:
        again = decode_records(records, topic="t", partition=0).batch
    finally:
        _records.set_buffer_cache(previous)
    assert again.equals(expected)


def test_decoding_a_batch_does_not_import_pandas() -> None:
    # pyarrow imports pandas (~0.25 s) for pa.array() of a Python list; every worker
    # process used to pay that on its first batch.
    code = (
        "import sys\n"
        "from ingest.protocol.recordbatch.record_builder import Record, build_batch\n"
        "from ingest.protocol.recordbatch.records import decode_records\n"
        "import ingest.worker.process\n"
        "data = build_batch([Record(b'v', key=b'k', headers=(('h', b'x'),))], base_offset=5)\n"
        "decoded = decode_records(data, topic='t', partition=0)\n"
        "assert decoded.batch.num_rows == 1, decoded\n"
        "assert 'pandas' not in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_leader_epochs_are_reported_where_they_change() -> None:
    def batch(base: int, epoch: int, **kwargs: Any) -> bytes:
        records = [Record(value=b"v%d" % i) for i in range(3)]
        return build_batch(records, base_offset=base, partition_leader_epoch=epoch, **kwargs)

    data = (
        batch(0, 4)
        + batch(3, 4, compression="lz4")
        + batch(6, 7)
        + batch(9, 7, crc=1)  # corrupt: not a batch whose epoch counts
        + batch(12, 9)
    )
    decoded = decode_both(data)
    assert decoded.epochs == ((0, 4), (6, 7), (12, 9))
    assert decode_both(b"").epochs == ()
    assert decode_both(batch(0, -1)).epochs == ((0, -1),)
