"""The S3 store and the Spark session are real: Delta tables on SeaweedFS, read by Spark."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.testing import S3Server


def _table(start: int, count: int) -> pa.Table:
    ids = pa.array(range(start, start + count), pa.int64())
    return pa.table(
        {"id": ids, "name": pa.array([f"row-{i}" for i in range(start, start + count)])}
    )


@pytest.mark.slow
def test_delta_table_written_to_and_read_from_s3(s3: S3Server) -> None:
    uri = f"s3://{s3.bucket}/harness/delta-roundtrip"
    options = s3.storage_options()

    write_deltalake(uri, _table(0, 1000), storage_options=options)
    write_deltalake(uri, _table(1000, 500), storage_options=options, mode="append")

    table = DeltaTable(uri, storage_options=options)
    assert table.version() == 1
    assert table.to_pyarrow_table().sort_by("id") == _table(0, 1500)
    # The objects really are in the S3 server, not in a local fallback.
    objects = s3.filesystem().get_file_info(
        __import__("pyarrow.fs", fromlist=["FileSelector"]).FileSelector(
            f"{s3.bucket}/harness/delta-roundtrip/_delta_log"
        )
    )
    assert sorted(info.base_name for info in objects)[:2] == [
        "00000000000000000000.json",
        "00000000000000000001.json",
    ]


@pytest.mark.spark
def test_spark_reads_a_delta_rs_table_through_file_uris(spark, tmp_path) -> None:  # type: ignore[no-untyped-def]
    uri = str(tmp_path / "table")
    write_deltalake(uri, _table(0, 300))
    write_deltalake(uri, _table(300, 200), mode="append")

    files = DeltaTable(uri).file_uris()
    frame = spark.read.parquet(*files)

    assert frame.count() == 500
    assert sorted(row.id for row in frame.select("id").collect()) == list(range(500))
    assert spark.sparkContext.master == "local[2]"
    assert spark.conf.get("spark.ui.enabled") == "false"
