"""[[route]]s on Apache Kafka: topics to tables by regular expression, each route with its
own value format, mode and table (created on demand); a topic no route matches is dead
letters naming it; every offset is accounted for once and the group's offsets end at the
end of each partition."""

from __future__ import annotations

import json
import re
from pathlib import Path

from deltalake import DeltaTable

from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from tests.runtime.support import broker_ends, config, group_offsets, write_config


def test_routes_send_each_topic_to_its_table_with_its_own_format_and_mode(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    prefix = unique_name("rt")
    orders, clicks, other = (
        create_topic(broker.bootstrap, f"{prefix}.{name}", partitions=n)
        for name, n in (("orders", 2), ("clicks", 1), ("other", 1))
    )
    # Orders: JSON, upserted on id (ids 0-19 written twice: the later amount wins).
    produce(
        broker.bootstrap,
        orders,
        [
            ProducedRecord(
                json.dumps({"id": n % 20, "amount": float(n)}).encode(),
                key=b"%d" % (n % 20),
                partition=(n % 20) % 2,
            )
            for n in range(40)
        ],
    )
    produce(broker.bootstrap, clicks, [ProducedRecord(b"click %d" % n) for n in range(25)])
    produce(broker.bootstrap, other, [ProducedRecord(b"stray %d" % n) for n in range(5)])
    lake = tmp_path / "lake"
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic="unused",
        group=unique_name("g"),
        table=lake / "default",
        sections={
            "source": {"topics": [], "topic_pattern": re.escape(prefix) + r"\..+"},
        },
    )
    clicks_pattern = json.dumps(re.escape(prefix) + r"\.c.*")
    with path.open("a") as toml:  # two [[route]] tables
        toml.write(
            f"""
[[route]]
topics = {json.dumps(re.escape(orders))}
uri = {json.dumps(str(lake / "orders"))}
mode = "upsert"
merge_keys = ["id"]
value = {{ format = "json", schema = "id BIGINT, amount DOUBLE" }}

[[route]]
topics = {clicks_pattern}
uri = {json.dumps(str(lake / "{topic}"))}
value = {{ format = "string" }}
"""
        )
    cfg = config(path)
    assert len(cfg.route) == 2
    outcome = group_run(cfg, until_end=True).run()
    assert outcome.exit_code == 0, outcome.message

    upserted = DeltaTable(str(lake / "orders")).to_pyarrow_table().sort_by("id")
    assert upserted.column("id").to_pylist() == list(range(20))
    assert upserted.column("amount").to_pylist() == [float(n + 20) for n in range(20)]
    texts = DeltaTable(str(lake / clicks)).to_pyarrow_table().sort_by("offset")
    assert texts.column("value").to_pylist() == [f"click {n}" for n in range(25)]
    assert texts.schema.field("value").type.equals("string")
    dead = DeltaTable(str(lake / "default_dead_letters")).to_pyarrow_table().sort_by("offset")
    assert dead.column("topic").to_pylist() == [other] * 5
    assert set(dead.column("error_message").to_pylist()) == {
        f"no [[route]] matches topic {other!r}"
    }
    assert not (lake / other).exists() and not (lake / "orders_dead_letters").exists()
    partitions = [
        Partition(orders, 0),
        Partition(orders, 1),
        Partition(clicks, 0),
        Partition(other, 0),
    ]
    assert group_offsets(cfg, partitions) == broker_ends(cfg, partitions)
