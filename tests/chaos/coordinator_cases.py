"""SIGKILL of the group coordinator, one node of the 3-node Apache Kafka cluster, at the two
moments of the group protocol that matter to a run:

* ``coordinator-kill-rebalance``: mid-rebalance. A second ``ingest run`` member joins the
  group, or leaves it (drawn); the coordinator is killed as soon as its own log shows the
  group preparing the rebalance (``Preparing to rebalance group ...``) and before it has
  the leader's assignment for the new generation (``Assignment received from leader ...``):
  JoinGroup or SyncGroup still open. The dead node's log proves it afterwards.
* ``coordinator-kill-commit``: mid-commit. The supervisor is held right after a Delta
  commit (``INGEST_FAULT_POINT=after_delta_commit:N:stall=S``), before it sends that
  batch's OffsetCommit; the coordinator is killed during the hold, early (the member's
  session ends within the hold: its partitions are lost, the OffsetCommit never sent) or
  late (the OffsetCommit goes to the dead coordinator), drawn. The table is then ahead of
  the group: the txn versions must win.

The killed node stays down 3-5 s (back before the controller fences it) or 10-14 s (past
Kafka's 9 s broker session: the group moves to another coordinator), drawn, then restarts.
Every run must ride the fault out (exit 0 after SIGTERM, no rerun) with an exact table.
"""

from __future__ import annotations

import random
import re
import signal
import time

from ingest.testing.apache_kafka import KafkaNode
from ingest.testing.faults import fault_point_env
from tests.chaos.cluster_cases import all_running, coordinator
from tests.chaos.pieces import (
    CaseFailed,
    ChaosEnv,
    Outcome,
    Producer,
    Run,
    Setup,
    check,
    moment,
    prepare,
    produce_rounds,
    settle,
    wait_moment,
)
from tests.runtime.support import row_count

# A longer heartbeat than the suite's 300 ms for the rebalance case: the group prepares
# the rebalance until the first member's next heartbeat tells it to rejoin, so the window
# to kill in is up to 1 s wide (a 3 s session keeps the heartbeat at a third of it).
REBALANCE_SOURCE = {"session_timeout": "3s", "heartbeat_interval": "1s"}


class NodeLog:
    """What a Kafka node logs from now on (its file is appended to across restarts)."""

    def __init__(self, node: KafkaNode) -> None:
        self.path = node.log_path
        self.start = self.path.stat().st_size

    def text(self) -> str:
        with open(self.path, "rb") as handle:
            handle.seek(self.start)
            return handle.read().decode(errors="replace")


def _assigned(text: str, group: str, generation: int) -> bool:
    """The coordinator had the leader's SyncGroup (the assignment) for ``generation``."""
    return (
        re.search(
            rf"Assignment received from leader \S+ for group {re.escape(group)} "
            rf"for generation {generation}\.",
            text,
        )
        is not None
    )


def _stabilized(text: str, group: str, generation: int) -> bool:
    """Every member's JoinGroup for ``generation`` was answered (SyncGroup next)."""
    return f"Stabilized group {group} generation {generation} " in text


def kill_mid_rebalance(node: KafkaNode, log: NodeLog, group: str, timeout: float) -> int:
    """SIGKILLs ``node`` as soon as its log shows ``group`` preparing a rebalance whose
    new generation has no assignment yet; returns the old generation. A round already
    complete when seen is passed over (a cooperative rebalance has a second round, after
    the revocation)."""
    preparing = re.compile(
        rf"Preparing to rebalance group {re.escape(group)} in state \S+ with old generation (\d+)"
    )
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = log.text()
        for found in preparing.finditer(text):
            generation = int(found.group(1))
            if not _assigned(text, group, generation + 1):
                node.kill()
                return generation
        time.sleep(0.005)
    seen = len(preparing.findall(text))
    raise CaseFailed(
        f"no open rebalance of {group} seen in {timeout:g}s ({seen} completed before seen)"
    )


