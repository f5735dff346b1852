"""Faults of the broker: a single node killed and restarted, or paused past the session."""

from __future__ import annotations

import random
import time

from ingest.testing import (
    KafkaCluster,
)
from tests.chaos.pieces import (
    SESSION_S,
    CaseFailed,
    ChaosEnv,
    Outcome,
    Producer,
    Run,
    check,
    continuous_until_landed,
    first_batch_moment,
    moment,
    prepare,
    produce_rounds,
    settle,
    wait_moment,
)


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
            continuous_until_landed(run, setup, outcome)
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
            continuous_until_landed(run, setup, outcome, timeout=180)
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
