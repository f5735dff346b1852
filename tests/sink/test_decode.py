"""Value decoding without Spark: the block JSON parse agrees with record-by-record parsing."""

from __future__ import annotations

import datetime as dt

import numpy as np
import orjson
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.errors import ConfigError
from ingest.formats import decode as decode_module
from ingest.formats.decode import DecodeSpec, decode, drop_through, spark_records
from ingest.handoff import HandoffConfig, HandoffStore, SegmentWriter
from ingest.protocol.recordbatch.records import RECORD_SCHEMA
from ingest.sink.deadletter import DEAD_LETTER_SCHEMA, STAGE_DECODE

JSON_SCHEMA = pa.schema(
    [("id", pa.int64()), ("name", pa.string()), ("tags", pa.list_(pa.string()))]
)


def segment_records(values: list[bytes | None], *, start: int = 0) -> pa.Table:
    """Records as a worker hands them over: written to and read from a real segment."""
    count = len(values)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, np.int32)), pa.array(["t"])),
            pa.array(np.full(count, 2, np.int32)),
            pa.array(np.arange(start, start + count, dtype=np.int64)),
            pa.array(1_700_000_000_000 + np.arange(count), pa.timestamp("ms", tz="UTC")),
            pa.array(np.zeros(count, np.int8)),
            pa.array([b"k%d" % i for i in range(count)], pa.binary()),
            pa.array(values, pa.binary()),
            pa.array([[("h", b"x")]] * count, RECORD_SCHEMA.field("headers").type),
        ],
        schema=RECORD_SCHEMA,
    )
    with HandoffStore(HandoffConfig()) as store:
        writer = SegmentWriter(store.location, "t", 2, start_offset=start)
        writer.append(batch)
        sealed = writer.seal(start + count)
        assert sealed is not None
        return spark_records(store.read(sealed.uri, memory_map=False))


def one_by_one(value: bytes | None) -> dict | str:  # type: ignore[type-arg]
    """The reference: each value alone, with orjson, to the schema's fields."""
    if value is None:
        return {"id": None, "name": None, "tags": None}
    try:
        document = orjson.loads(value)
    except orjson.JSONDecodeError:
        return "error"
    if not isinstance(document, dict):
        return "error"
    row = {}
    for field, kind in (("id", int), ("name", str), ("tags", list)):
        item = document.get(field)
        if item is not None and (not isinstance(item, kind) or isinstance(item, bool)):
            return "error"
        if kind is list and item is not None and not all(isinstance(t, str) for t in item):
            return "error"
        row[field] = item
    return row


def check_against_reference(values: list[bytes | None]) -> None:
    records = segment_records(values)
    decoded = decode(records, DecodeSpec("json", JSON_SCHEMA))
    expected = [one_by_one(v) for v in values]
    good = [i for i, e in enumerate(expected) if e != "error"]
    bad = [i for i, e in enumerate(expected) if e == "error"]
    assert decoded.rows.column("offset").to_pylist() == good
    assert decoded.rows.select(["id", "name", "tags"]).to_pylist() == [expected[i] for i in good]
    assert decoded.dead.column("offset").to_pylist() == bad
    assert decoded.dead.column("value").to_pylist() == [values[i] for i in bad]
    assert set(decoded.dead.column("error_stage").to_pylist()) <= {STAGE_DECODE}
    assert decoded.dead.schema == DEAD_LETTER_SCHEMA


def test_json_block_parse_matches_per_record_parse_on_tricky_values() -> None:
    tricky: list[bytes | None] = [
        b'{"id": 1, "name": "a"}',
        b"",  # empty: would be skipped as a blank line
        b"   ",
        None,  # a tombstone: a row of nulls
        b"null",
        b"[1, 2]",
        b"5",
        b'{"id": "x"}',
        b'{"id": 2,\n "name": "multi\\nline"}',  # newlines inside the value
        b' {"id": 3}',
        b'{"id": 4} {"id": 5}',  # two documents in one value
        b'{"id": 6',
        b"\xff\xfe",
        b'{"id": 7, "tags": ["x", "y"], "other": {"deep": 1}}',
        b'{"id": 8, "tags": [1]}',
        b'{"id": 9}\n',
    ]
    check_against_reference(tricky * 5)


def test_json_decoding_in_windows_keeps_order_and_every_dead_letter() -> None:
    count = 2 * decode_module._WINDOW + 1000
    values: list[bytes | None] = [b'{"id": %d, "name": "n"}' % i for i in range(count)]
    # Bad values first, last, on both sides of each window's edge, and a tombstone.
    for i in (0, decode_module._WINDOW - 1, decode_module._WINDOW, count - 1):
        values[i] = b'{"id": "bad"}'
    values[decode_module._WINDOW + 7] = None
    check_against_reference(values)


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.none(),
            st.builds(
                lambda i, n, t: orjson.dumps({"id": i, "name": n, "tags": t}),
                st.integers(-(2**62), 2**62),
                st.text(max_size=8),
                st.one_of(st.none(), st.lists(st.text(max_size=3), max_size=3)),
            ),
            st.binary(max_size=12),
            st.sampled_from([b"{", b"}", b"{}", b"{}{}", b'{"id":1.5}', b'{"name":null}']),
        ),
        min_size=1,
        max_size=60,
    )
)
def test_json_decoding_agrees_with_orjson_record_by_record(values: list[bytes | None]) -> None:
    check_against_reference(values)


def test_string_values_must_be_utf8_and_the_rest_keep_their_columns() -> None:
    values = [b"plain", b"caf\xc3\xa9", b"\xff bad", None, b""]
    decoded = decode(segment_records(values, start=10), DecodeSpec("string", date_column="day"))
    rows = decoded.rows
    assert rows.column("value").to_pylist() == ["plain", "café", None, ""]
    assert rows.column("offset").to_pylist() == [10, 11, 13, 14]
    assert rows.column("day").to_pylist() == [dt.date(2023, 11, 14)] * 4
    assert rows.column("headers").to_pylist()[0] == [{"key": "h", "value": b"x"}]
    assert decoded.dead.column("offset").to_pylist() == [12]
    assert "not UTF-8" in decoded.dead.column("error_message")[0].as_py()


def test_records_have_the_types_spark_takes_and_offsets_filter() -> None:
    records = segment_records([b"a", b"b", b"c"], start=5)
    assert records.schema.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert records.schema.field("topic").type == pa.string()
    assert records.column("timestamp")[0].as_py() == dt.datetime(
        2023, 11, 14, 22, 13, 20, tzinfo=dt.UTC
    )
    assert drop_through(records, 5).column("offset").to_pylist() == [6, 7]
    assert drop_through(records, None).num_rows == 3
    assert drop_through(records, 7).num_rows == 0


def test_json_fields_may_not_shadow_kafka_columns() -> None:
    with pytest.raises(ConfigError, match=r"\['offset'\]"):
        DecodeSpec("json", pa.schema([("offset", pa.int64())]))
