"""Routes by header or value field: which of a window's records a table takes.

``selected(records, select)`` is a boolean mask over ``spark_records`` output: the
records that pass ``select.take`` and none of ``select.skip`` (``RowSelect``, built by
``Router.tables_for``). A condition reads the value of a header (the last one of that
name, as Kafka's ``Headers.lastHeader``; UTF-8) or of a top-level field of the value
read as JSON (Arrow's JSON reader for a window whose every value has a string there,
else orjson a value at a time; a string as it is, a number or boolean as its JSON text), and
matches it whole with Python's ``re``, once per distinct value. A record without the
header or field, with a null or an object there, or whose value is not JSON, fails
the condition: it goes on to the next route, or is a dead letter when none takes it.
"""

from __future__ import annotations

import re

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from ingest.formats.text_values import json_rows
from ingest.sink.table_config import Condition, RowSelect

__all__ = ["route_values", "selected"]


def selected(records: pa.Table, select: RowSelect) -> pa.Array:
    """The mask of the records ``select`` takes."""
    count = records.num_rows
    mask = np.ones(count, dtype=bool) if select.take is None else _passes(records, select.take)
    for condition in select.skip:
        mask &= ~_passes(records, condition)
    return pa.array(mask, type=pa.bool_())


def route_values(records: pa.Table, condition: Condition) -> pa.Array:
    """Each record's header or field value as a condition reads it (binary; null where
    it has none)."""
    if condition.header is not None:
        return _last_header(records.column("headers").combine_chunks(), condition.header)
    assert condition.field is not None
    values = records.column("value").combine_chunks()
    if values.null_count == 0:
        # Arrow's JSON reader when every value is an object whose field is a string
        # (or absent or null); a value it refuses sends the window a record at a time.
        try:
            rows = json_rows(values, pa.schema([pa.field(condition.field, pa.string())]))
        except ValueError:
            pass
        else:
            return rows.column(0).combine_chunks().cast(pa.binary())
    return pa.array([_field_text(v, condition.field) for v in values.to_pylist()], type=pa.binary())


def _passes(records: pa.Table, condition: Condition) -> np.ndarray:
    values = route_values(records, condition)
    if len(values) == 0:
        return np.zeros(0, dtype=bool)
    encoded = values.dictionary_encode()
    pattern = re.compile(condition.matches)
    verdicts = []
    for raw in encoded.dictionary.to_pylist():
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            verdicts.append(False)
            continue
        verdicts.append(pattern.fullmatch(text) is not None)
    indices = encoded.indices.fill_null(-1).to_numpy(zero_copy_only=False)
    table = np.array([*verdicts, False], dtype=bool)  # index -1: no value
    passed: np.ndarray = table[indices]
    return passed


def _last_header(headers: pa.Array, name: str) -> pa.Array:
    """Per record, the value of its last header ``name`` (null: none)."""
    count = len(headers)
    flat = pc.list_flatten(headers)
    parents = pc.list_parent_indices(headers).to_numpy(zero_copy_only=False)
    hits = pc.fill_null(pc.equal(flat.field("key"), name), False).to_numpy(zero_copy_only=False)
    chosen = np.full(count, -1, dtype=np.int64)
    positions = np.flatnonzero(hits)
    # A later header of the name wins: the first of each record's hits, read backwards.
    rows, first = np.unique(parents[positions][::-1], return_index=True)
    chosen[rows] = positions[::-1][first]
    taken = pa.array(chosen, mask=chosen < 0)
    return pc.take(flat.field("value"), taken)


def _field_text(value: bytes | None, name: str) -> bytes | None:
    if value is None:
        return None
    try:
        parsed = orjson.loads(value)
    except orjson.JSONDecodeError:
        return None
    if not isinstance(parsed, dict):
        return None
    found = parsed.get(name)
    if isinstance(found, str):
        return found.encode("utf-8")
    if isinstance(found, bool | int | float):
        return orjson.dumps(found)
    return None