def down_for(rng: random.Random) -> float:
    """How long the killed coordinator stays down: back before the controller fences it
    (Kafka's broker session is 9 s), or long enough for the group to move."""
    low, high = rng.choice([(3.0, 5.0), (10.0, 14.0)])
    return round(rng.uniform(low, high), 2)


def offsets_leader(setup: Setup) -> int:
    """The leader of the group's ``__consumer_offsets`` partition (Kafka's
    ``abs(groupId.hashCode()) % partitions``): its coordinator. From metadata, which live
    nodes answer while the coordinator is down (an admin DescribeConsumerGroups timing out
    then crashed librdkafka 2.16.0: ``rd_kafka_enq_once_del_source_return: Assertion
    `eonce->refcnt > 0' failed``)."""
    from confluent_kafka.admin import AdminClient

    topic = "__consumer_offsets"
    meta = AdminClient({"bootstrap.servers": setup.bootstrap}).list_topics(topic, timeout=10)
    partitions = meta.topics[topic].partitions
    code = 0
    for char in setup.group:  # Java's String.hashCode, as a signed 32-bit int
        code = (31 * code + ord(char)) & 0xFFFFFFFF
    code = code - (1 << 32) if code >= 1 << 31 else code
    return partitions[0 if code == -(1 << 31) else abs(code) % len(partitions)].leader


def the_coordinator(setup: Setup) -> int:
    """The group's coordinator, as the group and the metadata both say (they must agree,
    or ``offsets_leader`` cannot follow it while it is down)."""
    described, led = coordinator(setup), offsets_leader(setup)
    if described != led:
        raise CaseFailed(f"coordinator {described}, but {led} leads the group's offsets")
    return described


def stay_down(node: KafkaNode, setup: Setup, down: float, outcome: Outcome) -> None:
    """Keeps ``node`` down ``down`` seconds after its kill, noting whether the group found
    another coordinator meanwhile, then restarts it."""
    killed = time.monotonic()
    moved = None
    while time.monotonic() - killed < down:
        now = offsets_leader(setup) if moved is None else -1
        if now not in (-1, node.node_id):
            moved = (now, time.monotonic() - killed)
        time.sleep(0.5)
    node.start()
    if moved is None:
        outcome.notes.append(f"no other node led the group's offsets in the {down}s down")
    else:
        outcome.notes.append(
            f"node {moved[0]} led the group's offsets {moved[1]:.1f}s after the kill"
        )


def land_then_stop(runs: list[Run], setup: Setup, outcome: Outcome, timeout: float = 180) -> None:
    """Waits until the table holds every record, then SIGTERMs every run still alive."""
    deadline = time.monotonic() + timeout
    while row_count(setup.table) < setup.produced and any(r.process.poll() is None for r in runs):
        if time.monotonic() > deadline:
            outcome.problems.append(
                f"the table held {row_count(setup.table)} of {setup.produced} after {timeout:g}s"
            )
            break
        time.sleep(0.3)
    for run in runs:
        if run.process.poll() is None:
            run.process.send_signal(signal.SIGTERM)
    for run in runs:
        outcome.exit_codes.append(run.wait(120))


def _after_fault(setup: Setup, rng: random.Random, producer: Producer) -> None:
    """Records after the fault, on every partition; the expected content is what the
    topic holds (a produce retried across the fault may have landed twice)."""
    producer.stop()
    produce_rounds(setup, rng.randint(4_000, 8_000), retries=1_000_000)
    setup.produced = check(setup, complete=False).expected


def _counts(run: Run) -> str:
    return (
        f"assigned {run.count('partitions_assigned')}x, lost {run.count('partitions_lost')}x, "
        f"commit_failed {run.count('commit_failed')}x, repairs {run.count('commit_repair')}x"
    )


