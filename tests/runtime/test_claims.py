"""Claims of the design shown end to end through ``ingest run`` / ``ingest replay`` (the CLI
as a subprocess) on Apache Kafka:

* a static member restarted within the session timeout gets its partitions back without
  a rebalance, and the other member's workers never restart;
* a batch held longer than three session timeouts causes no rebalance (heartbeats go on
  beside the batch);
* the supervisor's global buffer cap bounds the handoff's bytes across 8 partitions,
  measured from outside, on the filesystem;
* ``replay --overwrite`` SIGKILLed between its cut and its commit, then rerun, ends exact.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from ingest.supervisor.modes.group_run import group_run
from ingest.supervisor.output.metrics import Metrics
from ingest.testing import KafkaCluster, create_topic, produce
from ingest.testing.faults import fault_point_env
from tests.runtime.support import (
    Cli,
    InProcess,
    assert_exact,
    config,
    records,
    row_count,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

MIB = 1024 * 1024
SESSION_S = 2.0  # write_config's session timeout


def _topic(broker: KafkaCluster, topic: str, partitions: int, per_partition: int) -> None:
    create_topic(broker.bootstrap, topic, partitions=partitions)
    produce(
        broker.bootstrap,
        topic,
        (r for p in range(partitions) for r in records(p, 0, per_partition)),
        compression="lz4",
    )


def test_a_batch_held_past_three_session_timeouts_causes_no_rebalance(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    _topic(broker, topic, 4, 2_000)
    path = write_config(
        tmp_path / "run.toml", bootstrap=broker.bootstrap, topic=topic, group=group,
        table=tmp_path / "table",
    )  # fmt: skip
    held = 3.5 * SESSION_S
    cli = Cli(
        ["run", "-c", str(path)],
        tmp_path / "run.log",
        env=fault_point_env("before_delta_commit", 1, stall=held),
    )
    try:
        cli.wait_for_event("batch_committed", 120)
        wait_until(lambda: row_count(tmp_path / "table") >= 8_000, 120, "every row landed")
        cli.signal(signal.SIGTERM)
        code = cli.wait(90)
    finally:
        cli.kill()
    text = cli.text()
    assert code == 0, text[-3000:]
    assert "fault point before_delta_commit #1: stall" in text, text[-3000:]
    assert len(cli.lines("partitions_assigned")) == 1, cli.lines("partitions_assigned")
    for unwanted in ("partitions_revoked", "partitions_lost", "commit_failed"):
        assert not cli.lines(unwanted), cli.lines(unwanted)
    assert_exact(tmp_path / "table", dict.fromkeys(range(4), 2_000))


def _bytes_under(root: Path) -> int:
    total = 0
    for directory, _, files in os.walk(root):
        for name in files:
            try:
                total += os.stat(os.path.join(directory, name)).st_size
            except FileNotFoundError:
                continue  # released meanwhile
    return total


def test_the_global_buffer_cap_bounds_the_handoff_across_8_partitions(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    partitions, per_partition = 8, 80_000
    _topic(broker, topic, partitions, per_partition)
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    cap = 8 * MIB
    segment = 256 * 1024
    fetch_bytes = 256 * 1024
    path = write_config(
        tmp_path / "run.toml", bootstrap=broker.bootstrap, topic=topic, group=group,
        table=tmp_path / "table",
        sections={
            "handoff": {
                "mode": "files", "root": str(handoff), "max_buffered_bytes": cap,
                "segment_max_bytes": segment,
            },
            # Each worker's own limit, as configured, could hold the whole cap: what binds
            # is handoff.max_buffered_bytes (the supervisor's pause, and the space plan's
            # share of it per worker).
            "worker": {"max_unacked_bytes": "64MiB", "resume_unacked_bytes": "32MiB"},
            "fetch": {"partition_max_bytes": fetch_bytes},
        },
    )  # fmt: skip
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _bytes_under(handoff))
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    # The first batch is held 6 s before its commit: the workers fetch on meanwhile, and
    # only the cap stops them.
    cli = Cli(
        ["run", "-c", str(path), "--until-end"],
        tmp_path / "run.log",
        env=fault_point_env("before_delta_commit", 1, stall=6.0),
    )
    sampler.start()
    try:
        code = cli.wait(300)
    finally:
        done.set()
        sampler.join(5)
        cli.kill()
    text = cli.text()
    assert code == 0, text[-3000:]
    assert_exact(tmp_path / "table", dict.fromkeys(range(partitions), per_partition))
    # Sealed bytes stop at the cap; beyond it: each worker's open segment and the one
    # Fetch answer it may take after the pause (decoded, a few times its wire size).
    bound = cap + partitions * (segment + 4 * fetch_bytes)
    total = partitions * per_partition * 60  # at least the values' bytes
    print(f"peak handoff {peak / MIB:.1f} MiB, cap {cap / MIB:.0f} MiB, bound {bound / MIB:.1f}")
    assert peak <= bound, f"the handoff held {peak} bytes, above {bound}"
    assert peak >= cap // 2, f"the cap was never approached ({peak} bytes): the test shows nothing"
    assert total > 2 * bound, "the topic must not fit under the cap"
    assert cli.lines("buffer_cap"), "the cap never paused the workers"


def test_replay_overwrite_killed_between_its_cut_and_its_commit_then_rerun_ends_exact(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    _topic(broker, topic, 2, 3_000)
    table = tmp_path / "table"
    path = write_config(
        tmp_path / "run.toml", bootstrap=broker.bootstrap, topic=topic, group=group,
        table=table, sections={"trigger": {"max_records": 1_000}},
    )  # fmt: skip
    first = Cli(["run", "-c", str(path), "--until-end"], tmp_path / "run.log")
    assert first.wait(240) == 0, first.text()[-3000:]
    assert_exact(table, {0: 3_000, 1: 3_000})

    replay = ["replay", "-c", str(path), "--from", "earliest", "--overwrite"]
    # SIGKILL between the second batch's cut and its commit: its data files are written,
    # the files holding the rows it replaces are rewritten without them, and nothing of
    # it is committed.
    killed = Cli(replay, tmp_path / "replay1.log", env=fault_point_env("after_overwrite_cut", 2))
    code = killed.wait(240)
    assert code == -signal.SIGKILL, killed.text()[-3000:]
    assert "fault point after_overwrite_cut #2: SIGKILL" in killed.text()
    assert_exact(table, {0: 3_000, 1: 3_000})  # the first commit replaced rows one for one

    again = Cli(replay, tmp_path / "replay2.log")
    assert again.wait(240) == 0, again.text()[-3000:]
    assert_exact(table, {0: 3_000, 1: 3_000})


def _assignment(line: str) -> set[str]:
    found = re.search(r"assignment=(\S*)", line)
    assert found is not None, line
    return set(filter(None, found.group(1).split(",")))


def test_a_static_member_restarted_within_the_session_gets_its_partitions_back_unrebalanced(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, spark: Any
) -> None:
    _topic(broker, topic, 4, 1_000)
    source = {"session_timeout": "15s", "heartbeat_interval": "1s", "rebalance_timeout": "30s"}

    def member(name: str) -> Path:
        return write_config(
            tmp_path / f"{name}.toml", bootstrap=broker.bootstrap, topic=topic, group=group,
            table=tmp_path / "table",
            sections={"source": {**source, "group_instance_id": f"ingest-{name}"}},
        )  # fmt: skip

    metrics = Metrics()
    a = InProcess(group_run(config(member("a")), spark=spark, metrics=metrics))
    b: Cli | None = None
    try:
        wait_until(lambda: len(a.partitions()) == 4, 60, "member a to own all")
        b = Cli(["run", "-c", str(member("b"))], tmp_path / "b1.log")
        b.wait_for_event("worker_started", 90, count=2)
        wait_until(lambda: len(a.partitions()) == 2, 60, "member a to give up half")
        wait_until(lambda: row_count(tmp_path / "table") >= 4_000, 120, "the first rows")
        kept = {p: row["pid"] for p, row in a.partitions().items()}
        before = _assignment(b.lines("partitions_assigned")[-1])
        joins = metrics.value("ingest_group_requests_total", api="JoinGroup")
        assert joins >= 1

        # b stops (a static member sends no LeaveGroup) and comes back at once.
        b.signal(signal.SIGTERM)
        assert b.wait(90) == 0, b.text()[-3000:]
        assert "static=true" in b.text()
        b = Cli(["run", "-c", str(member("b"))], tmp_path / "b2.log")
        b.wait_for_event("worker_started", 90, count=2)
        assert _assignment(b.lines("partitions_assigned")[0]) == before

        produce(
            broker.bootstrap,
            topic,
            (r for p in range(4) for r in records(p, 1_000, 500)),
        )
        wait_until(lambda: row_count(tmp_path / "table") >= 6_000, 120, "the new rows")
        # a never rejoined, and its workers are the same processes.
        time_of_check = metrics.value("ingest_group_requests_total", api="JoinGroup")
        assert time_of_check == joins, f"member a joined {time_of_check - joins} more time(s)"
        assert {p: row["pid"] for p, row in a.partitions().items()} == kept
        b.signal(signal.SIGTERM)
        assert b.wait(90) == 0, b.text()[-3000:]
        b = None
        outcome = a.stop()
    finally:
        if b is not None:
            b.kill()
        if a.alive:
            a.stop()
    assert outcome.exit_code == 0, outcome.message
    assert_exact(tmp_path / "table", dict.fromkeys(range(4), 1_500))
