"""Faults of other writers of the table: a replay of the same partitions racing the run, and
a rival committing txn actions between the run's commits."""

from __future__ import annotations

import random
import re
import threading
import time

from ingest.testing.faults import fault_point_env
from tests.chaos.pieces import (
    PARTITIONS,
    ChaosEnv,
    Outcome,
    Run,
    Setup,
    prepare,
    settle,
)


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
    # The replay holds its first batch with files written for a while before its Delta
    # commit, so the run surely commits the same partitions meanwhile: on the local
    # engine a batch lasts ~50 ms, and in one CI run the two writers alternated for 20
    # batches without ever meeting (both exact, no race to show).
    hold = round(rng.uniform(0.3, 0.8), 2)
    # And the run holds one of its early commits long enough for the replay to start and
    # commit meanwhile: without it, a run that finished its small topic before the replay's
    # first batch met no rival (one CI run: "the two writers never met", seed 200).
    run_commit, run_hold = rng.randint(2, 4), round(rng.uniform(3.0, 4.0), 2)
    outcome = Outcome(
        name,
        seed,
        f"replay starts {delay}s after the run, holds its first commit {hold}s; the run "
        f"holds its commit {run_commit} {run_hold}s",
    )
    run = Run(
        ["run", "-c", str(setup.path), "--until-end"],
        setup.work / "run.log",
        env=fault_point_env("before_delta_commit", run_commit, stall=run_hold),
    )
    replay = None
    try:
        time.sleep(delay)
        replay = Run(
            ["replay", "-c", str(setup.path), "--from", "earliest"],
            setup.work / "replay.log",
            env=fault_point_env("before_delta_commit", 1, stall=hold),
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
    table a txn action for each of them, at the versions the table holds (no data), so
    the run's Delta commits keep meeting a commit of their app ids that came in between. delta-rs refuses a
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
        apps = [app_id(uri, self.setup.group, self.setup.topic, p) for p in range(PARTITIONS)]
        while not self._stop.wait(self.rng.uniform(0.005, 0.05)):
            try:
                table = DeltaTable(uri)
            except TableNotFoundError:
                continue
            versions = [(app, table.transaction_version(app)) for app in apps]
            held = [Transaction(app, v) for app, v in versions if v is not None]
            if not held:
                continue
            try:
                table.create_write_transaction(
                    [],
                    "append",
                    table.schema(),
                    commit_properties=CommitProperties(app_transactions=held, max_commit_retries=0),
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
    # One attempt of the run's table commits (the 4th: past the table's creation and
    # first batch) waits 1.5 s between loading the table and committing, so the rival
    # surely commits in between. Without it, since the snapshot is handed from batch to
    # batch (brought up to date in ms), a run of 82k records met no rival commit in that
    # window (CI, seed 200: rival 15 commits, 14 lost; the run 0 lost).
    run = Run(
        ["run", "-c", str(setup.path), "--until-end"],
        setup.work / "run.log",
        env=fault_point_env("after_snapshot_load", 4, stall=1.5),
    )
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
