"""String and JSON values, checked and parsed a window at a time (``decode.py``).

``utf8_errors``: which values are not UTF-8. ``json_fields``: a window's JSON objects
parsed at once with ``pyarrow.json`` over the values joined by newlines; values holding a
newline or not starting with ``{`` are first normalized one by one with orjson (which also
rejects what is not one JSON object); the line count is then checked, and a block that
fails is bisected down to single records, whose errors become dead letters.
``json_rows``: the same parse of a chunk all at once, raising on the first value that
fails, for a caller that bisects itself (``json_schema.py``, in ``framed.py``'s frame).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

__all__ = ["json_fields", "json_rows", "utf8_errors"]

_LEAF = 16
_OPEN_BRACE = ord("{")


# -- string --------------------------------------------------------------------------------


def utf8_errors(values: pa.Array) -> tuple[np.ndarray, list[tuple[int, str]]]:
    count = len(values)

    def check(lo: int, hi: int) -> bool:
        try:
            values.slice(lo, hi - lo).cast(pa.string())
            return True
        except pa.ArrowInvalid:
            return False

    errors: list[tuple[int, str]] = []

    def leaf(i: int) -> None:
        raw = values[i].as_py()
        if raw is None:
            return
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            errors.append((i, f"value is not UTF-8: {exc}"))

    _bisect(0, count, check, leaf)
    bad = {i for i, _ in errors}
    good = np.fromiter((i for i in range(count) if i not in bad), np.int64) if bad else None
    return (np.arange(count, dtype=np.int64) if good is None else good), sorted(errors)


def _bisect(
    lo: int, hi: int, check: Callable[[int, int], bool], leaf: Callable[[int], None]
) -> None:
    """Calls ``leaf`` for each index of every failing run of at most _LEAF items."""
    if hi <= lo or check(lo, hi):
        return
    if hi - lo <= _LEAF:
        for i in range(lo, hi):
            leaf(i)
        return
    middle = (lo + hi) // 2
    _bisect(lo, middle, check, leaf)
    _bisect(middle, hi, check, leaf)


# -- json ------------------------------------------------------------------------------------

# Arrays and scalars built from buffers: pyarrow converts a Python list, an ndarray or a
# Python bytes (pa.array, pa.scalar, a compute function's bytes argument) with pandas at
# hand, importing it: 0.25-0.7 s of a local-engine task process's first task
# (tests/sink/test_land.py runs a task and checks).


def _int32_array(values: list[int]) -> pa.Array:
    data = np.array(values, np.int32)
    return pa.Array.from_buffers(pa.int32(), len(data), [None, pa.py_buffer(data)])


def _binary_scalar(value: bytes) -> pa.Scalar:
    offsets = pa.py_buffer(np.array([0, len(value)], np.int32))
    return pa.Array.from_buffers(pa.binary(), 1, [None, offsets, pa.py_buffer(value)])[0]


def _parse_block(lines: pa.Array, schema: pa.Schema) -> pa.Table | str:
    """The rows of newline-free JSON objects, one per line, or the error."""
    count = len(lines)
    if count == 0:
        return pa.Table.from_batches([], schema=schema)  # empty_table() imports pandas
    joined = pc.binary_join(
        pa.ListArray.from_arrays(_int32_array([0, count]), lines), _binary_scalar(b"\n")
    )
    # One value: its bytes are the whole data buffer of the joined array.
    offsets = np.frombuffer(joined.buffers()[1], np.int32, 2)
    body = joined.buffers()[2].slice(int(offsets[0]), int(offsets[1] - offsets[0]))
    try:
        table = pajson.read_json(
            pa.BufferReader(body),
            read_options=pajson.ReadOptions(block_size=16 << 20),
            parse_options=pajson.ParseOptions(
                explicit_schema=schema, unexpected_field_behavior="ignore"
            ),
        )
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        return str(exc)
    if table.num_rows != count:
        return f"{count} values gave {table.num_rows} rows"
    return table


def _needs_normalizing(values: pa.Array) -> np.ndarray:
    """Indices of non-null values that may not be exactly one line holding one object."""
    count = len(values)
    if count == 0:
        return np.empty(0, np.int64)
    offsets = np.frombuffer(values.buffers()[1], np.int32, values.offset + count + 1)
    offsets = offsets[values.offset :]
    data_buffer = values.buffers()[2]
    valid = (
        np.ones(count, bool)
        if values.null_count == 0
        else values.is_valid().to_numpy(zero_copy_only=False)
    )
    lengths = np.diff(offsets)
    suspect = valid & (lengths == 0)
    if data_buffer is not None and len(data_buffer):
        data = np.frombuffer(data_buffer, np.uint8)
        starts = np.minimum(offsets[:-1], len(data) - 1)
        suspect |= valid & (lengths > 0) & (data[starts] != _OPEN_BRACE)
        first, end = int(offsets[0]), int(offsets[-1])
        raw = data_buffer.slice(first, end - first).to_pybytes()
        # Two memchr scans: a regex over the segment cost a third of the whole decode.
        if b"\n" in raw or b"\r" in raw:
            body = data[first:end]
            positions = np.flatnonzero((body == ord("\n")) | (body == ord("\r"))) + first
            owners = np.searchsorted(offsets, positions, side="right") - 1
            suspect[owners] |= valid[owners]
    return np.flatnonzero(suspect)


def _normalized(raw: bytes) -> bytes | str:
    """``raw`` as one line holding one JSON object, or why it is not one."""
    try:
        parsed = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return f"invalid JSON: {exc}"
    if not isinstance(parsed, dict):
        return f"not a JSON object: a {type(parsed).__name__}"
    return orjson.dumps(parsed)


def _patched(values: pa.Array, replaced: dict[int, bytes]) -> pa.Array:
    """``values`` with the values at ``replaced``'s indices replaced."""
    if not replaced:
        return values
    count = len(values)
    patch_index = np.fromiter(replaced, np.int64, len(replaced))
    index = np.arange(count, dtype=np.int64)
    index[patch_index] = count + np.arange(len(patch_index))
    patches = pa.array(list(replaced.values()), pa.binary())
    return pa.concat_arrays([values, patches]).take(pa.array(index))