def coordinator_kill_rebalance(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL the group coordinator (3 nodes) while the group rebalances for a second
    ``ingest run`` member joining or leaving; restart it 3-14 s later; both runs ride it
    out and the table ends exact without a rerun."""
    name = "coordinator-kill-rebalance"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    cluster = env.cluster
    all_running(cluster)
    setup = prepare(env, rng, name, broker=cluster, sections={"source": REBALANCE_SOURCE})
    trigger = rng.choice(["joins", "leaves"])
    when = moment(rng)
    down = down_for(rng)
    outcome = Outcome(name, seed, f"a second member {trigger}")
    first = Run(["run", "-c", str(setup.path)], setup.work / "run-1.log")
    runs = [first]
    producer = None
    try:
        first.wait_for("partitions_assigned", 1, 90)
        producer = Producer(
            setup, rng.randint(5, 10), retries=1_000_000, message_timeout_ms=120_000
        )
        if trigger == "leaves":
            second = Run(["run", "-c", str(setup.path)], setup.work / "run-2.log")
            runs.append(second)
            _wait_owns_some(second, 90)
            # Its own moment: it starts 2 workers, and its first batch may be its only one.
            timed = second
            when = (when[0], min(when[1], 2) if when[0] == "worker_started" else 1, when[2])
        else:
            timed = first
        if not wait_moment(timed, when):
            raise CaseFailed(f"the run ended before the fault moment {when}")
        outcome.fault += f" at {when[0]} #{when[1]} +{when[2]}s: "
        maintainer = the_coordinator(setup)
        node = cluster.node(maintainer)
        log = NodeLog(node)
        if trigger == "joins":
            runs.append(Run(["run", "-c", str(setup.path)], setup.work / "run-2.log"))
        else:
            runs[1].process.send_signal(signal.SIGTERM)
        old = kill_mid_rebalance(node, log, setup.group, timeout=90)
        _judge_rebalance_kill(log.text(), setup.group, old, maintainer, outcome)
        stay_down(node, setup, down, outcome)
        _after_fault(setup, rng, producer)
        land_then_stop(runs, setup, outcome)
    finally:
        if producer is not None:
            producer.stop()
        for run in runs:
            run.kill()
        all_running(cluster)
    outcome.notes.append("; ".join(f"member {i + 1}: {_counts(r)}" for i, r in enumerate(runs)))
    if producer is not None and producer.errors:
        outcome.notes.append(f"producer rounds failed: {producer.errors[:2]}")
    ended_well = (
        all(c == 0 for c in outcome.exit_codes) and row_count(setup.table) >= setup.produced
    )
    settle(env, setup, outcome, ended_well=ended_well, survives=True)
    outcome.seconds = time.monotonic() - started
    return outcome


def _wait_owns_some(run: Run, timeout: float) -> None:
    """Until ``run`` holds partitions (the cooperative rebalance's second round is done)."""
    deadline = time.monotonic() + timeout
    while re.search(r'event=partitions_assigned \S+ \S+ assignment=[^"\s]', run.text()) is None:
        if run.process.poll() is not None or time.monotonic() > deadline:
            raise CaseFailed(f"the second member got no partition:\n{run.text()[-3000:]}")
        time.sleep(0.1)


def _judge_rebalance_kill(
    text: str, group: str, old: int, maintainer: int, outcome: Outcome
) -> None:
    """From the dead coordinator's whole log: was the rebalance really open at the kill?"""
    new = old + 1
    if _assigned(text, group, new):
        outcome.problems.append(
            f"the coordinator had generation {new}'s assignment before it died: no rebalance "
            "was open at the kill"
        )
        stage = "after SyncGroup"
    elif _stabilized(text, group, new):
        stage = "CompletingRebalance: JoinGroups answered, SyncGroup open"
    else:
        stage = "PreparingRebalance: the join phase open"
    outcome.fault += f"SIGKILL coordinator {maintainer} in generation {old} -> {new} ({stage})"


def coordinator_kill_commit(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL the group coordinator (3 nodes) after a Delta commit, before its
    OffsetCommit goes out (the supervisor held at ``after_delta_commit``); restart it
    3-14 s later; the run rides it out and the table ends exact without a rerun."""
    name = "coordinator-kill-commit"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    cluster = env.cluster
    all_running(cluster)
    setup = prepare(env, rng, name, broker=cluster)
    nth = rng.randint(1, 3)
    hold = round(rng.uniform(4.0, 6.0), 2)
    # Early in the hold, the member's session (2 s; it heartbeats from its own thread
    # meanwhile) ends before the hold does: the partitions are lost and the OffsetCommit
    # is never sent. Late in it, the OffsetCommit goes out to the dead coordinator.
    early = rng.random() < 0.5
    delay = round(rng.uniform(0.0, 1.0) if early else hold - rng.uniform(0.3, 0.8), 3)
    down = down_for(rng)
    outcome = Outcome(
        name, seed, f"held {hold}s after Delta commit #{nth}, {'early' if early else 'late'}: "
    )
    run = Run(
        ["run", "-c", str(setup.path)],
        setup.work / "run.log",
        env=fault_point_env("after_delta_commit", nth, stall=hold),
    )
    producer = None
    try:
        run.wait_for("partitions_assigned", 1, 90)
        # Rounds until the hold (not a drawn few): the n-th batch needs records to come
        # (seed 202 waited for a third batch after 6 rounds had all landed in two).
        producer = Producer(setup, 500, retries=1_000_000, message_timeout_ms=120_000)
        held = _wait_held(run, nth, 120)
        producer.stop(timeout=0)  # no more rounds; the one under way ends by itself
        maintainer = the_coordinator(setup)
        node = cluster.node(maintainer)
        time.sleep(max(0.0, held + delay - time.monotonic()))  # a drawn moment of the hold
        node.kill()
        into = time.monotonic() - held
        outcome.fault += f"SIGKILL coordinator {maintainer} {into:.2f}s into the hold, down {down}s"
        if into > hold - 0.15:
            outcome.problems.append(f"the kill came {into:.2f}s into a {hold}s hold: maybe after")
        _check_table_ahead(setup, run, outcome)
        stay_down(node, setup, down, outcome)
        _after_fault(setup, rng, producer)
        land_then_stop([run], setup, outcome)
    finally:
        if producer is not None:
            producer.stop()
        run.kill()
        all_running(cluster)
    outcome.notes.append(_counts(run))
    after_hold = run.text().split(f"fault point after_delta_commit #{nth}: stall", 1)[-1]
    if not early and "event=commit_failed " not in after_hold:
        outcome.problems.append("the held batch's OffsetCommit never met the dead coordinator")
    if producer is not None and producer.errors:
        outcome.notes.append(f"producer rounds failed: {producer.errors[:2]}")
    settle(env, setup, outcome, survives=True)
    outcome.seconds = time.monotonic() - started
    return outcome


def _wait_held(run: Run, nth: int, timeout: float) -> float:
    """When the supervisor said it is held after its ``nth`` Delta commit."""
    line = f"fault point after_delta_commit #{nth}: stall"
    deadline = time.monotonic() + timeout
    while line not in run.text():
        if run.process.poll() is not None or time.monotonic() > deadline:
            raise CaseFailed(f"the run was never held after Delta commit #{nth}")
        time.sleep(0.02)
    return time.monotonic()


def _check_table_ahead(setup: Setup, run: Run, outcome: Outcome) -> None:
    """The held batch is in the table at the kill (the version its batch_committed line
    names): the kill leaves the table ahead of the group."""
    from deltalake import DeltaTable

    found = re.findall(r"event=batch_committed batch=\d+ table_version=(\d+)", run.text())
    on_disk = DeltaTable(str(setup.table)).version()
    if not found or on_disk < int(found[-1]):
        outcome.problems.append(f"the held batch is not in the table (version {on_disk})")
        return
    outcome.notes.append(f"held after table version {found[-1]}")
