"""ingest.faults: the SIGKILL and stall fault points, in real processes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from ingest.faults import fault_point_env

PASSES = """
from ingest.faults import fault_point
for n in range(1, 4):
    fault_point("after_delta_commit")
    print("after pass", n, flush=True)
"""


def run(env: dict[str, str]) -> tuple[subprocess.CompletedProcess[str], float]:
    began = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", PASSES], env=env, capture_output=True, text=True, timeout=60
    )
    return done, time.monotonic() - began


def test_the_nth_pass_kills_the_process() -> None:
    done, _ = run(fault_point_env("after_delta_commit", 2))
    assert done.returncode == -signal.SIGKILL
    assert done.stdout.split("\n")[:-1] == ["after pass 1"]
    assert "fault point after_delta_commit #2: SIGKILL" in done.stderr


def test_a_stall_waits_once_and_the_process_goes_on() -> None:
    done, seconds = run(fault_point_env("after_delta_commit", 2, stall=1.0))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:-1] == [f"after pass {n}" for n in (1, 2, 3)]
    assert done.stderr.count("stall 1.0s") == 1
    assert seconds >= 1.0


@pytest.mark.parametrize("spec", ["nowhere:1", "after_delta_commit:1:explode", "x"])
def test_a_bad_spec_is_refused_at_start(spec: str) -> None:
    done, _ = run({"INGEST_FAULT_POINT": spec})
    assert done.returncode == 1
    assert "INGEST_FAULT_POINT" in done.stderr


def test_the_fault_tests_know_the_workers_by_their_process_name() -> None:
    from ingest.testing import faults
    from ingest.worker import process

    assert faults.WORKER_PROCESS_NAME == process.WORKER_PROCESS_NAME
