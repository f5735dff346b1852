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

SUPERVISORS = ("sup-a", "sup-b")
HOST_NAMES = ("kafka-1", "kafka-2", "kafka-3", "client", *SUPERVISORS)
_ASSIGNED = re.compile(r"event=partitions_assigned .*?assignment=(\S*)")


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
        cluster = KafkaCluster(3, hosts=nodes).start()
    except BaseException:
        network.stop()
        raise
    return HostSite(network, cluster)


def prepare_on(site: HostSite, work: Path, name: str) -> Setup:
    """A topic (4 partitions), a group and a table path, and the config both hosts run:
    the local engine, a 2 s session, small segments and batches."""
    work = work / unique_name(name)
    work.mkdir(parents=True)
    topic, group = unique_name(f"t-{name}"), unique_name(f"g-{name}")
    bootstrap = site.cluster.bootstrap
    site.client.call(create_topic, bootstrap, topic, partitions=PARTITIONS)
    site.client.call(wait_for_leaders, bootstrap, topic)
    table = work / "table"
    sections: dict[str, dict[str, Any]] = {
        "handoff": {"segment_max_bytes": "128KiB", "segment_max_age": "300ms"},
        "trigger": {"max_bytes": "1MiB", "max_age": "500ms", "shutdown_timeout": "60s"},
        "spark": {"master": "local[2]", "engine": "local"},
    }
    path = write_config(
        work / "run.toml", bootstrap=bootstrap, topic=topic, group=group, table=table,
        sections=sections,
    )  # fmt: skip
    return Setup(topic, group, table, path, work, bootstrap)


def run_on(host: Host, setup: Setup, log: str, env: dict[str, str] | None = None) -> Run:
    """``ingest run`` in ``host``; the environment it needs is passed explicitly."""
    return Run(
        ["run", "-c", str(setup.path)],
        setup.work / log,
        env={"PYTHONPATH": str(ROOT), **(env or {})},
        wrapper=host.argv([]),
    )


def assignment(run: Run) -> list[str]:
    """The partitions of the run's latest assignment."""
    found = _ASSIGNED.findall(run.text())
    return [p for p in found[-1].split(",") if p] if found else []


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
        for label, run in (("A", a), ("B", b)):
            rows = sum(
                int(n) for n in re.findall(r"event=batch_committed .*?rows=(\d+)", run.text())
            )
            outcome.notes.append(f"{label} landed {rows} rows")
            if rows == 0 or not shares[label]:
                outcome.problems.append(f"host {label} landed nothing or owns nothing")
        pair.stop(outcome)
    finally:
        pair.kill()
    outcome.verdict = verdict_on(site, setup, complete=True)
    outcome.seconds = time.monotonic() - began
    return outcome


def _wait(outcome: Outcome, condition: Callable[[], bool], timeout: float, what: str) -> bool:
    try:
        wait_until(condition, timeout, what)
    except CaseFailed as exc:
        outcome.problems.append(str(exc))
        return False
    return True


def host_cut(site: HostSite, work: Path, seed: int) -> Outcome:
    """Supervisor host A cut off (link down) past the session timeout while its batch is
    held before the Delta commit; B takes its partitions; A's late commit lands nothing
    twice and its late offsets are fenced; exact."""
    name = "host-cut"
    rng = random.Random(f"{name}:{seed}")
    began = time.monotonic()
    nth = rng.randint(1, 2)
    stall = round(rng.uniform(22.0, 28.0), 1)
    delay = round(rng.uniform(0.0, 0.5), 3)
    setup = prepare_on(site, work, name)
    outcome = Outcome(
        name, seed, f"A held at before_delta_commit #{nth} for {stall}s, cut +{delay}s"
    )
    host_a = site.supervisor("sup-a")
    env_a = fault_point_env("before_delta_commit", nth, stall=stall)
    pair = _start_pair(site, setup, env_a)
    a, b = pair.runs
    producer = HostProducer(site, setup, rng.randint(8, 12))
    try:
        held = f"fault point before_delta_commit #{nth}: stall"
        wait_until(lambda: held in a.text() or a.process.poll() is not None, 90, "A's hold")
        if held not in a.text():
            raise CaseFailed(f"host A ended before its hold:\n{a.text()[-2000:]}")
        time.sleep(delay)
        owned = assignment(a)
        lost_before = a.count("partitions_lost")
        a_text_at_cut = len(a.text())
        host_a.cut()
        cut_at = time.monotonic()
        try:
            _wait(outcome, lambda: a.count("partitions_lost") > lost_before, 30, "A's loss")
            _wait(outcome, lambda: len(assignment(b)) == PARTITIONS, 60, "B owning every partition")
            _wait(outcome, lambda: workers(a) == 0, 30, "A's workers to stop")
            outcome.notes.append(
                f"A owned {owned}; B owned all {PARTITIONS} {time.monotonic() - cut_at:.1f}s "
                f"after the cut; A's workers {workers(a)}"
            )
            # B lands what A held while A stays cut, as long as A's hold allows.
            wait_until(producer.done, 120, "the producer's rounds")
            budget = stall - (time.monotonic() - cut_at) - 3.0
            landed = _land_all(setup, [b], max(budget, 0.0))
            outcome.notes.append(
                f"B {'had' if landed else 'had not'} landed all {setup.produced} records "
                f"{time.monotonic() - cut_at:.1f}s after the cut"
            )
        finally:
            host_a.restore()
        outcome.notes.append(f"link restored {time.monotonic() - cut_at:.1f}s after the cut")
        # A's hold ends; its late commit is refiltered against B's txn versions.
        late = re.compile(r"re-filtered after a concurrent commit; (\d+) rows dropped")
        after = lambda: a.text()[a_text_at_cut:]  # noqa: E731
        _wait(
            outcome,
            lambda: "event=batch_committed" in after() or "batch_failed" in after(),
            stall + 30,
            "A's held batch to end",
        )
        dropped = [int(n) for n in late.findall(after())]
        outcome.notes.append(f"A's late commit dropped {sum(dropped)} rows (refilters {dropped})")
        fenced = re.findall(r"event=commit_failed .*", after())
        outcome.notes.append(f"A's commit_failed after the cut: {len(fenced)}")
        if not _land_all(setup, pair.runs, 120):
            outcome.problems.append(f"the table held {row_count(setup.table)} of {setup.produced}")
        pair.stop(outcome)
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
