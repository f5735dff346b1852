"""[[route]]s by header and by value field on Apache Kafka: one partition's records land
in several tables, each with its own format; a record no route takes is a dead letter
naming why; tables are created on demand with their route's properties and
partitioning. Every offset is in exactly one table (or dead letters), also after a
process killed between two tables' commits of one batch; the group's offsets end at
the end of each partition only once every table is durable; ``ingest status`` gives
each table's lag."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from deltalake import DeltaTable

from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce, unique_name
from ingest.testing.faults import fault_point_env
from tests.runtime.support import (
    Cli,
    broker_ends,
    config,
    group_offsets,
    status_json,
    write_config,
)

PER_PARTITION = 60


def _record(n: int, partition: int) -> ProducedRecord:
    """Every fourth record is an order (its header says so), every fourth a click (its
    value's field says so), every fourth a view with a numeric kind (3: routed by its
    JSON text), and the rest match no route: a header with no match, or a value that
    is not JSON."""
    kind = n % 4
    if kind == 0:
        value, headers = {"id": n, "kind": "order"}, [("type", b"other"), ("type", b"order")]
        return ProducedRecord(json.dumps(value).encode(), partition=partition, headers=headers)
    if kind == 1:
        return ProducedRecord(json.dumps({"id": n, "kind": "click"}).encode(), partition=partition)
    if kind == 2:
        return ProducedRecord(json.dumps({"id": n, "kind": 3}).encode(), partition=partition)
    if n % 8 == 3:
        return ProducedRecord(b"not json %d" % n, partition=partition, headers=[("type", b"x")])
    return ProducedRecord(json.dumps({"id": n, "kind": None}).encode(), partition=partition)


def _offsets(uri: str) -> list[tuple[int, int]]:
    table = DeltaTable(uri).to_pyarrow_table(columns=["partition", "offset"])
    return list(zip(table["partition"].to_pylist(), table["offset"].to_pylist(), strict=True))


def test_records_route_by_header_and_field_to_their_tables_exactly_once(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = create_topic(broker.bootstrap, unique_name("rr"), partitions=2)
    produce(
        broker.bootstrap,
        topic,
        [_record(n, p) for p in (0, 1) for n in range(PER_PARTITION)],
    )
    lake = tmp_path / "lake"
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g"),
        table=lake / "default",
    )
    with path.open("a") as toml:
        toml.write(
            f"""
[[route]]
topics = ".*"
header = "type"
matches = "order(ed)?"
uri = {json.dumps(str(lake / "orders"))}
value = {{ format = "json", schema = "id BIGINT, kind STRING" }}
properties = {{ "delta.appendOnly" = "true", "delta.logRetentionDuration" = "interval 60 days" }}

[[route]]
topics = ".*"
field = "kind"
matches = "click|3"
uri = {json.dumps(str(lake / "events"))}
value = {{ format = "string" }}
partition_by = ["partition"]
"""
        )
    cfg = config(path)
    args = ["run", "--until-end", "--config", str(path)]
    # Killed after the first table's commit of the first batch: no offset moves.
    killed = Cli(args, tmp_path / "killed.log", env=fault_point_env("between_table_commits", 1))
    assert killed.wait(120) == -9, killed.text()[-3000:]
    partitions = [Partition(topic, p) for p in (0, 1)]
    assert set(group_offsets(cfg, partitions).values()) == {None}
    assert (lake / "orders" / "_delta_log").exists()
    assert not (lake / "events" / "_delta_log").exists()

    rerun = Cli(args, tmp_path / "rerun.log")
    assert rerun.wait(120) == 0, rerun.text()[-3000:]

    # Created on demand with the route's properties and partitioning.
    assert DeltaTable(str(lake / "orders")).metadata().configuration == {
        "delta.appendOnly": "true",
        "delta.logRetentionDuration": "interval 60 days",
        "delta.checkpointInterval": "10",  # every table ingest creates has it
    }
    assert DeltaTable(str(lake / "events")).metadata().partition_columns == ["partition"]
    orders = DeltaTable(str(lake / "orders")).to_pyarrow_table()
    assert sorted(orders["id"].to_pylist()) == sorted(
        n for n in range(PER_PARTITION) if n % 4 == 0 for _ in (0, 1)
    )
    assert set(orders["kind"].to_pylist()) == {"order"}
    events = DeltaTable(str(lake / "events")).to_pyarrow_table()
    assert events.schema.field("value").type.equals("string")
    ids = sorted(json.loads(v)["id"] for v in events["value"].to_pylist())
    assert ids == sorted(n for n in range(PER_PARTITION) if n % 4 in (1, 2) for _ in (0, 1))
    dead = DeltaTable(str(lake / "default_dead_letters")).to_pyarrow_table()
    assert set(dead["error_message"].to_pylist()) == {
        f"no [[route]] matches this record of topic {topic!r}"
    }
    assert len(dead) == 2 * (PER_PARTITION // 4)
    assert not (lake / "orders_dead_letters").exists()
    assert not (lake / "events_dead_letters").exists()

    # Each offset of each partition in exactly one place, none missing.
    placed = Counter(
        _offsets(str(lake / "orders"))
        + _offsets(str(lake / "events"))
        + _offsets(str(lake / "default_dead_letters"))
    )
    assert set(placed.values()) == {1}
    assert set(placed) == {(p, o) for p in (0, 1) for o in range(PER_PARTITION)}
    assert group_offsets(cfg, partitions) == broker_ends(cfg, partitions)

    report = status_json(path)
    uris = [str(lake / name) for name in ("default", "events", "orders")]
    assert [t["uri"] for t in report["tables"]] == uris
    assert all(t["lag"] == 0 for t in report["tables"])
    for row in report["partitions"]:
        assert row["tables"] == [uris[2], uris[1], uris[0]]
        assert row["txn_version"] == PER_PARTITION - 1 and row["lag"] == 0
