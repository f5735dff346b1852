"""Column mapping: a batch's columns, nested fields too, written under the table's physical
names with their Parquet field ids; statistics and partition values keyed by physical names
(``ingest.sink.metadata.mapping``). Delta Spark reading such files: tests/delta/test_interop.py."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from ingest.sink.files import write_data_files
from ingest.sink.metadata.mapping import ColumnMapping, covering
from ingest.sink.storage import TableLocation


def _field(name: str, kind: object, column_id: int, physical: str) -> dict[str, object]:
    return {
        "name": name,
        "type": kind,
        "nullable": True,
        "metadata": {
            "delta.columnMapping.id": column_id,
            "delta.columnMapping.physicalName": physical,
        },
    }


# As Delta Spark writes a mapped schema: every field, nested ones too, has a name and an id.
SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            _field("id", "long", 1, "col-a1"),
            _field(
                "point",
                {"type": "struct", "fields": [_field("x", "long", 3, "col-x3")]},
                2,
                "col-p2",
            ),
            _field(
                "items",
                {
                    "type": "array",
                    "elementType": {
                        "type": "struct",
                        "fields": [_field("sku", "string", 5, "col-s5")],
                    },
                    "containsNull": True,
                },
                4,
                "col-i4",
            ),
            _field("day", "string", 6, "col-d6"),
        ],
    }
)

ROWS = pa.table(
    {
        "id": pa.array([1, 2, 3], pa.int64()),
        "point": pa.array([{"x": 7}, None, {"x": 9}]),
        "items": pa.array([[{"sku": "a"}], [], None]),
        "day": ["d1", "d1", "d2"],
        "extra": ["new", "new", "new"],  # not in the table: written as it is, no id
    }
)


def test_the_physical_table_carries_physical_names_and_field_ids_nested_too() -> None:
    mapping = ColumnMapping.of(SCHEMA, {"delta.columnMapping.mode": "name"})
    assert mapping is not None
    physical = mapping.physical(ROWS)
    assert physical.column_names == ["col-a1", "col-p2", "col-i4", "col-d6", "extra"]
    assert physical.schema.field("col-p2").type.field(0).name == "col-x3"
    assert physical.schema.field("col-i4").type.value_type.field(0).name == "col-s5"
    assert physical.column("col-p2").to_pylist() == [{"col-x3": 7}, None, {"col-x3": 9}]
    assert mapping.logical(physical).column_names == ROWS.column_names
    assert ColumnMapping.of(SCHEMA, {}) is None
    assert ColumnMapping.of(SCHEMA, {"delta.columnMapping.mode": "none"}) is None


def test_files_stats_and_partition_values_go_by_physical_names(tmp_path: Path) -> None:
    mapping = ColumnMapping.of(SCHEMA, {"delta.columnMapping.mode": "id"})
    written = write_data_files(
        ROWS, TableLocation.of(str(tmp_path)), name="part", partition_by=["day"], mapping=mapping
    )
    assert sorted(f.partition_values for f in written) == [
        (("col-d6", "d1"),),
        (("col-d6", "d2"),),
    ]
    first = next(f for f in written if f.partition_values == (("col-d6", "d1"),))
    assert json.loads(first.stats)["minValues"]["col-a1"] == 1
    assert json.loads(first.stats)["nullCount"]["col-a1"] == 0
    schema = pq.ParquetFile(tmp_path / first.path).schema
    ids = {schema.column(i).path: schema.column(i).name for i in range(len(schema))}
    assert "col-p2.col-x3" in ids and "col-i4.list.element.col-s5" in ids
    arrow = pq.read_schema(tmp_path / first.path)
    assert arrow.field("col-a1").metadata[b"PARQUET:field_id"] == b"1"
    assert arrow.field("col-p2").type.field(0).metadata[b"PARQUET:field_id"] == b"3"
    assert arrow.field("col-i4").type.value_type.field(0).metadata[b"PARQUET:field_id"] == b"5"
    assert arrow.field("extra").metadata is None


def test_a_batch_is_stale_when_a_column_it_writes_is_mapped_otherwise_now() -> None:
    before = ColumnMapping.of(SCHEMA, {"delta.columnMapping.mode": "name"})
    schema = json.loads(SCHEMA)
    schema["fields"].append(_field("extra", "string", 7, "col-e7"))
    after = ColumnMapping.of(json.dumps(schema), {"delta.columnMapping.mode": "name"})
    assert covering(before, ["id", "day"]) == covering(after, ["id", "day"])
    assert covering(before, ["id", "extra"]) != covering(after, ["id", "extra"])
    assert covering(None, ["id"]) != covering(before, ["id"])
    assert covering(None, ["id"]) == covering(None, ["id"])
