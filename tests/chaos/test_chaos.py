"""Fault injection over seeded runs (see tests/chaos/cases.py and docs/reliability.md).

``-m chaos`` runs every case over ``CHAOS_RUNS`` seeds (default 10); the default run
has a fixed-seed smoke subset (~75 s): the supervisor's SIGKILL between the Delta
commit and the offset commit, a read-only handoff directory, and a rival committing to
the same partitions between the run's reads and commits. Any
case is rerun alone with ``scripts/chaos <case> --seed N``.
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

    return ChaosEnv(tmp_path, broker, spark, s3)


def _check(env: ChaosEnv, case: str, seed: int) -> None:
    outcome = CASES[case](env, seed)
    print(outcome.line())
    assert outcome.exact, outcome.line()


@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.parametrize(
    ("case", "seed"),
    [("kill-between-commits", 2), ("handoff-unwritable", 2), ("rival-commits", 200)],
)
def test_smoke(env: ChaosEnv, case: str, seed: int) -> None:
    _check(env, case, seed)


@pytest.mark.chaos
@pytest.mark.spark
@pytest.mark.parametrize("seed", range(CHAOS_RUNS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_chaos(env: ChaosEnv, case: str, seed: int) -> None:
    _check(env, case, seed)
