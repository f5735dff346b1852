"""Fault points: the few moments of a run only the process itself can hit reliably.

``fault_point(name)`` is called at ``before_delta_commit`` (the batch's files are
written, the table commit is next), ``after_snapshot_load`` (one attempt of a table commit has
loaded the table and filtered its files by the txn versions there; a commit of another
writer that lands meanwhile makes the attempt lose its race), ``after_overwrite_cut`` (an overwrite's cut files
are rewritten without the replaced rows, its commit is next), ``after_delta_commit`` (the batch is durable in
Delta, its offsets are not committed yet), ``between_table_commits`` (a batch over
several ``{topic}`` tables: one table committed, the next not yet), ``after_offset_commit`` (committed,
segments not yet released) and ``in_spark_task`` (a Spark task of the arrow path has read
its segments and not yet written its files; on a cluster, armed through
``spark.executorEnv.INGEST_FAULT_POINT``: each Python worker counts its own passes). With ``INGEST_FAULT_POINT=<name>:<n>`` in the
environment the process SIGKILLs itself on the n-th pass; with
``<name>:<n>:stall=<seconds>`` that pass waits instead (a batch held in flight, for
tests of what a signal does meanwhile). Without it the call is one comparison. Used
by the chaos suite and the CLI tests (``ingest.testing.faults``); nothing is
simulated.
"""

from __future__ import annotations

import os
import signal
import time

__all__ = ["FAULT_POINTS", "FAULT_POINT_ENV", "fault_point", "fault_point_env"]

FAULT_POINT_ENV = "INGEST_FAULT_POINT"
FAULT_POINTS = (
    "before_delta_commit",
    "after_snapshot_load",
    "after_overwrite_cut",
    "after_delta_commit",
    "between_table_commits",
    "after_offset_commit",
    "in_spark_task",
)


def _parse(spec: str | None) -> tuple[str, int, float | None] | None:
    if not spec:
        return None
    name, _, rest = spec.partition(":")
    if name not in FAULT_POINTS:
        raise ValueError(f"{FAULT_POINT_ENV}: unknown point {name!r} (known: {FAULT_POINTS})")
    count, _, action = rest.partition(":")
    stall = None
    if action:
        if not action.startswith("stall="):
            raise ValueError(f"{FAULT_POINT_ENV}: unknown action {action!r} (known: stall=<s>)")
        stall = float(action.removeprefix("stall="))
    return name, int(count or 1), stall


_ARMED = _parse(os.environ.get(FAULT_POINT_ENV))
_passes: dict[str, int] = {}


def fault_point(name: str) -> None:
    """SIGKILLs this process on the n-th pass of ``name`` when armed (see module doc)."""
    if _ARMED is None or _ARMED[0] != name:
        return
    _passes[name] = _passes.get(name, 0) + 1
    stall = _ARMED[2]
    if stall is not None:
        if _passes[name] == _ARMED[1]:
            os.write(2, f"ingest: fault point {name} #{_passes[name]}: stall {stall}s\n".encode())
            time.sleep(stall)
        return
    if _passes[name] >= _ARMED[1]:
        os.write(2, f"ingest: fault point {name} #{_passes[name]}: SIGKILL\n".encode())
        os.kill(os.getpid(), signal.SIGKILL)


def fault_point_env(name: str, count: int, *, stall: float | None = None) -> dict[str, str]:
    """The environment entry arming ``name`` for its ``count``-th pass (a SIGKILL, or a
    wait of ``stall`` seconds)."""
    spec = f"{name}:{count}" + (f":stall={stall}" if stall is not None else "")
    _parse(spec)
    return {FAULT_POINT_ENV: spec}
