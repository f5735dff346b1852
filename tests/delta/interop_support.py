"""Shared pieces of the interop tests: one JSON topic, tables created by Delta Spark in the
shape ingest writes, short ``ingest run --until-end`` runs on the session's Spark, and the
rows each mode must leave.

Records: ``{"id": n % 40, "v": "v<n>"}`` for n in [0, COUNT), record n on partition
``n % 2``, so every id lives on one partition and its latest value is its last record's.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import Schema

from ingest.formats.decode import DecodeSpec
from ingest.sink.metadata.evolution import nullable_schema
from ingest.supervisor.engine.source import RunOutcome
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import ProducedRecord
from tests.runtime.support import config, write_config

COUNT = 120
IDS = 40
VALUE_SCHEMA = "id BIGINT, v STRING"
# Rows Delta Spark writes before ingest runs: partition -1 (no Kafka partition), ids that
# collide with the topic's (0-4: an upsert updates them) and ids of Spark's own (1000+).
SPARK_IDS = (0, 1, 2, 3, 4, 1000, 1001, 1002, 1003)


def topic_records() -> list[ProducedRecord]:
    return [
        ProducedRecord(json.dumps({"id": n % IDS, "v": f"v{n}"}).encode(), partition=n % 2)
        for n in range(COUNT)
    ]


def latest_values() -> dict[int, str]:
    """id -> v of its last record (each id's records share a partition)."""
    return {n % IDS: f"v{n}" for n in range(COUNT)}


def ingest_schema() -> pa.Schema:
    """The columns ingest writes for the topic (json values, no transform)."""
    spec = DecodeSpec(
        value_format="json", json_schema=pa.schema([("id", pa.int64()), ("v", pa.string())])
    )
    return nullable_schema(spec.output_schema())


def spark_schema() -> Any:
    """``ingest_schema`` as a Spark StructType (the same Delta types)."""
    from pyspark.sql.types import StructType

    return StructType.fromJson(json.loads(Schema.from_arrow(ingest_schema()).to_json()))


def create_spark_table(
    spark: Any,
    path: Path,
    *,
    properties: Mapping[str, str] | None = None,
    partitioned: bool = False,
    generated: bool = False,
    constraint: str | None = None,
    cluster_by: str | None = None,
    not_null: tuple[str, ...] = (),
    seed: bool = True,
) -> None:
    """A table created by Delta Spark with ingest's columns (plus ``id2`` GENERATED ALWAYS
    AS (id * 2) with ``generated``), ``properties``, a CHECK ``constraint``, clustered
    by ``cluster_by``, ``not_null`` columns NOT NULL, and with
    ``seed`` Spark's own rows (``SPARK_IDS``, one INSERT: one file)."""
    from delta.tables import DeltaTable as SparkDeltaTable
    from pyspark.sql.types import StructField, StructType

    schema = StructType(
        [StructField(f.name, f.dataType, f.name not in not_null) for f in spark_schema().fields]
    )
    builder = SparkDeltaTable.create(spark).location(str(path)).addColumns(schema)
    if generated:
        builder = builder.addColumn("id2", "BIGINT", generatedAlwaysAs="id * 2")
    for key, value in (properties or {}).items():
        builder = builder.property(key, value)
    if partitioned:
        builder = builder.partitionedBy("partition")
    if cluster_by is not None:
        builder = builder.clusterBy(cluster_by)
    builder.execute()
    if constraint is not None:
        spark.sql(f"ALTER TABLE delta.`{path}` ADD CONSTRAINT c CHECK ({constraint})")
    if seed:
        values = ", ".join(
            f"('spark', -1, {i}, TIMESTAMP '2026-01-01 00:00:00', 0, NULL, array(), {i}, "
            f"'spark{i}')"
            for i in SPARK_IDS
        )
        spark.sql(
            f"INSERT INTO delta.`{path}` (topic, `partition`, `offset`, timestamp, "
            f"timestamp_type, key, headers, id, v) VALUES {values}"
        )


def run(
    spark: Any,
    tmp_path: Path,
    *,
    bootstrap: str,
    topic: str,
    table: Path,
    group: str,
    mode: str = "append",
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> RunOutcome:
    """``ingest run --until-end`` on the session's Spark; maintenance off unless ``sections``
    turn it on (compaction is a use of its own, see ``ingest.sink.metadata.features``)."""
    table_section: dict[str, Any] = {"mode": mode}
    if mode == "upsert":
        table_section["merge_keys"] = ["id"]
    merged: dict[str, dict[str, Any]] = {
        "table": table_section,
        "table.value": {"format": "json", "schema": VALUE_SCHEMA},
        "maintenance": {"enabled": False},
    }
    for section, entries in (sections or {}).items():
        merged.setdefault(section, {}).update(entries)
    path = write_config(
        tmp_path / f"{group}.toml",
        bootstrap=bootstrap,
        topic=topic,
        group=group,
        table=table,
        sections=merged,
    )
    return group_run(config(path), until_end=True, spark=spark).run()


def spark_rows(spark: Any, path: Path, columns: str = "id, v", **options: Any) -> list[Any]:
    reader = spark.read.format("delta")
    for key, value in options.items():
        reader = reader.option(key, value)
    frame = reader.load(str(path))
    return sorted(tuple(row) for row in frame.selectExpr(*columns.split(", ")).collect())


def appended_rows(spark_ids: tuple[int, ...] = SPARK_IDS) -> list[tuple[Any, ...]]:
    """(id, v) of an append table: Spark's rows of ``spark_ids`` and every record."""
    rows = [(i, f"spark{i}") for i in spark_ids]
    rows += [(n % IDS, f"v{n}") for n in range(COUNT)]
    return sorted(rows)


def upserted_rows(spark_ids: tuple[int, ...] = SPARK_IDS) -> list[tuple[Any, ...]]:
    """(id, v) of an upsert table: one row per id, the topic's latest value winning."""
    values = {i: f"spark{i}" for i in spark_ids}
    values.update(latest_values())
    return sorted(values.items())


def data_files(path: Path) -> set[str]:
    """Every Parquet file under the table's directory, the log's aside."""
    return {
        str(p.relative_to(path)) for p in path.rglob("*.parquet") if "_delta_log" not in p.parts
    }
