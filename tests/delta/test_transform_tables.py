"""A SQL transform joins the batch with Delta tables: a ``customers`` dimension written by
Delta Spark, named by path (``delta.`uri```) and as a view (``table.transform_tables``).

Each batch reads the dimension's latest version: a name changed by Spark between two runs
shows in the rows of the second run only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from deltalake import DeltaTable

from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.runtime.support import config, write_config

pytestmark = pytest.mark.spark

CUSTOMERS = [(1, "Ada", "gold"), (2, "Grace", "silver"), (3, "Edsger", "gold")]


def events(start: int, count: int) -> list[ProducedRecord]:
    # customer 4 has no row in the dimension: the LEFT JOIN keeps the event, with nulls.
    return [
        ProducedRecord(
            json.dumps({"id": n, "customer_id": n % 4 + 1, "amount": n * 1.5}).encode(),
            partition=n % 2,
        )
        for n in range(start, start + count)
    ]


def enriched(uri: Path) -> dict[int, tuple[str | None, str | None]]:
    rows = DeltaTable(str(uri)).to_pyarrow_table(columns=["id", "name", "tier"]).to_pylist()
    return {row["id"]: (row["name"], row["tier"]) for row in rows}


def test_a_transform_enriches_events_with_a_delta_dimension_table(
    broker: KafkaCluster, spark: Any, tmp_path: Path
) -> None:
    customers, tiers = tmp_path / "customers", tmp_path / "tiers"
    spark.createDataFrame(CUSTOMERS, "id BIGINT, name STRING, tier STRING").select(
        "id", "name"
    ).write.format("delta").save(str(customers))
    spark.createDataFrame(CUSTOMERS, "id BIGINT, name STRING, tier STRING").select(
        "id", "tier"
    ).write.format("delta").save(str(tiers))
    topic, group = unique_name("t-enrich"), unique_name("g-enrich")
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(broker.bootstrap, topic, events(0, 200))
    table = tmp_path / "events"
    transform = (
        "SELECT b.*, c.name, t.tier FROM batch b "
        "LEFT JOIN customers c ON b.customer_id = c.id "
        f"LEFT JOIN delta.`{tiers}` t ON b.customer_id = t.id"
    )
    path = write_config(
        tmp_path / "enrich.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=table,
        sections={
            "table": {"transform": transform},
            "table.transform_tables": {"customers": str(customers)},
            "table.value": {
                "format": "json",
                "schema": "id BIGINT, customer_id BIGINT, amount DOUBLE",
            },
        },
    )
    outcome = group_run(config(path), until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message
    first = enriched(table)
    assert sorted(first) == list(range(200))
    names = {1: "Ada", 2: "Grace", 3: "Edsger", 4: None}
    tier = {1: "gold", 2: "silver", 3: "gold", 4: None}
    assert all(first[n] == (names[n % 4 + 1], tier[n % 4 + 1]) for n in range(200))

    # Spark renames a customer; the next run's batches see it, the landed rows keep theirs.
    spark.sql(f"UPDATE delta.`{customers}` SET name = 'Ada L.' WHERE id = 1")
    produce(broker.bootstrap, topic, events(200, 100))
    outcome = group_run(config(path), until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message
    second = enriched(table)
    assert sorted(second) == list(range(300))
    assert {second[n][0] for n in range(200) if n % 4 == 0} == {"Ada"}
    assert {second[n][0] for n in range(200, 300) if n % 4 == 0} == {"Ada L."}
