"""Rebalance time, classic versus consumer group protocol: a second member joining, then leaving.

One Apache Kafka 4.4 node (the harness's, ``group.initial.rebalance.delay.ms=0``, read back
from the broker and printed); one topic of ``--partitions`` (12) partitions with
``--records`` (100) records each. Per round and variant, in a fresh group and table:

* member A (``python -m ingest.cli run -c <round>.toml``, continuous mode, as a subprocess)
  joins alone, runs a worker per partition and lands the records (its Spark is then idle);
* **join**: member B (a second process, same config) is started. Measured until every
  partition has a running worker on its final owner: B's ``worker_started`` for each
  partition A revoked, A's other workers never restarted. Two starts are given: from the
  moment B's process is started (what an operator sees: it includes Python's start, the
  imports and the metadata lookup, the same for both protocols) and from B's ``joining``
  event (the group protocol's own cost). The phases between are shown: A's
  ``partitions_revoked``, B's ``partitions_assigned``;
* **leave**: B gets SIGTERM (it stops its workers, leaves the group, then stops its Spark).
  Measured from the signal until A runs a worker for every partition again;
* A gets SIGTERM; both must exit 0.

A's kept workers must keep the same processes through both rebalances (no second
``worker_started`` for them, their pids alive at the end): checked and counted. Every time
comes from the log's ``ts`` (ms) and this process's clock for the spawn and the signal.

Variants: ``protocol:heartbeat_ms:session_ms``. Classic takes them from the config
(``source.heartbeat_interval``, ``session_timeout``; ``assignors`` left at
cooperative-sticky); consumer (KIP-848) sets them on the group with ``incremental_alter_configs``
(``consumer.heartbeat.interval.ms``, ``consumer.session.timeout.ms``) before A joins, and the
config's values match. Variants run interleaved, the order rotated each round.

    .venv/bin/python scripts/bench/rebalance.py --rounds 5            # ~6 min (3: ~4 min)
    .venv/bin/python scripts/bench/rebalance.py --rounds 1 --variants classic:500:6000,consumer:500:6000

The last line is ``RESULT join_<consumer>_vs_<classic>=<ratio> ... leave_... restarts=<n>
ok=<true|false>``: medians of consumer over classic for each pair of variants (the n-th
consumer variant against the n-th classic one); ``restarts`` counts kept workers restarted.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _pipeline import ingest_argv, load_average, machine

from ingest.testing import (
    KafkaCluster,
    ProducedRecord,
    create_topic,
    produce,
    set_group_configs,
    unique_name,
)
from ingest.testing.apache_kafka import KAFKA_VERSION
from ingest.testing.configs import write_toml

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_VARIANTS = "classic:3000:45000,consumer:5000:45000,classic:500:6000,consumer:500:6000"
BROKER_SETTINGS = (
    "group.initial.rebalance.delay.ms",
    "group.consumer.heartbeat.interval.ms",
    "group.consumer.min.heartbeat.interval.ms",
    "group.consumer.session.timeout.ms",
    "group.consumer.assignors",
    "group.consumer.assignment.interval.ms",
)
GROUP_SETTINGS = (
    "consumer.heartbeat.interval.ms",
    "consumer.session.timeout.ms",
    "consumer.assignment.interval.ms",
)
WAIT = 120.0  # seconds: a deadline on each condition, never a sleep


class RoundFailed(Exception):
    """A condition was not met in time, or a process exited when it should not have."""


@dataclass(frozen=True)
class Variant:
    protocol: str  # "classic" or "consumer"
    heartbeat_ms: int
    session_ms: int

    @property
    def name(self) -> str:
        return f"{self.protocol} hb {self.heartbeat_ms} ms"

    @property
    def key(self) -> str:
        return f"{self.protocol}{self.heartbeat_ms}"


def parse_variants(text: str) -> list[Variant]:
    variants = []
    for item in text.split(","):
        protocol, heartbeat, session = item.split(":")
        if protocol not in ("classic", "consumer"):
            raise SystemExit(f"unknown protocol {protocol!r} in --variants")
        variants.append(Variant(protocol, int(heartbeat), int(session)))
    return variants


# -- the members ----------------------------------------------------------------------------


def when(entry: Mapping[str, Any]) -> float:
    return datetime.fromisoformat(str(entry["ts"])).timestamp()


def partition_of(entry: Mapping[str, Any]) -> int:
    return int(str(entry["partition"]).rsplit("-", 1)[1])


def partitions_in(text: Any) -> set[int]:
    return {int(p.rsplit("-", 1)[1]) for p in str(text or "").split(",") if p}


class Member:
    """``ingest run`` as a subprocess, its JSON log (stderr and stdout) read as it grows."""

    def __init__(self, name: str, config: Path, log: Path) -> None:
        self.name = name
        self.log = log
        self._out = open(log, "wb")  # noqa: SIM115 (closed in close())
        self._offset = 0
        self._partial = b""
        self.events: list[dict[str, Any]] = []
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        env.setdefault("PYSPARK_PYTHON", sys.executable)
        env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        self.argv = ingest_argv(config)
        self.started_at = time.time()
        self.process = subprocess.Popen(
            self.argv, cwd=ROOT, stdout=self._out, stderr=subprocess.STDOUT, env=env
        )

    def read(self) -> list[dict[str, Any]]:
        with open(self.log, "rb") as handle:
            handle.seek(self._offset)
            chunk = handle.read()
        self._offset += len(chunk)
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        for line in lines:
            if line.startswith(b"{"):
                try:
                    self.events.append(json.loads(line))
                except ValueError:
                    continue
        return self.events

    def named(self, name: str, after: float = 0.0) -> list[dict[str, Any]]:
        return [e for e in self.read() if e.get("event") == name and when(e) >= after]

    def messages(self, text: str) -> list[dict[str, Any]]:
        return [e for e in self.read() if text in str(e.get("msg", ""))]

    def check_alive(self) -> None:
        if self.process.poll() is not None:
            raise RoundFailed(
                f"{self.name} exited ({self.process.returncode}); its log: {self.log}"
            )

    def terminate(self) -> float:
        sent = time.time()
        self.process.send_signal(signal.SIGTERM)
        return sent

    def wait(self, timeout: float) -> int:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            raise RoundFailed(f"{self.name} did not exit {timeout:.0f}s after SIGTERM") from exc

    def close(self) -> None:
        if self.process.poll() is None:  # only after a failure: the round is lost anyway
            self.process.kill()
            self.process.wait(30)
        self._out.close()


def wait_for(condition: Callable[[], bool], members: Iterable[Member], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        for member in members:
            member.check_alive()
        if time.monotonic() > deadline:
            raise RoundFailed(f"timed out after {WAIT:.0f}s waiting for {what}")
        time.sleep(0.05)


# -- one round ------------------------------------------------------------------------------


@dataclass
class RoundResult:
    variant: Variant
    join_from_start: float = 0.0  # B's process started -> all workers on their final owner
    join_from_joining: float = 0.0  # B's joining event -> the same
    start_to_joining: float = 0.0
    joining_to_revoked: float = 0.0  # A's partitions_revoked
    revoked_to_assigned: float = 0.0  # B's partitions_assigned (with new partitions)
    assigned_to_running: float = 0.0  # B's last worker_started
    moved: int = 0
    leave: float = 0.0  # SIGTERM to B -> A runs every partition again
    term_to_left: float = 0.0  # B's left_group event
    left_to_assigned: float = 0.0  # A's partitions_assigned (with new partitions)
    assigned_to_running_leave: float = 0.0  # A's last worker_started
    restarts: int = 0  # kept workers of A started again (must be 0)
    problems: list[str] = field(default_factory=list)


def admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    # log_level 4: not librdkafka's notices as a client is destroyed ("Purging 1 unserved
    # events"), printed between the figures.
    return AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})


def set_group_timing(bootstrap: str, group: str, variant: Variant) -> None:
    """KIP-848: the heartbeat interval and session are the group's, set on the coordinator."""
    set_group_configs(
        bootstrap,
        group,
        {
            "consumer.heartbeat.interval.ms": variant.heartbeat_ms,
            "consumer.session.timeout.ms": variant.session_ms,
        },
    )