def json_rows(values: pa.Array, schema: pa.Schema) -> pa.Table:
    """``values`` (JSON objects, none null) as one row each of ``schema``'s columns,
    parsed at once; ``ValueError`` saying why when any value is not a JSON object of
    those types (which one is the caller's to find, by bisecting)."""
    values = values.cast(pa.binary())
    replaced: dict[int, bytes] = {}
    for i in _needs_normalizing(values).tolist():
        raw = values[i].as_py()
        line = "a null value" if raw is None else _normalized(raw)
        if isinstance(line, str):
            raise ValueError(line)
        replaced[i] = line
    if values.null_count:
        raise ValueError("a null value")
    parsed = _parse_block(_patched(values, replaced), schema)
    if isinstance(parsed, str):
        raise ValueError(parsed)
    return parsed


def json_fields(
    values: pa.Array, schema: pa.Schema
) -> tuple[pa.Table, np.ndarray, list[tuple[int, str]]]:
    """(fields of the good values, their indices, (index, error) of the bad ones)."""
    count = len(values)
    values = values.cast(pa.binary())
    errors: dict[int, str] = {}
    replaced: dict[int, bytes] = {}
    for i in _needs_normalizing(values).tolist():
        line = _normalized(values[i].as_py())
        if isinstance(line, str):
            errors[i] = line
        else:
            replaced[i] = line
    if values.null_count:
        for i in np.flatnonzero(~values.is_valid().to_numpy(zero_copy_only=False)).tolist():
            replaced[i] = b"{}"  # a tombstone: every field null
    lines = _patched(values, replaced)
    candidates = (
        np.arange(count, dtype=np.int64)
        if not errors
        else np.setdiff1d(
            np.arange(count, dtype=np.int64), np.fromiter(errors, np.int64, len(errors))
        )
    )
    block = lines if not errors else lines.take(pa.array(candidates))
    pieces: list[tuple[int, int, pa.Table]] = []
    failed: set[int] = set()

    def check(lo: int, hi: int) -> bool:
        parsed = _parse_block(block.slice(lo, hi - lo), schema)
        if isinstance(parsed, str):
            return False
        pieces.append((lo, hi, parsed))
        return True

    def leaf(i: int) -> None:
        parsed = _parse_block(block.slice(i, 1), schema)
        if isinstance(parsed, str):
            errors[int(candidates[i])] = parsed
            failed.add(i)
        else:
            pieces.append((i, i + 1, parsed))

    _bisect(0, len(block), check, leaf)
    pieces.sort(key=lambda piece: piece[0])
    fields = pa.concat_tables([piece for _, _, piece in pieces]) if pieces else schema.empty_table()
    good = candidates if not failed else np.delete(candidates, sorted(failed))
    return fields, good, sorted(errors.items())
