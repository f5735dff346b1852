"""Every Spark session carries Delta Lake and S3A (``ingest.spark_env``): SQL on Delta
tables by path and by name, and ``s3a://`` / ``s3://`` on SeaweedFS, shared with delta-rs.

The jars come from Maven Central through ``ingest.jars`` into the shared cache; these tests
run on whatever the harness's session resolved, so a session without them fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ingest.spark_env import s3a_settings, session_jars
from ingest.testing import S3Server, unique_name

pytestmark = pytest.mark.spark


def test_the_session_jars_leave_out_what_spark_bundles() -> None:
    import pyspark

    bundled = {jar.name for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    names = [jar.name for jar in session_jars()]
    assert any(name.startswith("delta-spark_") for name in names), names
    assert any(name.startswith("hadoop-aws-") for name in names), names
    # Delta's POM names Hadoop 3.4's client and Parquet 1.16; Spark's own must win.
    assert not any(
        name.startswith(("hadoop-client-", "parquet-", "scala-library")) for name in names
    )
    assert not set(names) & bundled


def test_delta_sql_by_path_and_by_name_reads_a_delta_rs_table(spark: Any, tmp_path: Path) -> None:
    uri = str(tmp_path / "people")
    write_deltalake(uri, pa.table({"id": [1, 2, 3], "name": ["a", "b", "c"]}))
    by_path = spark.sql(f"SELECT id, name FROM delta.`{uri}` ORDER BY id").collect()
    assert [(r.id, r.name) for r in by_path] == [(1, "a"), (2, "b"), (3, "c")]
    name = unique_name("people").replace("-", "_")
    spark.sql(f"CREATE TABLE {name} USING delta LOCATION '{uri}'")
    try:
        spark.sql(f"UPDATE {name} SET name = 'B' WHERE id = 2")  # Delta's DML, through SQL
        assert DeltaTable(uri).to_pyarrow_table().sort_by("id").column("name").to_pylist() == [
            "a",
            "B",
            "c",
        ]
    finally:
        spark.sql(f"DROP TABLE {name}")  # external: the files stay


def test_spark_reads_and_writes_s3_on_seaweedfs_beside_delta_rs(spark: Any, s3: S3Server) -> None:
    options = s3.storage_options()
    for key, value in s3a_settings(options).items():
        spark.conf.set(key.removeprefix("spark.hadoop."), value)
    written_by_rs = f"s3://{s3.bucket}/{unique_name('rs')}"
    write_deltalake(written_by_rs, pa.table({"n": list(range(100))}), storage_options=options)
    # delta-rs's s3:// URI, read by Spark as is, and as s3a://.
    for uri in (written_by_rs, written_by_rs.replace("s3://", "s3a://")):
        assert spark.sql(f"SELECT sum(n) AS s FROM delta.`{uri}`").first().s == 4950
    written_by_spark = f"s3a://{s3.bucket}/{unique_name('spark')}"
    spark.range(1000).write.format("delta").save(written_by_spark)
    spark.range(1000, 1500).write.format("delta").mode("append").save(written_by_spark)
    table = DeltaTable(written_by_spark.replace("s3a://", "s3://"), storage_options=options)
    assert table.version() == 1
    ids = table.to_pyarrow_table().column("id").to_pylist()
    assert sorted(ids) == list(range(1500))
