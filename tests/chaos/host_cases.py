"""Supervisors on several hosts of one machine (``ingest.testing.netns``): a 3-node Apache
Kafka on three namespace hosts, the test's clients on a fourth, and two ``ingest run``
supervisors on two more, in one group, landing one table on the shared filesystem, each
with the local engine (no transform, a local master).

* ``two_hosts_share``: both hosts take partitions and land rows; the table is exact.
* ``host-cut`` (``host_cut``): supervisor host A is held in a batch before its Delta
  commit (``INGEST_FAULT_POINT=before_delta_commit:N:stall=S``), then its link is cut
  (link down) past the session timeout. Host B must take A's partitions and land their
  records; A must see its partitions lost and stop their workers. When the link comes
  back, A's held batch reaches its Delta commit late: the txn filter must refuse the
  offsets B landed (no row twice), and no OffsetCommit of A's old generation may land.
  The table is exact at the end, the group's offsets at its ends.
"""

from __future__ import annotations

import random
import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.faults import fault_point_env
from ingest.testing import KafkaCluster, create_topic, unique_name
from ingest.testing.apache_kafka import wait_for_leaders
from ingest.testing.faults import WORKER_PROCESS_NAME
from ingest.testing.netns import Host, HostNetwork
from tests.chaos.pieces import (
    PARTITIONS,
    ROOT,
    CaseFailed,
    Outcome,
    Run,
    Setup,
    check,
    produce_rounds,
    wait_until,
)
from tests.runtime.support import row_count, write_config

_CONSUMER_GROUP = {
    "group.consumer.session.timeout.ms": "6000",
    "group.consumer.heartbeat.interval.ms": "1000",
}
SUPERVISORS = ("sup-a", "sup-b")
SPARK_MASTER = "spark-master"  # a Spark standalone master's host (tests/cluster/test_hosts.py)
HOST_NAMES = ("kafka-1", "kafka-2", "kafka-3", "client", *SUPERVISORS, SPARK_MASTER)
# What the run owns, from its log: an assignment names all it owns; with the consumer
# protocol (KIP-848) a revocation comes without a new assignment, and so may a loss.
_OWNERSHIP = re.compile(
    r"event=(partitions_assigned) .*?assignment=(\S*)"
    r"|event=(partitions_revoked|partitions_lost) partitions=(\S*)"
)


@dataclass
class HostSite:
    """The hosts and the Kafka cluster on three of them, shared by a session's runs."""

    network: HostNetwork
    cluster: KafkaCluster

    @property
    def client(self) -> Host:
        return self.network["client"]

    def supervisor(self, name: str) -> Host:
        return self.network[name]

    def stop(self) -> None:
        try:
            self.cluster.cleanup()
        finally:
            self.network.stop()


def start_site() -> HostSite:
    """Makes the hosts and starts the Kafka cluster on them (torn down on failure)."""
    network = HostNetwork(HOST_NAMES).start()
    try:
        nodes = [network[f"kafka-{i}"] for i in (1, 2, 3)]
        # The consumer protocol's session (KIP-848) is the group's, set on the broker:
        # 6 s, so host-cut-consumer's 16-22 s hold outlasts it (the default is 45 s).
        cluster = KafkaCluster(3, hosts=nodes, overrides=_CONSUMER_GROUP).start()
    except BaseException:
        network.stop()
        raise
    return HostSite(network, cluster)


def prepare_on(
    site: HostSite,
    work: Path,
    name: str,
    assignors: tuple[str, ...] = ("cooperative-sticky",),
    server_assignor: str | None = None,
    sections: dict[str, dict[str, Any]] | None = None,
) -> Setup:
    """A topic (4 partitions), a group and a table path, and the config both hosts run:
    the local engine, a 2 s session, small segments and batches, ``assignors``; with
    ``server_assignor``, the consumer protocol (KIP-848) with that assignor instead;
    entries of ``sections`` replace or add to those."""
    work = work / unique_name(name)
    work.mkdir(parents=True)
    topic, group = unique_name(f"t-{name}"), unique_name(f"g-{name}")
    bootstrap = site.cluster.bootstrap
    site.client.call(create_topic, bootstrap, topic, partitions=PARTITIONS)
    site.client.call(wait_for_leaders, bootstrap, topic)
    table = work / "table"
    base: dict[str, dict[str, Any]] = {
        "handoff": {"segment_max_bytes": "128KiB", "segment_max_age": "300ms"},
        "trigger": {"max_bytes": "1MiB", "max_age": "500ms", "shutdown_timeout": "60s"},
        "spark": {"master": "local[2]", "engine": "local"},
        "source": {"assignors": list(assignors)},
    }
    if server_assignor is not None:
        base["source"] = {"group_protocol": "consumer", "server_assignor": server_assignor}
    for section, entries in (sections or {}).items():
        base.setdefault(section, {}).update(entries)
    path = write_config(
        work / "run.toml", bootstrap=bootstrap, topic=topic, group=group, table=table,
        sections=base,
    )  # fmt: skip
    return Setup(topic, group, table, path, work, bootstrap)


