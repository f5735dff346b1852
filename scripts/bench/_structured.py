"""The Structured Streaming peer: Spark's own Kafka source into Delta Spark's sink.

As a data engineer would write it: ``spark.readStream.format("kafka")`` (the
``spark-sql-kafka-0-10`` jar for the installed Spark, from Maven Central), the value decoded
with ``from_json`` and the same schema ingest is given, the Kafka columns kept, written by
delta-spark's streaming sink with ``Trigger.AvailableNow`` (read what is there, then stop),
in the same ``local[2]`` Spark with Delta's jars on the class path as ingest's sessions.

It commits no offsets to Kafka (Spark's documentation says so): its progress lives in the
checkpoint directory, so ``kafka-consumer-groups`` shows no group and no lag for it.

The upsert variant (``upsert=True``) is the documented pattern for upserts from a stream:
``foreachBatch`` deduplicates each micro-batch to the latest offset per key and runs a
Delta MERGE; Delta Spark's idempotent writes (``txnAppId``/``txnVersion`` = the query id and
the batch id) make a retried micro-batch a no-op.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def kafka_source_coordinates() -> list[str]:
    import pyspark

    return [f"org.apache.spark:spark-sql-kafka-0-10_2.13:{pyspark.__version__}"]


def avro_coordinates() -> list[str]:
    import pyspark

    return [f"org.apache.spark:spark-avro_2.13:{pyspark.__version__}"]


def session(app: str, extra: list[str] | None = None) -> Any:
    """A local[2] session with Delta and Spark's Kafka source (and ``extra`` coordinates),
    jars from the shared cache."""
    import os
    import sys

    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from ingest.spark_env import DELTA_SETTINGS, beside_spark, delta_coordinates

    jars = beside_spark(delta_coordinates() + kafka_source_coordinates() + (extra or []))
    classpath = ":".join(str(jar) for jar in jars)
    builder = (
        SparkSession.builder.master("local[2]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", "8")
        .config("spark.driver.extraClassPath", classpath)
        .config("spark.executor.extraClassPath", classpath)
    )
    for key, value in DELTA_SETTINGS.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


def _decoded(
    spark: Any, bootstrap: str, topic: str, value_ddl: str, avro_schema: str | None = None
) -> Any:
    """The topic's records, the value's fields as columns: ``from_json`` with ``value_ddl``,
    or, given ``avro_schema`` (the writer's schema JSON), ``from_avro`` after the 5-byte
    Confluent header."""
    from pyspark.sql import functions as f

    raw = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("failOnDataLoss", "true")
        .load()
    )
    if avro_schema is None:
        value = f.from_json(f.col("value").cast("string"), value_ddl)
    else:
        from pyspark.sql.avro.functions import from_avro

        value = from_avro(f.expr("substring(value, 6, length(value) - 5)"), avro_schema)
    return raw.select("topic", "partition", "offset", "timestamp", "key", value.alias("v")).select(
        "topic", "partition", "offset", "timestamp", "key", "v.*"
    )


def append(
    bootstrap: str,
    topic: str,
    table: Path,
    checkpoint: Path,
    value_ddl: str,
    avro_schema: str | None = None,
) -> dict[str, float]:
    """Every record of ``topic`` into the Delta table ``table``; the seconds of each phase.
    ``avro_schema``: the values are Confluent-framed Avro of that writer's schema."""
    began = time.perf_counter()
    extra = None if avro_schema is None else avro_coordinates()
    spark = session("structured-streaming-append", extra)
    started = time.perf_counter() - began
    query = (
        _decoded(spark, bootstrap, topic, value_ddl, avro_schema)
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start(str(table))
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    ran = time.perf_counter() - began - started
    spark.stop()
    return {"session": started, "query": ran}


def upsert(
    bootstrap: str, topic: str, table: Path, checkpoint: Path, value_ddl: str, key: str
) -> dict[str, float]:
    """The upsert workload: each micro-batch merged into ``table`` on ``key``, the latest
    offset winning, as ingest's upsert mode does."""
    from delta.tables import DeltaTable
    from pyspark.sql import Window
    from pyspark.sql import functions as f

    began = time.perf_counter()
    spark = session("structured-streaming-upsert")
    started = time.perf_counter() - began

    def merge(batch: Any, batch_id: int) -> None:
        latest = Window.partitionBy(key).orderBy(f.col("partition").desc(), f.col("offset").desc())
        rows = batch.withColumn("_n", f.row_number().over(latest)).where("_n = 1").drop("_n")
        if not DeltaTable.isDeltaTable(spark, str(table)):
            rows.limit(0).write.format("delta").save(str(table))
        # A retried micro-batch is skipped by Delta Spark's idempotent write (one txn).
        spark.conf.set("spark.databricks.delta.write.txnAppId", query_id[0])
        spark.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
        (
            DeltaTable.forPath(spark, str(table))
            .alias("t")
            .merge(rows.alias("s"), f"t.{key} = s.{key}")
            .whenMatchedUpdateAll(condition="s.partition <> t.partition OR s.offset > t.offset")
            .whenNotMatchedInsertAll()
            .execute()
        )

    query_id = [f"ss-upsert-{table.name}"]
    query = (
        _decoded(spark, bootstrap, topic, value_ddl)
        .writeStream.foreachBatch(merge)
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    if query.exception() is not None:
        raise RuntimeError(f"the streaming query failed: {query.exception()}")
    ran = time.perf_counter() - began - started
    spark.stop()
    return {"session": started, "query": ran}


def continuous(
    bootstrap: str, topic: str, table: Path, checkpoint: Path, value_ddl: str, trigger: float
) -> None:
    """Runs the append query with a ``trigger``-second processing-time trigger until
    SIGTERM, then stops it and the session (latency.py's continuous peer)."""
    import signal
    import threading

    spark = session("structured-streaming-continuous")
    query = (
        _decoded(spark, bootstrap, topic, value_ddl)
        .writeStream.format("delta")
        .option("checkpointLocation", str(checkpoint))
        .trigger(processingTime=f"{trigger:g} seconds")
        .start(str(table))
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    while not stop.wait(0.5):
        if not query.isActive:
            raise RuntimeError(f"the streaming query ended: {query.exception()}")
    query.stop()
    spark.stop()
