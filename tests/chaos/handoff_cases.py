"""Faults of the handoff: a directory made read-only, a file size limit (EFBIG)."""

from __future__ import annotations

import os
import random
import stat
import time
from pathlib import Path

from ingest.testing import (
    unique_name,
)
from tests.chaos.pieces import (
    ChaosEnv,
    Outcome,
    Run,
    check,
    prepare,
    recover,
)


def _handoff_case(env: ChaosEnv, name: str, seed: int, kind: str) -> Outcome:
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    root = env.work / unique_name(f"{name}-handoff")
    root.mkdir(parents=True)
    # Unwritable mid-run: four times the 4 MiB buffer cap, so that the workers still have
    # segments to write after the first batch (16k-32k records were all written by then:
    # seed 5 met no fault).
    total = (160_000, 200_000) if kind == "unwritable" else (16_000, 32_000)
    setup = prepare(
        env, rng, name, total=total, sections={"handoff": {"mode": "files", "root": str(root)}}
    )
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
