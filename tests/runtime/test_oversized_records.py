"""A record larger than ``[fetch] max_record_bytes`` (its key and value together) becomes a
dead letter naming its size, without its bytes, and the partition goes on: every offset
ends in exactly one table (Apache Kafka, ``ingest run --until-end``, the local engine)."""

from __future__ import annotations

from pathlib import Path

from deltalake import DeltaTable

from ingest.sink.deadletter import STAGE_CORRUPT
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from tests.runtime.support import Cli, config, write_config

LIMIT = 256 * 1024
BIG = {5: (b"v" * 300_000, b"k"), 12: (b"v" * 100_000, b"k" * 200_000)}  # value, key


def test_a_record_over_max_record_bytes_is_a_dead_letter_without_its_bytes(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    records = [
        ProducedRecord(*BIG.get(n, (b"small-%d" % n, b"k%d" % n)), partition=0) for n in range(20)
    ]
    produce(broker.bootstrap, topic, records)
    path = write_config(
        tmp_path / "ingest.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"fetch": {"max_record_bytes": "256KiB"}, "spark": {"engine": "local"}},
    )
    run = Cli(["run", "-c", str(path), "--until-end"], tmp_path / "run.log")
    assert run.wait(120) == 0, run.text()[-3000:]

    landed = DeltaTable(str(tmp_path / "table")).to_pyarrow_table()
    assert sorted(landed.column("offset").to_pylist()) == [n for n in range(20) if n not in BIG]
    dead = DeltaTable(config(path).dead_letter_uri()).to_pyarrow_table().to_pylist()
    assert sorted(row["offset"] for row in dead) == sorted(BIG)
    for row in dead:
        size = sum(len(part) for part in BIG[row["offset"]])
        assert row["error_stage"] == STAGE_CORRUPT
        assert f"record of {size} bytes" in row["error_message"], row["error_message"]
        assert f"max_record_bytes ({LIMIT})" in row["error_message"]
        assert not row["value"]  # its bytes are not kept
