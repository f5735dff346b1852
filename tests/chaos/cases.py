"""Fault-injection cases: the real ``ingest`` CLI, a real fault at a seeded moment, then exactness.

Every case takes ``(seed, env)``, draws everything it varies (record counts, which
fault moment, which process, delays) from ``random.Random(f"{case}:{seed}")``, and:

1. makes a fresh topic (4 partitions), group and table, produces 16k-32k records;
2. runs ``ingest run`` (``--until-end`` or continuous) as a subprocess and injects its
   fault while it runs;
3. checks the partial state with ``verify_exact(require_complete=False)`` (no duplicates,
   nothing committed ahead of the table), then, if the run did not finish on its own,
   reruns ``--until-end`` until it exits 0 (at most ``_RERUNS`` times);
4. checks the end state with ``verify_exact``: every offset once, commits at the end.

The recovery reruns are ``group_run(until_end=True)`` in this process with a shared Spark
session (the same engine the CLI runs; a JVM per rerun would double each run's time).
Tests call the cases with fixed seeds; ``scripts/chaos`` reruns any of them by seed.
"""

from __future__ import annotations

import os
import random
import re
import signal
import stat
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
from ingest.testing.faults import ProcessInfo, fault_point_env, kill, process_tree
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
    _spark: Any = None
    _s3: S3Server | None = None

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
    table: Path
    path: Path
    work: Path
    bootstrap: str
    produced: int = 0

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
    table = work / "table"
    path = write_config(
        work / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=table,
        sections=base,
    )
    setup = Setup(topic, group, table, path, work, broker.bootstrap)
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


def check(setup: Setup, *, complete: bool) -> Verdict:
    return verify_exact(
        setup.bootstrap,
        setup.topic,
        setup.group,
        str(setup.table),
        dead_letter_uri=setup.dead_letters,
        require_complete=complete,
    )


def recover(env: ChaosEnv, setup: Setup, outcome: Outcome) -> None:
    """Partial check, then ``--until-end`` until it exits 0, then the full check."""
    from ingest.supervisor.group_run import group_run

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
        ended_well = outcome.exit_codes[-1] == 0 and row_count(setup.table) >= setup.produced
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


# -- the cases -----------------------------------------------------------------------------


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


def _kill_case(env: ChaosEnv, name: str, seed: int, pick: str) -> Outcome:
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    setup = prepare(env, rng, name)
    when = moment(rng)
    outcome = Outcome(name, seed, f"SIGKILL {pick} at {when[0]} #{when[1]} +{when[2]}s")
    # Continuous mode, with records arriving while it runs: workers stay alive.
    run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
    producer = None
    try:
        run.wait_for("partitions_assigned", 1, 60)
        producer = Producer(setup, rng.randint(3, 8))
        if not wait_moment(run, when):
            raise CaseFailed(f"the run ended before the fault moment {when}")
        if pick in ("worker", "supervisor"):
            # A burst larger than a worker's buffer share, then the kill: it comes with
            # records fetched and not landed, and more still to fetch, so a restart at a
            # wrong offset or an offset committed ahead of the table cannot go unseen.
            producer.stop()
            produce_rounds(setup, _BURST)
        tree = run.tree()
        if pick == "worker":
            victims = [p for p in tree if p.kind == "worker"]
            if not victims:
                raise CaseFailed("no live worker at the fault moment")
            chosen = [rng.choice(victims)]
            log_ends = end_offsets(setup)
        elif pick == "jvm":
            # Spark starts in the background on first need: at an early moment its JVM
            # may still be launching (spark-submit), so the kill waits for it to be up.
            deadline = time.monotonic() + 60
            chosen = [p for p in tree if p.kind == "jvm"]
            while not chosen and time.monotonic() < deadline and run.process.poll() is None:
                time.sleep(0.2)
                chosen = [p for p in run.tree() if p.kind == "jvm"]
            if not chosen:
                raise CaseFailed("no Spark JVM within 60 s of the fault moment")
        else:  # the supervisor with every process it started
            chosen = tree
        kill(chosen)
        outcome.notes.append(f"killed {[p.kind for p in chosen]}")
        if pick == "supervisor":
            landed = row_count(setup.table)
            outcome.notes.append(f"{landed} of {setup.produced} rows landed at the kill")
            if landed >= setup.produced:
                outcome.problems.append("the kill came after every record had landed")
        producer.stop()
        if pick == "jvm":
            produce_rounds(setup, 2_000)  # so that a batch must meet the dead JVM
        _continuous_until_landed(run, setup, outcome)
    finally:
        if producer is not None:
            producer.stop()
        run.kill()
    if pick == "supervisor":
        left = orphans([p.pid for p in chosen])
        if left:
            outcome.problems.append(f"processes outlived the kill: {left}")
    if pick == "jvm":
        _check_jvm_death_told(run, outcome)
    if pick == "worker":
        crashed = run.count("worker_crashed")
        outcome.notes.append(f"worker_crashed logged {crashed}x")
        if not crashed:
            outcome.problems.append("the killed worker's crash was never seen")
        _check_backlog(run, chosen[0].pid, log_ends, outcome)
    settle(env, setup, outcome, survives=pick == "worker")
    outcome.seconds = time.monotonic() - started
    return outcome