def described(bootstrap: str, kind: str, name: str, keys: Iterable[str]) -> dict[str, str]:
    """Configs as the broker reports them (a broker's, or a group's)."""
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    resource_type = ResourceType.BROKER if kind == "broker" else ResourceType.GROUP
    resource = ConfigResource(resource_type, name)
    client = admin(bootstrap)  # held: a collected client fails its futures
    answer = client.describe_configs([resource])[resource].result(timeout=15)
    return {key: (answer[key].value if key in answer else "(not known)") for key in keys}


def write_round_config(
    path: Path, bootstrap: str, topic: str, group: str, table: Path, variant: Variant
) -> Path:
    return write_toml(
        path,
        {
            "kafka": {"bootstrap_servers": [bootstrap]},
            "source": {
                "topics": [topic],
                "group_id": group,
                "group_protocol": variant.protocol,
                "heartbeat_interval": f"{variant.heartbeat_ms}ms",
                "session_timeout": f"{variant.session_ms}ms",
            },
            "handoff": {"segment_max_age": "500ms"},
            "trigger": {"max_age": "1s"},
            "table": {"uri": str(table)},
            "spark": {"master": "local[1]"},
            "logging": {"format": "json", "level": "info"},
        },
    )


def run_round(
    kafka: KafkaCluster,
    topic: str,
    partitions: int,
    records: int,
    variant: Variant,
    directory: Path,
    show_group: bool,
) -> RoundResult:
    every = set(range(partitions))
    result = RoundResult(variant)
    group = unique_name(f"bench-rebalance-{variant.key}")
    if variant.protocol == "consumer":
        set_group_timing(kafka.bootstrap, group, variant)
        if show_group:
            settings = described(kafka.bootstrap, "group", group, GROUP_SETTINGS)
            print(f"#   {variant.name}: the group's configs: {settings}", flush=True)
    directory.mkdir(parents=True)
    config = write_round_config(
        directory / "run.toml", kafka.bootstrap, topic, group, directory / "table", variant
    )
    a = Member("A", config, directory / "a.log")
    b: Member | None = None
    try:
        # A alone: every partition, the records landed, then idle.
        def a_settled() -> bool:
            started = {partition_of(e) for e in a.named("worker_started")}
            rows = sum(int(e.get("rows", 0)) for e in a.named("batch_committed"))
            return started == every and rows >= partitions * records

        wait_for(a_settled, [a], "A to run every partition and land the records")
        first = {partition_of(e): int(e["pid"]) for e in a.named("worker_started")}

        # Join: B starts; done when each partition A gave up runs on B.
        b = Member("B", config, directory / "b.log")
        member_b = b

        def join_done() -> bool:
            revoked = set().union(
                *(partitions_in(e["partitions"]) for e in a.named("partitions_revoked"))
            )
            on_b = {partition_of(e) for e in member_b.named("worker_started")}
            return bool(revoked) and on_b == revoked

        wait_for(join_done, [a, b], "B to run the partitions A gave up")
        (joining,) = b.named("joining")
        revoked_events = a.named("partitions_revoked")
        gave_up = set().union(*(partitions_in(e["partitions"]) for e in revoked_events))
        kept = every - gave_up
        b_started = b.named("worker_started")
        b_assigned = [e for e in b.named("partitions_assigned") if e.get("new")]
        done = max(when(e) for e in b_started)
        result.moved = len(gave_up)
        result.join_from_start = done - b.started_at
        result.join_from_joining = done - when(joining)
        result.start_to_joining = when(joining) - b.started_at
        result.joining_to_revoked = when(revoked_events[0]) - when(joining)
        result.revoked_to_assigned = when(b_assigned[0]) - when(revoked_events[0])
        result.assigned_to_running = done - when(b_assigned[0])
        if len(revoked_events) != 1:
            result.problems.append(f"A revoked {len(revoked_events)} times on the join")
        if len(gave_up) != partitions // 2:
            result.problems.append(f"B took {len(gave_up)} of {partitions} partitions")

        # Leave: B's Spark started first (its JVM start is not what is measured), then SIGTERM.
        wait_for(lambda: bool(member_b.messages("spark session")), [a, b], "B's Spark session")
        time.sleep(1.0)
        sent = b.terminate()

        def leave_done() -> bool:
            back = {partition_of(e) for e in a.named("worker_started", after=sent)}
            return back >= gave_up

        wait_for(leave_done, [a], "A to run B's partitions again")
        back = [e for e in a.named("worker_started", after=sent) if partition_of(e) in gave_up]
        again = max(when(e) for e in back)
        a_assigned = [e for e in a.named("partitions_assigned", after=sent) if e.get("new")]
        left = b.named("left_group")
        result.leave = again - sent
        if left:
            result.term_to_left = when(left[0]) - sent
            result.left_to_assigned = when(a_assigned[0]) - when(left[0])
        else:
            result.problems.append("B logged no left_group")
        result.assigned_to_running_leave = again - when(a_assigned[0])
        code = b.wait(WAIT)
        if code != 0:
            result.problems.append(f"B exited {code}")

        # A's kept workers: started once, still the same processes.
        starts = a.named("worker_started")
        result.restarts = sum(1 for e in starts if partition_of(e) in kept) - len(kept)
        dead = [p for p in kept if not Path(f"/proc/{first[p]}").exists()]
        if result.restarts:
            result.problems.append(f"{result.restarts} kept worker(s) of A started again")
        if dead:
            result.problems.append(f"kept workers of A gone: partitions {sorted(dead)}")
        for member in (a, b):
            for name in ("worker_crashed", "worker_failed", "partitions_lost", "run_failed"):
                if member.named(name):
                    result.problems.append(f"{member.name} logged {name}")
        if a.process.poll() is not None:
            result.problems.append(f"A exited early ({a.process.returncode})")
        a.terminate()
        code = a.wait(WAIT)
        if code != 0:
            result.problems.append(f"A exited {code}")
    finally:
        a.close()
        if b is not None:
            b.close()
    return result


