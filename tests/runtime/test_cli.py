"""``ingest run`` as a process: continuous mode, metrics, SIGTERM mid-batch, a second signal.

Each CLI process starts its own Spark (local[2], ~8 s of JVM start), so there
are only two of them; the restarts after them run in the test process with the
session's Spark.
"""

from __future__ import annotations

import json
import re
import signal
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingest.protocol.partition import Partition
from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, create_topic, produce
from ingest.testing.faults import fault_point_env
from tests.bounds import SECOND_SIGNAL_S
from tests.runtime.support import (
    Cli,
    assert_exact,
    broker_ends,
    config,
    group_offsets,
    records,
    row_count,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4


def produce_range(broker: KafkaCluster, topic: str, start: int, count: int) -> None:
    produce(
        broker.bootstrap,
        topic,
        (r for p in range(PARTITIONS) for r in records(p, start, count)),
        compression="lz4",
    )


def topic_and_config(
    broker: KafkaCluster,
    topic: str,
    group: str,
    tmp_path: Path,
    records: int,
    sections: dict[str, dict[str, Any]] | None = None,
) -> Path:
    """A topic of PARTITIONS partitions holding ``records``, and a run config for it."""
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produce_range(broker, topic, 0, records)
    return write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections=sections,
    )


def finish_until_end(path: Path, spark: Any, ends: int) -> None:
    """A restart with --until-end (in this process): every offset lands once, the group's
    offsets reach the end offsets."""
    cfg = config(path)
    outcome = group_run(cfg, until_end=True, spark=spark).run()
    assert outcome.exit_code == 0, outcome.message
    table = cfg.table.uri
    assert_exact(table, dict.fromkeys(range(PARTITIONS), ends))
    partitions = [Partition(cfg.source.topics[0], p) for p in range(PARTITIONS)]
    assert broker_ends(cfg, partitions) == dict.fromkeys(partitions, ends)
    assert group_offsets(cfg, partitions) == dict.fromkeys(partitions, ends)


def run_with_first_batch_held(path: Path, log: Path, *, seconds: float) -> Cli:
    """``ingest run`` whose first batch waits ``seconds`` between writing its files and
    its Delta commit; returned once it is held there."""
    cli = Cli(
        ["run", "-c", str(path)], log, env=fault_point_env("before_delta_commit", 1, stall=seconds)
    )
    try:
        wait_until(
            lambda: "fault point before_delta_commit #1: stall" in cli.text(),
            120,
            "the first batch held before its commit",
        )
    except BaseException:
        cli.kill()
        raise
    return cli