_BURST = 160_000  # 40k records (~4 MB) a partition: four times a worker's 1 MiB share
_MIN_BACKLOG = 1_000  # records past the restart offset that the kill must leave behind


def end_offsets(setup: Setup) -> dict[int, int]:
    """Each partition's log end offset (high watermark), read by a reference client."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": setup.bootstrap, "group.id": unique_name("hw")})
    try:
        return {
            p: consumer.get_watermark_offsets(TopicPartition(setup.topic, p), timeout=30)[1]
            for p in range(PARTITIONS)
        }
    finally:
        consumer.close()


def _check_backlog(run: Run, pid: int, log_ends: Mapping[int, int], outcome: Outcome) -> None:
    """The killed worker's partition (its ``worker_started`` pid) and the offset it was
    restarted from (``worker_crashed``): the kill must leave a backlog behind that offset,
    or a restart at a wrong position would meet the log end and go unseen."""
    text = run.text()
    started = re.search(rf"event=worker_started partition=\S+-(\d+) pid={pid} ", text)
    if started is None:
        outcome.problems.append(f"the killed pid {pid} is not in a worker_started line")
        return
    partition = int(started.group(1))
    crashed = re.search(rf"event=worker_crashed partition=\S+-{partition} offset=(\d+) ", text)
    if crashed is None:
        return  # already a problem: the crash was never seen
    backlog = log_ends[partition] - int(crashed.group(1))
    outcome.notes.append(
        f"partition {partition} killed at offset {crashed.group(1)}, log end "
        f"{log_ends[partition]}: backlog {backlog}"
    )
    if backlog < _MIN_BACKLOG:
        outcome.problems.append(
            f"the worker was killed with a backlog of {backlog} (< {_MIN_BACKLOG}): a wrong "
            "restart position would go unseen"
        )


def _check_jvm_death_told(run: Run, outcome: Outcome) -> None:
    """A batch after the JVM's death must end the run at once (exit 1) with the one-line
    error that names the dead JVM, not retries on it or a raw connection error."""
    said = [line for line in run.text().splitlines() if line.startswith("ingest: ")]
    last = said[-1] if said else "(none)"
    outcome.notes.append(f"error shown: {last[:200]}")
    if outcome.exit_codes[0] == 0:
        outcome.problems.append("the run ended exit 0: no batch met the dead JVM")
    elif outcome.exit_codes[0] != 1 or not last.startswith("ingest: the Spark JVM exited"):
        outcome.problems.append(
            f"exit {outcome.exit_codes[0]} without the clear error about the Spark JVM"
        )


def kill_worker(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL one partition worker: the supervisor restarts it and the run ends exact."""
    return _kill_case(env, "kill-worker", seed, "worker")


