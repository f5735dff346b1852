"""Faults of the object store: ``s3-outage``, S3 (SeaweedFS) unreachable for 30 s, then back.

The run keeps its segments (``handoff.mode = "files"``) and its table on S3, and records
keep coming. At a seeded moment after the first batch the store becomes unreachable, in
one of two ways drawn by the seed:

* ``down``: the server is stopped (SIGTERM) and started again 30 s later on the same
  ports and data: every request meets a refused connection;
* ``blackhole``: the server is frozen (SIGSTOP) for 30 s, then thawed (SIGCONT): requests
  are accepted by the kernel and never answered, so only the clients' timeouts end them.

The product promises to ride this out: the run must keep going (no rerun) and, after a
SIGTERM once every record landed, exit 0 with an exact table. The case also checks that
the outage hit the run: a batch failed, a worker failed, or a release was put off.

The default test run's smoke shortens the outage to 20 s. That still fails without the
time budgets: with ``trigger.retry_for`` and ``worker.retry_for`` at 0 (three attempts of
a batch, 2 s + 4 s apart, and five restarts of a worker), seed 2 ended in exit 1 after
13 s of failures (12 s outages were still ridden out by the counts alone).
"""

from __future__ import annotations

import random
import time

from ingest.testing import S3Server, unique_name
from tests.chaos.pieces import (
    CaseFailed,
    ChaosEnv,
    Outcome,
    Producer,
    Run,
    Setup,
    continuous_until_landed,
    landed,
    moment,
    prepare,
    settle,
    wait_moment,
)

OUTAGE_S = 30.0


def s3_outage(env: ChaosEnv, seed: int, *, outage: float = OUTAGE_S) -> Outcome:
    """S3 (segments and table) unreachable for 30 s mid-run (stopped, or frozen), then back:
    the run rides it out, exact."""
    name = "s3-outage"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    kind = rng.choice(["down", "blackhole"])
    s3 = S3Server().start()
    try:
        prefix = unique_name(name)
        options = s3.storage_options()
        sections = {
            "handoff": {"mode": "files", "root": f"s3://{s3.bucket}/{prefix}/handoff"},
            "table": {"uri": f"s3://{s3.bucket}/{prefix}/table", "storage_options": options},
            # The chaos default (4 MiB) would block the workers within the outage; S3 is
            # the store that is down, not the memory.
            "trigger": {"max_bytes": "2MiB", "max_age": "500ms", "shutdown_timeout": "90s"},
        }
        setup = prepare(env, rng, name, total=(8_000, 16_000), sections=sections)
        anchor, count, delay = moment(rng)
        when = (anchor, count if anchor == "worker_started" else 1, delay)
        outcome = Outcome(name, seed, f"S3 {kind} {outage:g}s at {when[0]} #{when[1]}")
        run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
        producer = None
        try:
            if not wait_moment(run, when):
                raise CaseFailed("the run ended before the fault moment")
            producer = Producer(setup, rng.randint(8, 14))
            time.sleep(rng.uniform(0.5, 2.0))  # records in flight when the store goes
            if kind == "down":
                s3.stop()
            else:
                s3.pause()
            time.sleep(outage)
            if kind == "down":
                s3.start()
                outcome.notes.append(f"table readable {_readable(setup):.1f}s after the restart")
            else:
                s3.resume()
            producer.stop()
            if producer.errors:
                outcome.notes.append(f"producer rounds failed: {producer.errors[:2]}")
            continuous_until_landed(run, setup, outcome, timeout=240)
        finally:
            if producer is not None:
                producer.stop()
            if not s3.running():
                s3.start()
            s3.resume()
            run.kill()
        felt = {
            event: run.count(event)
            for event in ("batch_failed", "worker_crashed", "release_deferred")
        }
        outcome.notes.append(", ".join(f"{k} {v}x" for k, v in felt.items()))
        if not any(felt.values()):
            outcome.problems.append("the outage did not reach the run (nothing failed or waited)")
        settle(env, setup, outcome, survives=True)
    finally:
        s3.cleanup()
    outcome.seconds = time.monotonic() - started
    return outcome


def _readable(setup: Setup, timeout: float = 60.0) -> float:
    """Seconds until the table reads again. SeaweedFS (``weed mini``) answers an existing
    object's GET with ``500 InternalError`` for a moment after a restart although its
    bucket already lists (seen once, reading ``_delta_log/...02.json`` at once): the
    case's own polls wait for it, so that only the product meets it."""
    began = time.monotonic()
    while True:
        try:
            landed(setup)
            return time.monotonic() - began
        except OSError:
            if time.monotonic() - began > timeout:
                raise
            time.sleep(0.2)
