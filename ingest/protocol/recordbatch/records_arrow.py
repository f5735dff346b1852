"""The Arrow side of decoded records: ``RECORD_SCHEMA``, where the worker and the handoff
find offsets and timestamps in it (``OFFSET_COLUMN``, ``TIMESTAMP_COLUMN``,
``int64_values``), and the RecordBatch wrapped around the C kernel's buffers without a copy.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
import pyarrow as pa

__all__ = [
    "HEADER_STRUCT",
    "HEADER_TYPE",
    "OFFSET_COLUMN",
    "RECORD_SCHEMA",
    "TIMESTAMP_COLUMN",
    "TIMESTAMP_TYPE",
    "TOPIC_TYPE",
    "batch_from_kernel",
    "int64_values",
]

HEADER_STRUCT = pa.struct(
    [pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]
)
HEADER_TYPE = pa.list_(pa.field("item", HEADER_STRUCT, nullable=False))
TOPIC_TYPE = pa.dictionary(pa.int32(), pa.string())
TIMESTAMP_TYPE = pa.timestamp("ms", tz="UTC")

RECORD_SCHEMA = pa.schema(
    [
        pa.field("topic", TOPIC_TYPE, nullable=False),
        pa.field("partition", pa.int32(), nullable=False),
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
        pa.field("timestamp_type", pa.int8(), nullable=False),  # 0 CreateTime, 1 LogAppendTime
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADER_TYPE, nullable=False),
    ]
)
# Where the columns that the worker and the handoff read as numbers sit in RECORD_SCHEMA.
OFFSET_COLUMN = RECORD_SCHEMA.get_field_index("offset")
TIMESTAMP_COLUMN = RECORD_SCHEMA.get_field_index("timestamp")


def int64_values(array: pa.Array) -> np.ndarray:
    """The values of a non-null 64-bit column of ``RECORD_SCHEMA`` (``offset``, or
    ``timestamp`` in ms) as a numpy view of its buffer, without a copy."""
    return np.frombuffer(
        array.buffers()[1], dtype=np.int64, count=len(array), offset=array.offset * 8
    )


_TOPIC_DICTIONARIES: dict[str, pa.Array] = {}


def _topic_dictionary(topic: str) -> pa.Array:
    dictionary = _TOPIC_DICTIONARIES.get(topic)
    if dictionary is None:
        if len(_TOPIC_DICTIONARIES) >= 1024:
            _TOPIC_DICTIONARIES.clear()
        # From buffers: pa.array on a list imports pandas (~0.25 s in every worker).
        data = topic.encode("utf-8")
        offsets = struct.pack("<ii", 0, len(data))
        dictionary = pa.Array.from_buffers(
            pa.string(), 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
        )
        _TOPIC_DICTIONARIES[topic] = dictionary
    return dictionary


def batch_from_kernel(out: dict[str, Any], topic: str) -> pa.RecordBatch:
    """The RecordBatch (``RECORD_SCHEMA``) over the buffers ``_records.decode`` filled."""
    rows: int = out["rows"]
    headers: int = out["headers"]
    key_nulls: int = out["key_nulls"]
    value_nulls: int = out["value_nulls"]
    hvalue_nulls: int = out["hvalue_nulls"]
    buffer = pa.py_buffer

    header_keys = pa.Array.from_buffers(
        pa.string(), headers, [None, buffer(out["hkey_offsets"]), buffer(out["hkey_data"])]
    )
    if out["bad_utf8"]:
        header_keys = _replace_bad_utf8(header_keys)
    header_values = pa.Array.from_buffers(
        pa.binary(),
        headers,
        [
            buffer(out["hvalue_valid"]) if hvalue_nulls else None,
            buffer(out["hvalue_offsets"]),
            buffer(out["hvalue_data"]),
        ],
        null_count=hvalue_nulls,
    )
    header_structs = pa.Array.from_buffers(
        HEADER_STRUCT, headers, [None], children=[header_keys, header_values]
    )
    topic_index = pa.Array.from_buffers(pa.int32(), rows, [None, buffer(out["topic_index"])])
    columns = [
        pa.DictionaryArray.from_arrays(topic_index, _topic_dictionary(topic), safe=False),
        pa.Array.from_buffers(pa.int32(), rows, [None, buffer(out["partition"])]),
        pa.Array.from_buffers(pa.int64(), rows, [None, buffer(out["offset"])]),
        pa.Array.from_buffers(TIMESTAMP_TYPE, rows, [None, buffer(out["timestamp"])]),
        pa.Array.from_buffers(pa.int8(), rows, [None, buffer(out["timestamp_type"])]),
        pa.Array.from_buffers(
            pa.binary(),
            rows,
            [
                buffer(out["key_valid"]) if key_nulls else None,
                buffer(out["key_offsets"]),
                buffer(out["key_data"]),
            ],
            null_count=key_nulls,
        ),
        pa.Array.from_buffers(
            pa.binary(),
            rows,
            [
                buffer(out["value_valid"]) if value_nulls else None,
                buffer(out["value_offsets"]),
                buffer(out["value_data"]),
            ],
            null_count=value_nulls,
        ),
        pa.Array.from_buffers(
            HEADER_TYPE, rows, [None, buffer(out["header_offsets"])], children=[header_structs]
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=RECORD_SCHEMA)


def _replace_bad_utf8(keys: pa.Array) -> pa.Array:
    """Header keys with invalid UTF-8, decoded like Java does (U+FFFD replacement)."""
    raw = keys.view(pa.binary()).to_pylist()
    return pa.array([key.decode("utf-8", "replace") for key in raw], pa.string())