def run_on(
    host: Host,
    setup: Setup,
    log: str,
    env: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> Run:
    """``ingest run [extra]`` in ``host``; the environment it needs is passed explicitly."""
    return Run(
        ["run", "-c", str(setup.path), *extra],
        setup.work / log,
        env={"PYTHONPATH": str(ROOT), **(env or {})},
        wrapper=host.argv([]),
    )


def assignment(run: Run) -> list[str]:
    """The partitions the run owns now, by its log."""
    owned: set[str] = set()
    for assigned, given, _, taken in _OWNERSHIP.findall(run.text()):
        if assigned:
            owned = {p for p in given.strip('"').split(",") if p}
        else:
            owned -= set(taken.strip('"').split(","))
    return sorted(owned)


def workers(run: Run) -> int:
    return sum(1 for p in run.tree() if p.name == WORKER_PROCESS_NAME)


def produce_on(site: HostSite, setup: Setup, count: int) -> None:
    site.client.call(produce_rounds, setup, count)


def verdict_on(site: HostSite, setup: Setup, *, complete: bool) -> Any:
    return site.client.call(check, setup, complete=complete)


class HostProducer:
    """Rounds of 2,000 records from the client host while the runs consume."""

    def __init__(self, site: HostSite, setup: Setup, rounds: int) -> None:
        self.errors: list[str] = []
        self._stop = threading.Event()

        def run() -> None:
            for _ in range(rounds):
                if self._stop.is_set():
                    return
                try:
                    produce_on(site, setup, 2_000)
                except Exception as exc:  # a failed round is not counted as produced
                    self.errors.append(str(exc)[:200])
                time.sleep(0.3)

        self._thread = threading.Thread(target=run, name="host-producer", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 120) -> None:
        self._stop.set()
        self._thread.join(timeout)

    def done(self) -> bool:
        return not self._thread.is_alive()


@dataclass
class Pair:
    """The two supervisor runs of a case; ``stop`` SIGTERMs both and collects exits."""

    runs: list[Run] = field(default_factory=list)

    def stop(self, outcome: Outcome) -> None:
        for run in self.runs:
            if run.process.poll() is None:
                run.process.send_signal(signal.SIGTERM)
        for run in self.runs:
            outcome.exit_codes.append(run.wait(120))

    def kill(self) -> None:
        for run in self.runs:
            run.kill()


def _start_pair(site: HostSite, setup: Setup, env_a: dict[str, str] | None = None) -> Pair:
    """A first, then B once A owns partitions; returns once both own some."""
    pair = Pair()
    try:
        a = run_on(site.supervisor("sup-a"), setup, "run-a.log", env_a)
        pair.runs.append(a)
        wait_until(lambda: len(assignment(a)) > 0, 90, "host A's first assignment")
        b = run_on(site.supervisor("sup-b"), setup, "run-b.log")
        pair.runs.append(b)
        wait_until(
            lambda: len(assignment(b)) > 0 and len(assignment(a)) < PARTITIONS,
            90,
            "hosts A and B sharing the partitions",
        )
    except BaseException:
        pair.kill()  # a case that cannot run leaves no supervisor behind
        raise
    return pair


def _land_all(setup: Setup, runs: list[Run], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while row_count(setup.table) < setup.produced:
        if time.monotonic() > deadline or all(r.process.poll() is not None for r in runs):
            return False
        time.sleep(0.3)
    return True


def two_hosts_share(site: HostSite, work: Path, seed: int) -> Outcome:
    """Two supervisor hosts in one group land one table: both own and land partitions,
    the table is exact."""
    name = "two-hosts"
    rng = random.Random(f"{name}:{seed}")
    began = time.monotonic()
    setup = prepare_on(site, work, name)
    outcome = Outcome(name, seed, "none (two hosts sharing the partitions)")
    pair = _start_pair(site, setup)
    try:
        for _ in range(rng.randint(4, 8)):
            produce_on(site, setup, 2_000)
        a, b = pair.runs
        if not _land_all(setup, pair.runs, 120):
            outcome.problems.append(f"the table held {row_count(setup.table)} of {setup.produced}")
        shares = {"A": assignment(a), "B": assignment(b)}
        outcome.notes.append(f"A owns {shares['A']}, B owns {shares['B']}")
        # A host logs batch_committed after its commit is in the table: counted only once
        # both have stopped (read at once, B's last and only batch was not yet logged).
        pair.stop(outcome)
        for label, run in (("A", a), ("B", b)):
            rows = sum(
                int(n) for n in re.findall(r"event=batch_committed .*?rows=(\d+)", run.text())
            )
            outcome.notes.append(f"{label} landed {rows} rows")
            if rows == 0 or not shares[label]:
                outcome.problems.append(f"host {label} landed nothing or owns nothing")
    finally:
        pair.kill()
    outcome.verdict = verdict_on(site, setup, complete=True)
    outcome.seconds = time.monotonic() - began
    return outcome


def _exited(pids: list[int]) -> bool:
    """Every one of ``pids`` has exited (gone, or a zombie)."""
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                if handle.read().rsplit(")", 1)[1].split()[0] != "Z":
                    return False
        except OSError:
            continue
    return True


def _after(run: Run, start: int) -> str:
    return run.text()[start:]


def host_cut(site: HostSite, work: Path, seed: int) -> Outcome:
    """Supervisor host A cut off (link down) past the session timeout while a batch is
    held (before its Delta commit, or after it with the OffsetCommit next); B takes its
    partitions; nothing lands twice, A commits no offsets in its old generation; exact."""
    return _host_cut(site, work, seed, "host-cut")


def host_cut_consumer(site: HostSite, work: Path, seed: int) -> Outcome:
    """host-cut with the consumer protocol (KIP-848): A's late OffsetCommit carries its old
    member epoch, which the coordinator fences; exact."""
    return _host_cut(site, work, seed, "host-cut-consumer")


def _host_cut(site: HostSite, work: Path, seed: int, name: str) -> Outcome:
    rng = random.Random(f"{name}:{seed}")
    began = time.monotonic()
    point = rng.choice(["before_delta_commit", "after_delta_commit"])
    nth = rng.randint(1, 2)
    stall = round(rng.uniform(16.0, 22.0), 1)
    delay = round(rng.uniform(0.0, 0.5), 3)
    # range (eager) hands A its old partitions back about half the time when it joins
    # again; cooperative-sticky leaves them with B.
    if name == "host-cut-consumer":
        assignor = rng.choice(["uniform", "range"])
        setup = prepare_on(site, work, name, server_assignor=assignor)
    else:
        assignor = rng.choice(["cooperative-sticky", "range"])
        setup = prepare_on(site, work, name, (assignor,))
    outcome = Outcome(
        name, seed, f"{assignor}: A held at {point} #{nth} for {stall}s, cut +{delay}s"
    )
    host_a = site.supervisor("sup-a")
    pair = _start_pair(site, setup, fault_point_env(point, nth, stall=stall))
    a, b = pair.runs
    producer = HostProducer(site, setup, rng.randint(8, 12))
    try:
        held = f"fault point {point} #{nth}: stall"
        wait_until(lambda: held in a.text() or a.process.poll() is not None, 90, "A's hold")
        if held not in a.text():
            raise CaseFailed(f"host A ended before its hold:\n{a.text()[-2000:]}")
        time.sleep(delay)
        owned = assignment(a)
        pids = [p.pid for p in a.tree() if p.name == WORKER_PROCESS_NAME]
        at_cut = (len(a.text()), len(b.text()))
        host_a.cut()
        cut_at = time.monotonic()
        seen: dict[str, float] = {}
        try:
            # While A is cut off: A sees its loss (at once, or when its held main loop
            # resumes), its workers exit, B takes every partition and lands what A held.
            deadline = cut_at + stall + 30
            while time.monotonic() < deadline:
                now = time.monotonic() - cut_at
                marks = {
                    "lost": "event=partitions_lost" in _after(a, at_cut[0]),
                    "taken": len(assignment(b)) == PARTITIONS,
                    "stopped": _exited(pids),
                    "landed": producer.done() and row_count(setup.table) >= setup.produced,
                    "held": now >= stall + 1.0,
                }
                for mark, value in marks.items():
                    if value and mark not in seen:
                        seen[mark] = now
                if "taken" in seen and ("landed" in seen or now > stall - 3):
                    break
                time.sleep(0.1)
        finally:
            host_a.restore()
            b_until_back = _after(b, at_cut[1])
        back = time.monotonic() - cut_at
        while time.monotonic() < cut_at + stall + 30 and len(seen) < 5:
            now = time.monotonic() - cut_at
            if "event=partitions_lost" in _after(a, at_cut[0]):
                seen.setdefault("lost", now)
            if _exited(pids):
                seen.setdefault("stopped", now)
            if producer.done() and row_count(setup.table) >= setup.produced:
                seen.setdefault("landed", now)
            if now >= stall + 1.0:
                seen.setdefault("held", now)
            time.sleep(0.1)
        outcome.notes.append(
            f"A owned {len(owned)} with {len(pids)} workers; after the cut (s): "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(seen.items(), key=lambda kv: kv[1]))
            + f", link back {back:.1f}"
        )
        for mark, what in (
            ("lost", "A never saw its partitions lost"),
            ("taken", "B never owned every partition while A was cut off"),
            ("stopped", f"A's workers {pids} did not all exit"),
        ):
            if mark not in seen:
                outcome.problems.append(what)
        if not _land_all(setup, pair.runs, 120):
            outcome.problems.append(f"the table held {row_count(setup.table)} of {setup.produced}")
        pair.stop(outcome)
        landed_first = seen.get("landed", 1e9) < seen.get("held", 1e9)
        _judge_cut(
            outcome, point, _after(a, at_cut[0]), _after(b, at_cut[1]), b_until_back, landed_first
        )
    finally:
        producer.stop()
        if host_a.is_cut():
            host_a.restore()
        pair.kill()
    if producer.errors:
        outcome.notes.append(f"producer errors: {producer.errors[:2]}")
    outcome.verdict = verdict_on(site, setup, complete=True)
    outcome.seconds = time.monotonic() - began
    return outcome


_REFILTERED = re.compile(r"re-filtered after a concurrent commit; (\d+) rows dropped")


def _commits(text: str) -> list[dict[str, int]]:
    """The offsets of every ``offsets_committed`` in ``text`` (``offsets="{\\"t-0\\": 5}"``)."""
    return [
        {name: int(offset) for name, offset in re.findall(r'\\"([^"\\]+)\\": (\d+)', line)}
        for line in re.findall(r"event=offsets_committed .*", text)
    ]


def _judge_cut(
    outcome: Outcome, point: str, a_text: str, b_text: str, b_cut: str, landed_first: bool
) -> None:
    """What A's and B's logs say after the cut: no commit of A's lands below what B
    committed while A was cut off (a commit from A's books of its old generation, sent
    in its new one), and when B had landed every record before A's hold ended, A's late
    Delta commit added no row (the txn filter refused it all)."""
    b_committed: dict[str, int] = {}
    for offsets in _commits(b_cut):
        for partition, offset in offsets.items():
            b_committed[partition] = max(offset, b_committed.get(partition, 0))
    for offsets in _commits(a_text):
        for partition, offset in offsets.items():
            if offset < b_committed.get(partition, 0):
                outcome.problems.append(
                    f"A committed {partition} at {offset} after the cut, below the "
                    f"{b_committed[partition]} B had committed while A was cut off"
                )
    failed = re.findall(r"event=commit_failed .*?error=(.{0,120})", a_text)
    outcome.notes.append(f"A's commit_failed after the cut: {failed or 0}")
    a_dropped = sum(int(n) for n in _REFILTERED.findall(a_text))
    b_dropped = sum(int(n) for n in _REFILTERED.findall(b_text))
    outcome.notes.append(f"refiltered rows: A {a_dropped}, B {b_dropped}")
    # Records B's batches took after the cut against the rows they added: the difference
    # is what the txn versions kept out (already in the table, landed by A).
    taken = sum(int(n) for n in re.findall(r"event=batch_started .*?records=(\d+)", b_text))
    added = sum(int(n) for n in re.findall(r"event=batch_committed .*?rows=(\d+)", b_text))
    outcome.notes.append(f"B after the cut: {taken} records in its batches, {added} rows added")
    if point == "before_delta_commit":
        late = re.search(r"event=batch_committed .*?rows=(\d+)", a_text)
        if late is None:
            outcome.problems.append("A's held batch never reported its commit")
        else:
            outcome.notes.append(f"A's late commit added {late.group(1)} rows")
            if landed_first and int(late.group(1)) > 0:
                outcome.problems.append(
                    f"A's late commit added {late.group(1)} rows after B had landed every record"
                )


HOST_CASES: dict[str, Callable[[HostSite, Path, int], Outcome]] = {
    "host-cut": host_cut,
    "host-cut-consumer": host_cut_consumer,
    "two-hosts": two_hosts_share,
}
