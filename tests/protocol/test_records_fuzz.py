"""Hypothesis: garbage and mutated batches never crash either decoder, and both agree.

Both decoders may only report corrupt ranges (or raise DecodeError); any other
exception, a crash of the C kernel, or a difference between the two fails.
Mutated batches are fed with CRC checks off and with CRCs recomputed after the
mutation, so that the record parser itself meets the damage.
"""

from __future__ import annotations

import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ingest.errors import DecodeError
from ingest.protocol.recordbatch.record_builder import Record, build_batch, control_batch
from ingest.protocol.recordbatch.records import DecodedRecords, crc32c
from tests.protocol.test_records import T0, actual_rows, decode_both, expected_rows

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def decode_safely(data: bytes, **kwargs: Any) -> DecodedRecords | None:
    try:
        return decode_both(data, **kwargs)
    except DecodeError:
        return None


def refresh_crcs(data: bytes) -> bytes:
    """Recomputes the CRC of every v2 batch whose framing is still readable."""
    out = bytearray(data)
    pos = 0
    while len(out) - pos >= 61:
        (length,) = struct.unpack_from(">i", out, pos + 8)
        if length < 49 or length + 12 > len(out) - pos:
            break
        if out[pos + 16] == 2:
            struct.pack_into(">I", out, pos + 17, crc32c(bytes(out[pos + 21 : pos + 12 + length])))
        pos += length + 12
    return bytes(out)


def sample_log() -> bytes:
    records = [
        Record(b"v" * (i % 9), key=None if i % 4 == 0 else b"k%d" % i,
               headers=[("h", b"x"), ("n", None)] if i % 3 == 0 else (), timestamp=T0 + i)
        for i in range(6)
    ]  # fmt: skip
    return b"".join(
        [
            build_batch(records, base_offset=0),
            build_batch(records, base_offset=6, compression="lz4", producer_id=5,
                        transactional=True),
            control_batch("abort", base_offset=12, producer_id=5),
            build_batch(records[:2], base_offset=13, log_append_time=T0 + 99),
            build_batch(records[2:], base_offset=15, compression="zstd"),
        ]
    )  # fmt: skip


SAMPLE = sample_log()

read_options = st.fixed_dictionaries(
    {
        "check_crc": st.booleans(),
        "fetch_offset": st.none() | st.integers(-2, 25),
        "read_committed": st.booleans(),
        "aborted_transactions": st.none()
        | st.lists(st.tuples(st.integers(-1, 8), st.integers(-1, 20)), max_size=3),
    }
)


@FUZZ
@given(data=st.binary(max_size=600), options=read_options)
def test_random_bytes(data: bytes, options: dict[str, Any]) -> None:
    decode_safely(data, **options)


@FUZZ
@given(
    head=st.binary(min_size=8, max_size=8),
    length=st.integers(-5, 400),
    rest=st.binary(max_size=400),
    options=read_options,
)
def test_random_bytes_behind_a_plausible_framing(
    head: bytes, length: int, rest: bytes, options: dict[str, Any]
) -> None:
    # A v2-looking header makes the scan go past the framing checks more often.
    data = refresh_crcs(head + struct.pack(">iib", length, -1, 2) + rest)
    decode_safely(data, **options)


@FUZZ
@given(
    edits=st.lists(
        st.tuples(st.integers(0, len(SAMPLE) - 1), st.integers(0, 255)), min_size=1, max_size=6
    ),
    cut=st.none() | st.integers(0, len(SAMPLE)),
    fix_crc=st.booleans(),
    options=read_options,
)
def test_mutated_batches(
    edits: list[tuple[int, int]], cut: int | None, fix_crc: bool, options: dict[str, Any]
) -> None:
    data = bytearray(SAMPLE)
    for position, value in edits:
        data[position] = value
    mutated = bytes(data[:cut] if cut is not None else data)
    if fix_crc:
        mutated = refresh_crcs(mutated)
    decode_safely(mutated, **options)


@FUZZ
@given(
    position=st.integers(61, len(SAMPLE) - 1),
    insert=st.binary(min_size=1, max_size=8),
    options=read_options,
)
def test_inserted_bytes_with_fixed_lengths(
    position: int, insert: bytes, options: dict[str, Any]
) -> None:
    # Grow the batch around ``position`` so the framing stays intact: the damage is inside.
    data = bytearray(SAMPLE)
    pos = 0
    while True:
        (length,) = struct.unpack_from(">i", data, pos + 8)
        if pos + 12 + length > position:
            break
        pos += length + 12
    data[position:position] = insert
    struct.pack_into(">i", data, pos + 8, length + len(insert))
    decode_safely(refresh_crcs(bytes(data)), **options)


header_keys = st.text(max_size=6) | st.binary(max_size=6)
records_strategy = st.lists(
    st.builds(
        Record,
        value=st.none() | st.binary(max_size=40),
        key=st.none() | st.binary(max_size=10),
        headers=st.lists(st.tuples(header_keys, st.none() | st.binary(max_size=8)), max_size=3),
        timestamp=st.integers(T0 - 10**6, T0 + 10**6),
    ),
    max_size=12,
)


@FUZZ
@given(
    records=records_strategy,
    codec=st.sampled_from(["none", "gzip", "snappy", "lz4", "zstd"]),
    base_offset=st.integers(0, 2**40),
)
def test_random_valid_batches_decode_to_their_records(
    records: list[Record], codec: str, base_offset: int
) -> None:
    decoded = decode_both(build_batch(records, base_offset=base_offset, compression=codec))
    assert decoded.corrupt == ()
    assert actual_rows(decoded) == expected_rows(records, base_offset)
