"""What every fault case uses: the environment, the outcome, the setup of a topic, group and
table, the ``ingest`` subprocess, the checks and the recovery (see ``cases.py``)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ingest.testing import (
    KafkaCluster,
    ProducedRecord,
    S3Server,
    create_topic,
    produce,
    unique_name,
)
from ingest.testing.faults import ProcessInfo, process_tree
from ingest.testing.verify import Verdict, verify_exact
from tests.runtime.support import config, records, row_count, write_config

ROOT = Path(__file__).resolve().parents[2]
PARTITIONS = 4
SESSION_S = 2.0  # Tansu holds a JoinGroup max(1 s, session / 2): keep it short
_RERUNS = 3


class CaseFailed(AssertionError):
    """The case could not run as planned (not a verdict on the product)."""


@dataclass
class ChaosEnv:
    """Servers and Spark shared by the runs of one session; a case may start its own."""

    work: Path
    broker: KafkaCluster
    spark_factory: Callable[[], Any]
    s3_factory: Callable[[], S3Server]
    cluster_factory: Callable[[], KafkaCluster] | None = None  # three nodes
    _spark: Any = None
    _s3: S3Server | None = None
    _cluster: KafkaCluster | None = None

    @property
    def cluster(self) -> KafkaCluster:
        if self._cluster is None:
            if self.cluster_factory is None:
                raise CaseFailed("this environment has no 3-node cluster")
            self._cluster = self.cluster_factory()
        return self._cluster

    @property
    def spark(self) -> Any:
        if self._spark is None:
            self._spark = self.spark_factory()
        return self._spark

    @property
    def s3(self) -> S3Server:
        if self._s3 is None:
            self._s3 = self.s3_factory()
        return self._s3


@dataclass
class Outcome:
    case: str
    seed: int
    fault: str
    verdict: Verdict | None = None
    exit_codes: list[int | None] = field(default_factory=list)
    reruns: int = 0
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    # What makes the run fail although the table may be exact: the fault did not fire,
    # a process outlived a kill, a rerun failed, the error was not the clear one.
    problems: list[str] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        return self.verdict is not None and self.verdict.exact

    @property
    def passed(self) -> bool:
        return self.exact and not self.problems

    def line(self) -> str:
        verdict = "no verdict" if self.verdict is None else self.verdict.describe()
        notes = f" [{'; '.join(self.notes)}]" if self.notes else ""
        if self.problems:
            notes += f" PROBLEMS: [{'; '.join(self.problems)}]"
        return (
            f"{self.case} seed={self.seed}: {'exact' if self.exact else 'NOT EXACT'} | "
            f"fault: {self.fault} | exit codes {self.exit_codes}, reruns {self.reruns}, "
            f"{self.seconds:.1f}s | {verdict}{notes}"
        )


# -- the pieces every case uses ---------------------------------------------------------------


@dataclass
class Setup:
    topic: str
    group: str
    table: Path | str  # a local path, or a URI such as s3://bucket/table
    path: Path
    work: Path
    bootstrap: str
    produced: int = 0
    storage_options: dict[str, str] | None = None  # the table's, when it is not local

    @property
    def dead_letters(self) -> str:
        return str(self.table) + "_dead_letters"


def prepare(
    env: ChaosEnv,
    rng: random.Random,
    name: str,
    *,
    broker: KafkaCluster | None = None,
    total: tuple[int, int] = (16_000, 32_000),
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> Setup:
    broker = broker or env.broker
    work = env.work / unique_name(name)
    work.mkdir(parents=True)
    topic, group = unique_name(f"t-{name}"), unique_name(f"g-{name}")
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    # Small segments, batches and buffers: several batches per run, and backpressure keeps
    # the workers alive for most of it (so there is a worker to kill).
    base: dict[str, dict[str, Any]] = {
        "handoff": {
            "segment_max_bytes": "128KiB",
            "segment_max_age": "300ms",
            "max_buffered_bytes": "4MiB",
        },
        "trigger": {"max_bytes": "2MiB", "max_age": "500ms", "shutdown_timeout": "60s"},
        "worker": {"restart_backoff": "200ms"},
        "source": {"session_timeout": f"{SESSION_S:g}s"},
    }
    for section, entries in (sections or {}).items():
        base.setdefault(section, {}).update(entries)
    # ``sections`` may put the table elsewhere (``table.uri``, ``table.storage_options``).
    table_section = base.get("table", {})
    table: Path | str = table_section.get("uri", work / "table")
    path = write_config(
        work / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=work / "table",
        sections=base,
    )
    options = table_section.get("storage_options")
    setup = Setup(topic, group, table, path, work, broker.bootstrap, storage_options=options)
    produce_rounds(setup, rng.randint(*total))
    return setup


def produce_rounds(setup: Setup, count: int, **producer_conf: Any) -> None:
    """``count`` more records, spread over the partitions; values name (partition, n)."""
    start = setup.produced // PARTITIONS
    per = count // PARTITIONS

    def generate() -> Iterator[ProducedRecord]:
        for chunk in range(start, start + per, 2_000):
            for partition in range(PARTITIONS):
                yield from records(partition, chunk, min(2_000, start + per - chunk))

    produce(setup.bootstrap, setup.topic, generate(), compression="lz4", **producer_conf)
    setup.produced += per * PARTITIONS


class Run:
    """``ingest <args>`` as a subprocess, its log (stderr + stdout) in a file."""

    def __init__(
        self,
        args: list[str],
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        wrapper: list[str] | None = None,
        preexec: Callable[[], None] | None = None,
    ) -> None:
        self.log = log
        self._out = open(log, "w")  # noqa: SIM115 (closed in wait)
        # Through a pipe, copied here: a file limit put on the run (RLIMIT_FSIZE, the
        # "full disk" case) must not cut the run's own log and hide its last words.
        self.process = subprocess.Popen(
            [*(wrapper or []), sys.executable, "-m", "ingest.cli", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            preexec_fn=preexec,
        )
        self._log_lock = threading.Lock()
        self._copier = threading.Thread(target=self._copy, name="chaos-log", daemon=True)
        self._copier.start()

    def _copy(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        for chunk in iter(lambda: stream.read1(65536), b""):
            with self._log_lock:
                if self._out.closed:
                    return
                self._out.write(chunk.decode(errors="replace"))
                self._out.flush()

    def _close_log(self) -> None:
        # Orphaned children may hold the pipe a while after a kill: bounded wait.
        self._copier.join(15)
        with self._log_lock:
            self._out.close()

    @property
    def pid(self) -> int:
        return self.process.pid

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def count(self, event: str) -> int:
        return self.text().count(f"event={event} ")

    def wait_for(self, event: str, count: int, timeout: float) -> bool:
        """True once ``event`` was logged ``count`` times; False if the process ended first."""
        deadline = time.monotonic() + timeout
        while self.count(event) < count:
            if self.process.poll() is not None:
                return False
            if time.monotonic() > deadline:
                raise CaseFailed(f"no {event} x{count} within {timeout}s:\n{self.text()[-3000:]}")
            time.sleep(0.05)
        return True

    def tree(self) -> list[ProcessInfo]:
        return process_tree(self.pid)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired as exc:
            self.process.kill()
            self.process.wait(10)
            raise CaseFailed(
                f"ingest did not exit within {timeout}s:\n{self.text()[-3000:]}"
            ) from exc
        finally:
            self._close_log()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        self._close_log()


def wait_until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise CaseFailed(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def orphans(pids: list[int], timeout: float = 15.0) -> list[int]:
    """Which of ``pids`` are still alive after ``timeout`` (a killed run must leave none)."""
    deadline = time.monotonic() + timeout
    alive = pids
    while alive and time.monotonic() < deadline:
        time.sleep(0.2)
        alive = [p for p in alive if _alive(p)]
    return alive


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def landed(setup: Setup) -> int:
    """The rows in the setup's table now (0 before it exists)."""
    return row_count(setup.table, setup.storage_options)


