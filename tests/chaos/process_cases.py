"""Faults of ingest's own processes: a worker, the supervisor, the Spark JVM, or the supervisor
between its two commits."""

from __future__ import annotations

import os
import random
import re
import signal
import time
from collections.abc import Mapping

from ingest.testing import unique_name
from ingest.testing.faults import ProcessInfo, fault_point_env, kill
from tests.chaos.pieces import (
    PARTITIONS,
    CaseFailed,
    ChaosEnv,
    Outcome,
    Producer,
    Run,
    Setup,
    continuous_until_landed,
    moment,
    orphans,
    prepare,
    produce_rounds,
    recover,
    settle,
    wait_moment,
)
from tests.runtime.support import row_count

BURST = 160_000  # 40k records (~4 MB) a partition: four times a worker's 1 MiB share
MIN_BACKLOG = 1_000  # records past the restart offset that the kill must leave behind


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


def _kill_case(env: ChaosEnv, name: str, seed: int, pick: str) -> Outcome:
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    # Without a transform, batches would run on the local engine, with no JVM to kill.
    sections = {"spark": {"engine": "spark"}} if pick == "jvm" else None
    setup = prepare(env, rng, name, sections=sections)
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
        stopped: list[ProcessInfo] = []
        if pick == "worker":
            # The victim is stopped (SIGSTOP) before the burst, so the burst is still to
            # fetch when it is killed: a restart at a wrong offset cannot go unseen. (Left
            # running, a worker fetched the burst as fast as it was produced once batches
            # landed without a JVM: 680 records were left at the kill once.)
            victims = [p for p in run.tree() if p.kind == "worker"]
            if not victims:
                raise CaseFailed("no live worker at the fault moment")
            stopped = [rng.choice(victims)]
            os.kill(stopped[0].pid, signal.SIGSTOP)
        if pick in ("worker", "supervisor"):
            # A burst larger than a worker's buffer share, then the kill: it comes with
            # records fetched and not landed, and more still to fetch, so a restart at a
            # wrong offset or an offset committed ahead of the table cannot go unseen.
            producer.stop()
            produce_rounds(setup, BURST)
        tree = run.tree()
        if pick == "worker":
            chosen = stopped
            log_ends = end_offsets(setup)
        elif pick in ("jvm", "task"):
            # Spark (or the local engine's pool) starts in the background on first need: at
            # an early moment it may still be launching, so the kill waits for it to be up.
            deadline = time.monotonic() + 60
            chosen = [p for p in tree if p.kind == pick]
            while not chosen and time.monotonic() < deadline and run.process.poll() is None:
                time.sleep(0.2)
                chosen = [p for p in run.tree() if p.kind == pick]
            if not chosen:
                raise CaseFailed(f"no {pick} process within 60 s of the fault moment")
            chosen = [rng.choice(chosen)]
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
        if pick in ("jvm", "task"):
            produce_rounds(setup, 2_000)  # so that a batch must meet the dead process
        continuous_until_landed(run, setup, outcome)
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
    if pick == "task":
        # The pool is broken only for the batch that meets it: retried on a new pool.
        failed = run.count("batch_failed")
        outcome.notes.append(f"batch_failed logged {failed}x")
        if not failed:
            outcome.problems.append("no batch met the broken pool (the kill went unseen)")
        if outcome.exit_codes and outcome.exit_codes[0] not in (0, None):
            outcome.problems.append(f"the run exited {outcome.exit_codes[0]} after a task died")
    if pick == "worker":
        crashed = run.count("worker_crashed")
        outcome.notes.append(f"worker_crashed logged {crashed}x")
        if not crashed:
            outcome.problems.append("the killed worker's crash was never seen")
        _check_backlog(run, chosen[0].pid, log_ends, outcome)
    settle(env, setup, outcome, survives=pick == "worker")
    outcome.seconds = time.monotonic() - started
    return outcome


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
    if backlog < MIN_BACKLOG:
        outcome.problems.append(
            f"the worker was killed with a backlog of {backlog} (< {MIN_BACKLOG}): a wrong "
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


def kill_task(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL a task process of the local engine (no JVM): the batch that meets the broken
    pool fails, is retried on a new pool, and the run ends exact without a rerun."""
    return _kill_case(env, "kill-task", seed, "task")


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