def kill_supervisor(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL the supervisor, its workers and its JVM at once; a rerun ends exact."""
    return _kill_case(env, "kill-supervisor", seed, "supervisor")


def kill_spark(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL the Spark JVM under the supervisor; it fails clearly, a rerun ends exact."""
    return _kill_case(env, "kill-spark", seed, "jvm")


def kill_between_commits(env: ChaosEnv, seed: int) -> Outcome:
    """The supervisor SIGKILLs itself right after a Delta commit (offsets not committed)
    or right after the offset commit (segments not released)."""
    name = "kill-between-commits"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    # 256 KiB batches: at least the 3 batches the n-th pass may need (with 2 MiB, 3 of
    # seeds 210-214 ended in fewer and never reached the point).
    setup = prepare(env, rng, name, sections={"trigger": {"max_bytes": "256KiB"}})
    point = rng.choice(["after_delta_commit", "after_delta_commit", "after_offset_commit"])
    nth = rng.randint(1, 3)
    outcome = Outcome(name, seed, f"self-SIGKILL at {point} #{nth}")
    run = Run(
        ["run", "-c", str(setup.path), "--until-end"],
        setup.work / "run.log",
        env=fault_point_env(point, nth),
    )
    try:
        run.wait_for("worker_started", 1, 90)
        tree = run.tree()
        outcome.exit_codes.append(run.wait(180))
    finally:
        run.kill()
    if outcome.exit_codes[-1] != -signal.SIGKILL:
        outcome.problems.append("the fault point was not reached (the run had fewer batches)")
    left = orphans([p.pid for p in tree if p.pid != run.pid])
    if left:
        outcome.problems.append(f"processes outlived the supervisor: {left}")
    recover(env, setup, outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


def _continuous_until_landed(
    run: Run, setup: Setup, outcome: Outcome, timeout: float = 120
) -> None:
    """Waits until the table holds every record, then SIGTERM (a graceful stop)."""
    deadline = time.monotonic() + timeout
    while row_count(setup.table) < setup.produced and run.process.poll() is None:
        if time.monotonic() > deadline:
            outcome.problems.append(
                f"the table held {row_count(setup.table)} of {setup.produced} after {timeout:g}s"
            )
            break
        time.sleep(0.3)
    if run.process.poll() is None:
        run.process.send_signal(signal.SIGTERM)
    outcome.exit_codes.append(run.wait(120))


def broker_pause(env: ChaosEnv, seed: int) -> Outcome:
    """SIGSTOP the broker for longer than the session timeout while ``ingest run`` runs,
    then SIGCONT: the member loses its partitions, rejoins, and the table ends exact."""
    name = "broker-pause"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    with KafkaCluster() as broker:
        setup = prepare(env, rng, name, broker=broker, total=(10_000, 20_000))
        when = first_batch_moment(moment(rng))
        pause = round(rng.uniform(SESSION_S + 1, SESSION_S + 5), 2)
        outcome = Outcome(name, seed, f"SIGSTOP broker {pause}s at {when[0]} #{when[1]}")
        run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
        try:
            if not wait_moment(run, when):
                raise CaseFailed("the run ended before the fault moment")
            broker.pause()
            time.sleep(pause)
            broker.resume()
            produce_rounds(setup, rng.randint(4_000, 8_000))
            _continuous_until_landed(run, setup, outcome)
        finally:
            broker.resume()
            run.kill()
        lost = run.count("partitions_lost")
        outcome.notes.append(
            f"partitions_lost {lost}x, assigned {run.count('partitions_assigned')}x, "
            f"commit_failed {run.count('commit_failed')}x"
        )
        if not lost:
            outcome.problems.append("the pause did not cost the member its partitions")
        settle(env, setup, outcome, survives=True)
    outcome.seconds = time.monotonic() - started
    return outcome


def broker_kill(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL the broker (its own JVM) while records are produced and ``ingest run``
    consumes; restart it on the same ports and data; the table ends exact."""
    name = "broker-kill"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    broker = KafkaCluster().start()
    try:
        setup = prepare(env, rng, name, broker=broker, total=(8_000, 16_000))
        when = first_batch_moment(moment(rng))
        outcome = Outcome(name, seed, f"SIGKILL broker at {when[0]} #{when[1]} +{when[2]}s")
        run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
        producer = None
        try:
            if not wait_moment(run, when):
                raise CaseFailed("the run ended before the fault moment")
            producer = Producer(
                setup,
                rng.randint(5, 10),
                enable_idempotence=True,
                retries=1_000_000,
                message_timeout_ms=120_000,
            )
            time.sleep(rng.uniform(0.0, 1.0))
            broker.restart(kill=True)
            producer.stop()
            # The topic may hold more than was counted (a retried round); land what it holds.
            setup.produced = check(setup, complete=False).expected
            _continuous_until_landed(run, setup, outcome, timeout=180)
        finally:
            if producer is not None:
                producer.stop()
            run.kill()
        errors = [] if producer is None else producer.errors
        if errors:
            outcome.notes.append(f"producer rounds failed: {errors[:2]}")
        outcome.notes.append(f"assigned {run.count('partitions_assigned')}x")
        settle(env, setup, outcome, survives=True)
    finally:
        broker.cleanup()
    outcome.seconds = time.monotonic() - started
    return outcome


def concurrent_writer(env: ChaosEnv, seed: int) -> Outcome:
    """``ingest replay --from earliest`` of the same group (so the same txn app ids) lands
    into the table while ``ingest run --until-end`` does: their Delta commits race."""
    name = "concurrent-writer"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    # Enough batches on both sides that the two writers meet at the same offsets: a
    # replay started after the run's first batch found the run done (no race in 10 runs).
    # Small batches, many commits on each side, the replay started with the run.
    setup = prepare(
        env, rng, name, total=(60_000, 90_000), sections={"trigger": {"max_bytes": "256KiB"}}
    )
    delay = round(rng.uniform(0.0, 0.5), 2)
    outcome = Outcome(name, seed, f"replay starts {delay}s after the run")
    run = Run(
        ["run", "-c", str(setup.path), "--until-end"],
        setup.work / "run.log",
    )
    replay = None
    try:
        time.sleep(delay)
        replay = Run(
            ["replay", "-c", str(setup.path), "--from", "earliest"], setup.work / "replay.log"
        )
        outcome.exit_codes.append(run.wait(240))
        outcome.exit_codes.append(replay.wait(240))
    finally:
        run.kill()
        if replay is not None:
            replay.kill()
    races = sum(
        len(re.findall(r"lost a race|re-filtered|redoing the batch", r.text()))
        for r in (run, replay)
        if r is not None
    )
    outcome.notes.append(f"commit races seen in the logs: {races}")
    if not races:
        outcome.problems.append("no commit race: the two writers never met")
    if outcome.exit_codes != [0, 0]:
        outcome.problems.append(
            f"a writer did not survive the races: exit codes {outcome.exit_codes}"
        )
    settle(env, setup, outcome, ended_well=outcome.exit_codes == [0, 0])
    outcome.seconds = time.monotonic() - started
    return outcome


class RivalCommitter:
    """Another writer of the run's partitions: at seeded random moments it commits to the
    table a txn action for one of them, at the version the table holds (no data), so the
    run's Delta commits keep meeting a commit that came in between. delta-rs refuses a
    commit that raced one touching the same app ids; the rival retries nothing."""

    def __init__(self, setup: Setup, rng: random.Random) -> None:
        self.setup = setup
        self.rng = random.Random(rng.random())
        self.commits = 0
        self.lost = 0
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-rival", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from deltalake import CommitProperties, DeltaTable, Transaction
        from deltalake.exceptions import CommitFailedError, TableNotFoundError

        from ingest.sink.txn import app_id

        uri = str(self.setup.table)
        while not self._stop.wait(self.rng.uniform(0.005, 0.05)):
            partition = self.rng.randrange(PARTITIONS)
            app = app_id(uri, self.setup.group, self.setup.topic, partition)
            try:
                table = DeltaTable(uri)
            except TableNotFoundError:
                continue
            version = table.transaction_version(app)
            if version is None:
                continue
            try:
                table.create_write_transaction(
                    [],
                    "append",
                    table.schema(),
                    commit_properties=CommitProperties(
                        app_transactions=[Transaction(app, version)], max_commit_retries=0
                    ),
                )
                self.commits += 1
            except CommitFailedError:
                self.lost += 1
            except Exception as exc:  # noted in the outcome; the verdict decides
                self.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


def rival_commits(env: ChaosEnv, seed: int) -> Outcome:
    """While ``ingest run --until-end`` lands batches, a rival commits txn actions for the
    same partitions every 5-50 ms: many of the run's Delta commits fail because a
    concurrent writer committed in between, and are redone; the table ends exact."""
    name = "rival-commits"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    # Small batches: many commits for the rival to come between.
    # (16k-32k records met no race in one warm run of 7.6 s: more batches, more chances.)
    setup = prepare(
        env, rng, name, total=(60_000, 90_000), sections={"trigger": {"max_bytes": "256KiB"}}
    )
    outcome = Outcome(name, seed, "txn commits of the same partitions every 5-50 ms")
    rival = RivalCommitter(setup, rng)
    run = Run(["run", "-c", str(setup.path), "--until-end"], setup.work / "run.log")
    try:
        outcome.exit_codes.append(run.wait(240))
    finally:
        run.kill()
        rival.stop()
    races = len(re.findall(r"lost a race", run.text()))
    outcome.notes.append(
        f"rival commits {rival.commits} (lost {rival.lost}); run commits that lost a race: {races}"
    )
    if rival.errors:
        outcome.notes.append(f"rival errors: {rival.errors[:2]}")
    if not races:
        outcome.problems.append("no commit of the run lost a race to the rival")
    if outcome.exit_codes != [0]:
        outcome.problems.append(
            f"the run did not survive the races: exit code {outcome.exit_codes}"
        )
    settle(env, setup, outcome, ended_well=outcome.exit_codes == [0])
    outcome.seconds = time.monotonic() - started
    return outcome


def _handoff_case(env: ChaosEnv, name: str, seed: int, kind: str) -> Outcome:
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    root = env.work / unique_name(f"{name}-handoff")
    root.mkdir(parents=True)
    setup = prepare(env, rng, name, sections={"handoff": {"mode": "files", "root": str(root)}})
    wrapper: list[str] | None = None
    preexec = None
    mid_run = rng.random() < 0.5
    if kind == "unwritable":
        if os.geteuid() == 0:
            # root ignores file modes; without these capabilities 0555 binds it too.
            wrapper = ["setpriv", "--bounding-set=-dac_override,-dac_read_search,-fowner", "--"]
        fault = f"handoff root made read-only {'mid-run' if mid_run else 'before the start'}"
        if not mid_run:
            root.chmod(0o555)
    else:
        # Below the case's 128 KiB segments, so every run meets the limit (256 KiB and
        # 1 MiB, drawn before, let 4 of 7 runs finish untouched: no fault at all).
        limit = rng.choice([16, 32, 64]) * 1024
        fault = f"RLIMIT_FSIZE {limit // 1024}KiB (EFBIG, as a full disk) on the run"
        mid_run = False

        def preexec() -> None:
            import resource

            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    outcome = Outcome(name, seed, fault)
    log = setup.work / "run.log"
    run = Run(["run", "-c", str(setup.path), "--until-end"], log, wrapper=wrapper, preexec=preexec)
    try:
        if mid_run:
            if run.wait_for("batch_committed", 1, 120):
                for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
                    directory.chmod(0o555)
            else:
                outcome.problems.append("the run ended before the mid-run fault")
        outcome.exit_codes.append(run.wait(240))
    finally:
        run.kill()
    text = run.text()
    message = [line for line in text.splitlines() if line.startswith("ingest: ")]
    outcome.notes.append(f"error shown: {message[-1][:300] if message else '(none)'}")
    if mid_run and outcome.exit_codes[-1] == 0:
        # The run had written its last segment before the fault (the first batch waits
        # for a starting Spark session, so a small topic is all fetched by then): no
        # error to show, and exit 0 must mean exact.
        outcome.problems.append("the run's writes were all done before the fault: none fired")
        _writable(root)
        outcome.verdict = check(setup, complete=True)
        outcome.seconds = time.monotonic() - started
        return outcome
    # Clear: the CLI's own one-line error is the last thing it printed (no traceback).
    clear = bool(message) and text.rstrip().splitlines()[-1].startswith("ingest: ")
    if not clear or outcome.exit_codes[-1] not in (1, 2):
        outcome.problems.append("UNEXPECTED exit code or no clear error for a broken handoff")
        outcome.verdict = None
        outcome.seconds = time.monotonic() - started
        return outcome
    _writable(root)
    recover(env, setup, outcome)
    outcome.seconds = time.monotonic() - started
    return outcome


def _writable(root: Path) -> None:
    for directory in [root, *(p for p in root.rglob("*") if p.is_dir())]:
        directory.chmod(stat.S_IRWXU | stat.S_IRWXG | stat.S_IRWXO)


def handoff_unwritable(env: ChaosEnv, seed: int) -> Outcome:
    """A read-only handoff directory (from the start or mid-run): a clear error, exit 1 or
    2, no corruption; a rerun with a writable one ends exact."""
    return _handoff_case(env, "handoff-unwritable", seed, "unwritable")


def handoff_full(env: ChaosEnv, seed: int) -> Outcome:
    """Files cannot grow past a small size (RLIMIT_FSIZE: writes fail with EFBIG, as on a
    full disk): a clear error, no corruption; a rerun without the limit ends exact."""
    return _handoff_case(env, "handoff-full", seed, "full")


CASES: dict[str, Callable[[ChaosEnv, int], Outcome]] = {
    "kill-worker": kill_worker,
    "kill-supervisor": kill_supervisor,
    "kill-spark": kill_spark,
    "kill-between-commits": kill_between_commits,
    "broker-kill": broker_kill,
    "broker-pause": broker_pause,
    "concurrent-writer": concurrent_writer,
    "rival-commits": rival_commits,
    "handoff-unwritable": handoff_unwritable,
    "handoff-full": handoff_full,
}