def check(setup: Setup, *, complete: bool) -> Verdict:
    return verify_exact(
        setup.bootstrap,
        setup.topic,
        setup.group,
        str(setup.table),
        dead_letter_uri=setup.dead_letters,
        storage_options=setup.storage_options,
        require_complete=complete,
    )


def recover(env: ChaosEnv, setup: Setup, outcome: Outcome) -> None:
    """Partial check, then ``--until-end`` until it exits 0, then the full check."""
    from ingest.supervisor.modes.group_run import group_run

    partial = check(setup, complete=False)
    if not partial.exact:
        outcome.verdict = partial
        outcome.notes.append("the partial state after the fault was already wrong")
        return
    for _ in range(_RERUNS):
        outcome.reruns += 1
        result = group_run(config(setup.path), until_end=True, spark=env.spark).run()
        outcome.exit_codes.append(result.exit_code)
        if result.exit_code == 0:
            break
        outcome.problems.append(f"rerun failed: {result.message[:200]}")
    outcome.verdict = check(setup, complete=True)


def settle(
    env: ChaosEnv,
    setup: Setup,
    outcome: Outcome,
    *,
    ended_well: bool | None = None,
    survives: bool = False,
) -> None:
    """The full check if the run ended by itself with everything landed, else recover.
    By default the run ended well when its last exit was 0 and every record landed.
    ``survives``: the product promises to ride out this fault, so needing a rerun is a
    problem (the rerun still runs, to show the table can be repaired)."""
    if ended_well is None:
        ended_well = outcome.exit_codes[-1] == 0 and landed(setup) >= setup.produced
    if ended_well:
        outcome.verdict = check(setup, complete=True)
        return
    if survives:
        outcome.problems.append(
            f"the run did not ride out the fault (exit codes {outcome.exit_codes}): it needed a rerun"
        )
    recover(env, setup, outcome)


