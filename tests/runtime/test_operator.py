"""The operator's surface of live runs: ``/metrics`` scraped before and after the first
batch (parsed with prometheus_client's own parser), and the bounded runs (``ingest
replay``, ``ingest run --until-end``) on a real pseudo-terminal, its screen rendered by a
terminal emulator (pyte).

Each test runs the ``ingest`` CLI as a process (its own Spark, local[2]) against the
session's Apache Kafka broker.
"""

from __future__ import annotations

import fcntl
import os
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import urllib.request
from pathlib import Path

import pyte
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ingest.testing import KafkaCluster, create_topic, produce
from tests.runtime.support import (
    ROOT,
    Cli,
    assert_exact,
    records,
    row_count,
    wait_until,
    write_config,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 3
COLUMNS, ROWS = 200, 50

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(address: str) -> tuple[str, Samples]:
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }
    return text, samples


def test_metrics_have_a_zero_baseline_before_the_first_batch_and_count_after(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)  # empty: no batch yet
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"metrics": {"listen": "127.0.0.1:0"}},
    )
    cli = Cli(["run", "-c", str(path)], tmp_path / "run.log")
    try:
        listening = cli.wait_for_event("metrics_listening", 60)
        address = re.search(r"address=(\S+)", listening).group(1)  # type: ignore[union-attr]
        cli.wait_for_event("worker_started", 60, count=PARTITIONS)
        before_text, before = scrape(address)
        (tmp_path / "scrape-before.txt").write_text(before_text)
        assert "event=batch_started" not in cli.text()  # the scrape came before any batch
        for p in range(PARTITIONS):
            labels = (("partition", str(p)), ("topic", topic))
            for name in (
                "ingest_records_consumed_total",
                "ingest_bytes_consumed_total",
                "ingest_worker_restarts_total",
                "ingest_partition_failed",
                "ingest_partition_lag",
            ):
                assert before[(name, labels)] == 0, (name, p, before_text)
        for outcome in ("ok", "failed"):
            assert before[("ingest_batches_total", (("outcome", outcome),))] == 0
        for stage in ("plan", "spark", "commit"):
            assert before[("ingest_batch_stage_seconds_count", (("stage", stage),))] == 0
        assert before[("ingest_rows_written_total", ())] == 0
        assert before[("ingest_partitions_assigned", ())] == PARTITIONS
        assert before[("process_resident_memory_bytes", ())] > 0
        assert before[("process_open_fds", ())] > 0
        assert ("process_cpu_seconds_total", ()) in before

        per_partition = 2000
        produce(
            broker.bootstrap,
            topic,
            (r for p in range(PARTITIONS) for r in records(p, 0, per_partition)),
        )
        landed = PARTITIONS * per_partition
        wait_until(lambda: row_count(tmp_path / "table") == landed, 120, "the rows")
        rows = ("ingest_rows_written_total", ())
        wait_until(lambda: scrape(address)[1][rows] == landed, 30, "the batch's metrics")
        after_text, after = scrape(address)
        (tmp_path / "scrape-after.txt").write_text(after_text)
        for p in range(PARTITIONS):
            labels = (("partition", str(p)), ("topic", topic))
            assert after[("ingest_records_consumed_total", labels)] == per_partition
        assert after[("ingest_batches_total", (("outcome", "ok"),))] >= 1
        stage = (("stage", "spark"),)
        count = after[("ingest_batch_stage_seconds_count", stage)]
        assert count >= 1
        # Cumulative buckets: the +Inf bucket holds every batch.
        assert after[("ingest_batch_stage_seconds_bucket", (("le", "+Inf"), *stage))] == count
        cli.signal(signal.SIGTERM)
        assert cli.wait(90) == 0, cli.text()[-3000:]
    finally:
        cli.kill()
    # Off a terminal the output stays one log record per line, the JVM's included.
    lines = [line for line in cli.text().splitlines() if line.strip()]
    strays = [line for line in lines if not line.startswith("ts=")]
    assert not strays, strays[:5]


def run_in_pty(args: list[str], capture: Path, bound: float) -> tuple[int, bytes]:
    """``ingest ARGS`` with a pseudo-terminal of COLUMNS x ROWS as its stdin, stdout and
    stderr; every byte it wrote, also saved to ``capture``."""
    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", *args],
        cwd=ROOT,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        env=dict(os.environ, TERM="xterm-256color", PYTHONUNBUFFERED="1"),
        start_new_session=True,
    )
    os.close(slave)
    data = bytearray()
    try:

        def drained() -> bool:
            readable, _, _ = select.select([master], [], [], 0.2)
            if readable:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: every holder of the terminal is gone
                    chunk = b""
                data.extend(chunk)
                return not chunk
            return process.poll() is not None

        wait_until(drained, bound, "the run's end on the terminal")
        code = process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
        os.close(master)
        capture.write_bytes(bytes(data))
    return code, bytes(data)


def screen_lines(data: bytes) -> list[str]:
    """What a terminal shows after ``data``: the lines scrolled off, then the screen."""
    screen = pyte.HistoryScreen(COLUMNS, ROWS, history=100_000)
    pyte.ByteStream(screen).feed(data)
    scrolled = [
        "".join(line[x].data for x in range(COLUMNS)).rstrip() for line in screen.history.top
    ]
    return [*scrolled, *(line.rstrip() for line in screen.display)]


BAR = re.compile(r"━|\d[\d,]*/[\d,]+ records")
RECORD = re.compile(r"\bts=\d{4}-\d\d-\d\dT|\blevel=(debug|info|warning|error)\b")


@pytest.mark.parametrize(
    "command", [["replay", "--from", "earliest"], ["run", "--until-end"]], ids=lambda c: c[0]
)
def test_a_bounded_run_on_a_terminal_draws_its_bar_below_the_log_records(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, command: list[str]
) -> None:
    per_partition = 12_000
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    produce(
        broker.bootstrap,
        topic,
        (r for p in range(PARTITIONS) for r in records(p, 0, per_partition)),
        compression="lz4",
    )
    path = write_config(
        tmp_path / "replay.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        # Several batches, so log records come while the bar is drawn.
        sections={"trigger": {"max_records": 8000}},
    )
    capture = tmp_path / f"{command[0]}.pty"
    code, data = run_in_pty([command[0], "-c", str(path), *command[1:]], capture, 300)
    lines = screen_lines(data)
    (tmp_path / f"{command[0]}.screen.txt").write_text("\n".join(lines) + "\n")
    assert code == 0, "\n".join(lines[-40:])
    assert_exact(tmp_path / "table", dict.fromkeys(range(PARTITIONS), per_partition))
    mixed = [line for line in lines if BAR.search(line) and RECORD.search(line)]
    assert not mixed, mixed
    bars = [i for i, line in enumerate(lines) if BAR.search(line)]
    total = f"{PARTITIONS * per_partition:,}"
    # The bar was redrawn in place: one line, left at its end, the run's records above it.
    assert len(bars) == 1, [lines[i] for i in bars]
    assert f"{total}/{total} records" in lines[bars[0]]
    above = "\n".join(lines[: bars[0]])
    assert above.count("event=batch_committed ") >= 2, above[-3000:]
    assert "event=worker_started " in above
    # Every other line is a log record, whole (a long one wraps onto the next rows).
    for number, line in enumerate(lines):
        if line and not BAR.search(line) and not RECORD.search(line):
            # (rstrip may have taken one space off a row that was full)
            assert len(lines[number - 1]) >= COLUMNS - 1, f"not a log record: {line!r}"
