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

from collections.abc import Callable

from tests.chaos.broker_cases import broker_kill, broker_pause
from tests.chaos.cluster_cases import leader_election, leader_kill, node_pause, partitions_added
from tests.chaos.coordinator_cases import coordinator_kill_commit, coordinator_kill_rebalance
from tests.chaos.handoff_cases import handoff_full, handoff_unwritable
from tests.chaos.pieces import ChaosEnv, Outcome
from tests.chaos.process_cases import (
    kill_between_commits,
    kill_spark,
    kill_supervisor,
    kill_task,
    kill_worker,
)
from tests.chaos.storage_cases import s3_outage
from tests.chaos.writer_cases import concurrent_writer, rival_commits

__all__ = ["CASES", "ChaosEnv", "Outcome"]

CASES: dict[str, Callable[..., Outcome]] = {  # (env, seed, **options)
    "kill-worker": kill_worker,
    "kill-supervisor": kill_supervisor,
    "kill-spark": kill_spark,
    "kill-task": kill_task,
    "kill-between-commits": kill_between_commits,
    "broker-kill": broker_kill,
    "broker-pause": broker_pause,
    "concurrent-writer": concurrent_writer,
    "rival-commits": rival_commits,
    "handoff-unwritable": handoff_unwritable,
    "handoff-full": handoff_full,
    "leader-kill": leader_kill,
    "node-pause": node_pause,
    "partitions-added": partitions_added,
    "coordinator-kill-rebalance": coordinator_kill_rebalance,
    "coordinator-kill-commit": coordinator_kill_commit,
    "leader-election": leader_election,
    "s3-outage": s3_outage,
}