def moment(rng: random.Random) -> tuple[str, int, float]:
    """A fault moment: the n-th time the run logs an event, plus a delay."""
    anchor = rng.choice(["worker_started", "batch_started", "batch_committed"])
    count = rng.randint(1, PARTITIONS if anchor == "worker_started" else 2)
    return anchor, count, round(rng.uniform(0.0, 1.5), 3)


def first_batch_moment(when: tuple[str, int, float]) -> tuple[str, int, float]:
    """For cases that produce no more records before the fault: the first records may
    all land in one batch, so only the first batch is sure to come (broker-kill seed 105
    and broker-pause seed 101 waited 90 s for a second one)."""
    return when if when[0] == "worker_started" else (when[0], 1, when[2])


def wait_moment(run: Run, when: tuple[str, int, float], timeout: float = 90) -> bool:
    anchor, count, delay = when
    if not run.wait_for(anchor, count, timeout):
        return False
    time.sleep(delay)
    return run.process.poll() is None


class Producer:
    """Rounds of records while a continuous run consumes (``stop`` ends them)."""

    def __init__(self, setup: Setup, rounds: int, **producer_conf: Any) -> None:
        self.setup = setup
        self.rounds = rounds
        self.conf = producer_conf
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-producer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for _ in range(self.rounds):
            if self._stop.is_set():
                return
            try:
                produce_rounds(self.setup, 2_000, **self.conf)
            except Exception as exc:  # a failed round is not counted as produced
                self.errors.append(str(exc)[:200])
            time.sleep(0.3)

    def stop(self, timeout: float = 180) -> None:
        self._stop.set()
        self._thread.join(timeout)


def continuous_until_landed(run: Run, setup: Setup, outcome: Outcome, timeout: float = 120) -> None:
    """Waits until the table holds every record, then SIGTERM (a graceful stop)."""
    deadline = time.monotonic() + timeout
    while landed(setup) < setup.produced and run.process.poll() is None:
        if time.monotonic() > deadline:
            outcome.problems.append(
                f"the table held {landed(setup)} of {setup.produced} after {timeout:g}s"
            )
            break
        time.sleep(0.3)
    if run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)
    outcome.exit_codes.append(run.wait(120))