def test_continuous_run_lands_new_data_and_a_sigterm_stops_it_cleanly(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    path = topic_and_config(
        broker, topic, group, tmp_path, 3000, sections={"metrics": {"listen": "127.0.0.1:0"}}
    )
    cli = Cli(["run", "-c", str(path)], tmp_path / "run.log")
    try:
        listening = cli.wait_for_event("metrics_listening", 30)
        address = re.search(r"address=(\S+)", listening).group(1)  # type: ignore[union-attr]
        cli.wait_for_event("partitions_assigned", 60)
        # Data produced while it runs, in several rounds.
        produced = 3000
        for _ in range(4):
            produce_range(broker, topic, produced, 1000)
            produced += 1000
            time.sleep(0.3)
        wait_until(
            lambda: row_count(tmp_path / "table") == PARTITIONS * produced, 120, "the rows so far"
        )

        def scrape() -> dict[tuple[str, str], float]:
            text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read()
            return {
                (sample.name, sample.labels.get("partition", sample.labels.get("stage", ""))): (
                    sample.value
                )
                for family in text_string_to_metric_families(text.decode())
                for sample in family.samples
            }

        # The rows are visible once Delta commits; the batch's metrics follow a moment later.
        stage = ("ingest_batch_stage_seconds_count", "spark")
        wait_until(lambda: scrape()[stage] > 0, 30, "the batch's stage metrics")
        metrics = scrape()
        status = json.loads(urllib.request.urlopen(f"http://{address}/status", timeout=10).read())
        assert metrics[("ingest_partitions_assigned", "")] == 4
        consumed = sum(
            metrics[("ingest_records_consumed_total", str(p))] for p in range(PARTITIONS)
        )
        assert consumed == PARTITIONS * produced
        lags = [metrics[("ingest_partition_lag", str(p))] for p in range(PARTITIONS)]
        assert all(lag >= 0 for lag in lags), metrics
        assert [row["state"] for row in status["partitions"]] == ["running"] * PARTITIONS
        assert all(row["pid"] for row in status["partitions"])

        # A large round, then SIGTERM while it lands. The batch may also finish before the
        # signal is handled; test_a_sigterm_mid_batch_... holds one in flight to make sure
        # of that case.
        produce_range(broker, topic, produced, 250_000)
        produced += 250_000
        cli.wait_for_event("batch_started", 60, count=len(cli.lines("batch_started")) + 1)
        cli.signal(signal.SIGTERM)
        assert cli.wait(90) == 0, cli.text()[-3000:]
    finally:
        cli.kill()
    log = cli.text()
    # Every batch landed before the exit had its offsets committed after it.
    assert log.rindex("event=offsets_committed") > log.rindex("event=batch_committed")
    assert log.index("event=left_group") > log.index("event=shutdown_started")
    cfg = config(path)
    partitions = [Partition(topic, p) for p in range(PARTITIONS)]
    offsets = group_offsets(cfg, partitions)
    landed = row_count(tmp_path / "table")
    # The group's offsets are exactly what the table holds.
    assert sum(o or 0 for o in offsets.values()) == landed
    # A restart (here --until-end) lands the rest once.
    produce_range(broker, topic, produced, 500)
    finish_until_end(path, spark, produced + 500)


def test_a_sigterm_mid_batch_lets_the_batch_finish_then_commits_and_leaves(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    path = topic_and_config(broker, topic, group, tmp_path, 20_000)
    # The first batch waits 8 s between writing its files and its Delta commit: the
    # signal lands while it is in flight, whatever the machine's speed.
    cli = run_with_first_batch_held(path, tmp_path / "run.log", seconds=8)
    try:
        cli.signal(signal.SIGTERM)
        assert cli.wait(90) == 0, cli.text()[-3000:]
    finally:
        cli.kill()
    log = cli.text()
    started_at = log.index("event=shutdown_started")
    # The batch in flight at the signal finished after it, then offsets were committed.
    assert log.index("event=batch_committed batch=1 ") > started_at
    assert log.rindex("event=offsets_committed") > started_at
    assert "event=left_group" in log
    cfg = config(path)
    partitions = [Partition(topic, p) for p in range(PARTITIONS)]
    assert sum(o or 0 for o in group_offsets(cfg, partitions).values()) == row_count(
        tmp_path / "table"
    )
    finish_until_end(path, spark, 20_000)


def test_a_second_signal_exits_at_once_and_a_restart_lands_everything_once(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    path = topic_and_config(broker, topic, group, tmp_path, 100_000)
    # The first batch is held before its Delta commit far longer than the test takes, so
    # the graceful stop has a batch to wait for when the second signal comes.
    cli = run_with_first_batch_held(path, tmp_path / "run.log", seconds=60)
    try:
        cli.signal(signal.SIGTERM)
        cli.wait_for_event("shutdown_started", 10)
        cli.signal(signal.SIGINT)
        started = time.monotonic()
        code = cli.wait(30)
        took = time.monotonic() - started
    finally:
        cli.kill()
    assert code == 128 + signal.SIGINT, cli.text()[-3000:]
    assert took < SECOND_SIGNAL_S, took
    assert "second signal: exiting at once" in cli.text()
    assert "event=batch_committed" not in cli.text()
    produce_range(broker, topic, 100_000, 1000)
    finish_until_end(path, spark, 101_000)


def test_a_json_log_is_json_throughout_workers_and_spark_included(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    """The supervisor's stderr carries its own lines, its workers' and its Spark JVM's
    (log4j's and the JVM's own words): with format = "json" each is one JSON object."""
    # On Spark (not the local engine, which starts no JVM), so the JVM's lines are there.
    sections = {"logging": {"format": "json"}, "spark": {"engine": "spark"}}
    path = topic_and_config(broker, topic, group, tmp_path, 2000, sections=sections)
    cli = Cli(["run", "-c", str(path), "--until-end"], tmp_path / "run.log")
    try:
        assert cli.wait(180) == 0, cli.text()[-3000:]
    finally:
        cli.kill()
    records = []
    for line in cli.text().splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            raise AssertionError(f"not a JSON line: {line!r}") from None
    assert all({"ts", "level", "logger"} <= record.keys() for record in records)
    # The workers' own lines carry their partition and pid (the supervisor logs under
    # ingest.worker too, when it uses the worker's modules).
    workers = [
        r for r in records if r["logger"].startswith("ingest.") and "pid" in r and "msg" in r
    ]
    assert {r["partition"] for r in workers} == set(range(PARTITIONS))
    assert all(r["topic"] == topic and r["pid"] > 0 for r in workers)
    # The JVM's lines, e.g. "Using Spark's default log4j profile: ..." before log4j starts.
    assert [r for r in records if r["logger"].startswith("spark.")], records[:20]
    assert [r for r in records if r.get("event") == "batch_committed"]
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), 2000))
