"""Fault injection over seeded runs (see tests/chaos/cases.py and docs/reliability.md).

``-m chaos`` runs every case over ``CHAOS_RUNS`` seeds (default 10). The default run
runs every case once (``SMOKE``), each with a seed whose fault fires: a case passes only
when the table is exact *and* the outcome has no problem (the fault fired, no process
outlived a kill, no rerun failed, the error was the clear one). Any case is rerun alone
with ``scripts/chaos <case> --seed N``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from ingest.testing import KafkaCluster, S3Server
from tests.chaos.cases import CASES, ChaosEnv

CHAOS_RUNS = int(os.environ.get("CHAOS_RUNS", "10"))


@pytest.fixture
def env(broker: KafkaCluster, request: pytest.FixtureRequest, tmp_path: Path) -> ChaosEnv:
    def spark() -> Any:
        return request.getfixturevalue("spark")

    def s3() -> S3Server:
        server: S3Server = request.getfixturevalue("s3")
        return server

    def cluster() -> KafkaCluster:
        three: KafkaCluster = request.getfixturevalue("kafka_cluster")
        return three

    return ChaosEnv(tmp_path, broker, spark, s3, cluster)


def _check(env: ChaosEnv, case: str, seed: int, **options: Any) -> None:
    outcome = CASES[case](env, seed, **options)
    print(outcome.line())
    assert outcome.passed, outcome.line()


# One seed per case whose fault fires (each seed's draws: tests/chaos/cases.py):
SMOKE = {
    "kill-worker": 200,
    "kill-supervisor": 200,
    "kill-spark": 202,  # batch_started #2: the JVM dies under a batch (200 and 201: at its start)
    "kill-task": 200,  # a local-engine task process, at worker_started #2
    "kill-between-commits": 0,  # after_delta_commit #1: the window between the two commits
    "broker-kill": 200,
    "broker-pause": 200,
    "concurrent-writer": 200,
    "rival-commits": 200,
    "handoff-unwritable": 2,  # read-only before the start (a mid-run draw may come late)
    "handoff-full": 200,
    "leader-kill": 200,
    "node-pause": 200,
    "partitions-added": 200,
    # joins: killed with the new member's JoinGroup open. Fails when the final SIGTERMs
    # meet one of the two graceful-stop bugs it found (docs/reliability.md), until fixed.
    "coordinator-kill-rebalance": 200,
    "coordinator-kill-commit": 200,  # late in the hold: the OffsetCommit meets the dead node
    "leader-election": 200,  # partition 1 back to its preferred leader, node 1
    "s3-outage": 2,  # down (refused connections) after the first batch
}
# The smoke's shorter faults (the chaos runs keep the case's own).
SMOKE_OPTIONS: dict[str, dict[str, Any]] = {"s3-outage": {"outage": 20.0}}


def test_the_smoke_covers_every_case() -> None:
    assert sorted(SMOKE) == sorted(CASES)


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(("case", "seed"), sorted(SMOKE.items()))
def test_smoke(env: ChaosEnv, case: str, seed: int) -> None:
    _check(env, case, seed, **SMOKE_OPTIONS.get(case, {}))


@pytest.mark.chaos
@pytest.mark.spark
@pytest.mark.parametrize("seed", range(CHAOS_RUNS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_chaos(env: ChaosEnv, case: str, seed: int) -> None:
    _check(env, case, seed)