# -- the report -----------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} {min(values):6.2f} {max(values):6.2f}"


def describe_round(number: int, r: RoundResult) -> str:
    return (
        f"round {number} {r.variant.name:20} join {r.join_from_start:5.2f}s from start, "
        f"{r.join_from_joining:5.2f}s from joining (start->joining {r.start_to_joining:.2f}, "
        f"->A revoked {r.joining_to_revoked:.2f}, ->B assigned {r.revoked_to_assigned:.2f}, "
        f"->B running {r.assigned_to_running:.2f}; {r.moved} moved); "
        f"leave {r.leave:5.2f}s (->B left {r.term_to_left:.2f}, ->A assigned "
        f"{r.left_to_assigned:.2f}, ->A running {r.assigned_to_running_leave:.2f}); "
        f"kept restarted {r.restarts}"
        + (f"; PROBLEMS: {'; '.join(r.problems)}" if r.problems else "")
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--records", type=int, default=100, help="per partition")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="protocol:heartbeat:session")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args()
    variants = parse_variants(args.variants)

    workdir = Path(tempfile.mkdtemp(prefix="ingest-bench-rebalance-"))
    print(f"# command: {shlex.join([sys.executable, *sys.argv])}")
    print(f"# {machine()}; load average before: {load_average()}")
    print(
        f"# Apache Kafka {KAFKA_VERSION}, 1 node; a member: {shlex.join(ingest_argv(Path('<round>/run.toml')))}"
    )
    print(
        f"# {args.partitions} partitions x {args.records} records; {args.rounds} rounds of "
        f"{', '.join(v.name + f' (session {v.session_ms} ms)' for v in variants)}; "
        f"work dir {workdir}",
        flush=True,
    )
    results: dict[Variant, list[RoundResult]] = {v: [] for v in variants}
    failures: list[str] = []
    began = time.monotonic()
    try:
        with KafkaCluster(1) as kafka:
            print(
                f"# broker: {described(kafka.bootstrap, 'broker', str(kafka.nodes[0].node_id), BROKER_SETTINGS)}"
            )
            topic = unique_name("bench-rebalance")
            create_topic(kafka.bootstrap, topic, partitions=args.partitions)
            produce(
                kafka.bootstrap,
                topic,
                (
                    ProducedRecord(b"p%d-%d" % (p, n) + b"x" * 60, key=b"k%d" % n, partition=p)
                    for p in range(args.partitions)
                    for n in range(args.records)
                ),
            )
            for number in range(1, args.rounds + 1):
                shift = (number - 1) % len(variants)
                for variant in variants[shift:] + variants[:shift]:
                    load = load_average()
                    try:
                        result = run_round(
                            kafka,
                            topic,
                            args.partitions,
                            args.records,
                            variant,
                            workdir / f"r{number}-{variant.key}",
                            show_group=number == 1,
                        )
                    except RoundFailed as exc:
                        failures.append(f"round {number} {variant.name}: {exc}")
                        print(f"# FAILED: {failures[-1]}", flush=True)
                        continue
                    results[variant].append(result)
                    print(f"# {describe_round(number, result)}; load {load}", flush=True)
    finally:
        if not args.keep and not failures:
            shutil.rmtree(workdir, ignore_errors=True)

    print(f"# load average after: {load_average()}; {time.monotonic() - began:.0f}s in all")
    print()
    print(
        f"{'variant':22} {'n':>2} | {'join from B start s':^20} | {'join from joining s':^20} | "
        f"{'leave from SIGTERM s':^20} | kept restarted"
    )
    print(
        f"{'':22} {'':>2} | {'median    min    max':^20} | {'median    min    max':^20} | "
        f"{'median    min    max':^20} |"
    )
    for variant, rounds in results.items():
        if not rounds:
            print(f"{variant.name:22}  0 | no round completed")
            continue
        print(
            f"{variant.name:22} {len(rounds):2} | {spread([r.join_from_start for r in rounds])} | "
            f"{spread([r.join_from_joining for r in rounds])} | "
            f"{spread([r.leave for r in rounds])} | {sum(r.restarts for r in rounds)}"
        )
    classic = [v for v in variants if v.protocol == "classic" and results[v]]
    consumer = [v for v in variants if v.protocol == "consumer" and results[v]]
    figures = []
    print()
    for ours, theirs in zip(consumer, classic, strict=False):
        for what, pick in (
            ("join", lambda r: r.join_from_start),
            ("join_from_joining", lambda r: r.join_from_joining),
            ("leave", lambda r: r.leave),
        ):
            ratio = statistics.median(map(pick, results[ours])) / statistics.median(
                map(pick, results[theirs])
            )
            print(f"consumer/classic {what}, {ours.name} over {theirs.name}: {ratio:.2f}")
            figures.append(f"{what}_{ours.key}_vs_{theirs.key}={ratio:.2f}")
    problems = [p for rounds in results.values() for r in rounds for p in r.problems]
    for problem in failures + problems:
        print(f"PROBLEM: {problem}")
    if failures:
        print(f"# logs kept in {workdir}")
    restarts = sum(r.restarts for rounds in results.values() for r in rounds)
    ok = not failures and not problems
    print(f"RESULT {' '.join(figures)} restarts={restarts} ok={str(ok).lower()}")


if __name__ == "__main__":
    main()
