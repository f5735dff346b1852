"""Faults of one node of a 3-node Apache Kafka cluster (replication factor 3,
``min.insync.replicas=2``) while ``ingest run`` consumes and records keep coming:

* ``leader-kill``: SIGKILL a node leading a partition being fetched but not coordinating the
  group, restart it 10-14 s later (past Kafka's 9 s broker session, so its leaderships
  move meanwhile): the running fetcher must follow the new leader;
* ``node-pause``: SIGSTOP a node (the group coordinator or a partition leader, drawn) for
  longer than the session timeout, then SIGCONT;
* ``partitions-added``: two partitions added to the topic mid-run (CreatePartitions);
* ``leader-election``: a preferred-leader election (ElectLeaders) mid-run, after a node
  preferred to lead was killed or paused until others led its partitions, and is back in
  sync: leadership moves back under the running fetchers.

The run must ride the fault out (exit 0 after SIGTERM, no rerun) with an exact table; the
fault must hit a node that mattered (it led a partition or coordinated the group). Every
node is running again when a case ends, so the cluster serves the next case.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from ingest.testing import KafkaCluster, produce
from tests.chaos.pieces import (
    PARTITIONS,
    SESSION_S,
    CaseFailed,
    ChaosEnv,
    Outcome,
    Producer,
    Run,
    Setup,
    check,
    continuous_until_landed,
    first_batch_moment,
    moment,
    prepare,
    produce_rounds,
    settle,
    wait_moment,
    wait_until,
)
from tests.runtime.support import records


def leaders(setup: Setup) -> dict[int, int]:
    """partition -> the node id leading it now (-1: none), from a reference client."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": setup.bootstrap}).list_topics(setup.topic, timeout=10)
    return {p: info.leader for p, info in meta.topics[setup.topic].partitions.items()}


def coordinator(setup: Setup) -> int:
    """The node id coordinating the case's group, from a reference client."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": setup.bootstrap})
    future = admin.describe_consumer_groups([setup.group])[setup.group]
    return int(future.result(timeout=30).coordinator.id)


def all_running(cluster: KafkaCluster) -> None:
    for node in cluster.nodes:
        if node.running():
            node.resume()
        else:
            node.start()


def _node_case(
    env: ChaosEnv,
    name: str,
    seed: int,
    fault: Callable[[random.Random, KafkaCluster, Setup, Outcome], None],
) -> Outcome:
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    cluster = env.cluster
    all_running(cluster)
    setup = prepare(env, rng, name, broker=cluster, total=(16_000, 32_000))
    when = moment(rng)
    outcome = Outcome(name, seed, f"at {when[0]} #{when[1]} +{when[2]}s: ")
    run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
    producer = None
    try:
        run.wait_for("partitions_assigned", 1, 90)
        producer = Producer(
            setup, rng.randint(5, 10), retries=1_000_000, message_timeout_ms=120_000
        )
        if not wait_moment(run, when):
            raise CaseFailed(f"the run ended before the fault moment {when}")
        fault(rng, cluster, setup, outcome)
        producer.stop()
        # Records after the fault, on every partition: a fetcher stuck on the old leader
        # (or a partition nobody fetches) leaves the table short of them.
        produce_rounds(setup, rng.randint(4_000, 8_000), retries=1_000_000)
        # A round retried across the fault may have landed twice: land what the topic holds.
        setup.produced = check(setup, complete=False).expected
        continuous_until_landed(run, setup, outcome, timeout=180)
    finally:
        if producer is not None:
            producer.stop()
        run.kill()
        all_running(cluster)
    if producer is not None and producer.errors:
        outcome.notes.append(f"producer rounds failed: {producer.errors[:2]}")
    outcome.notes.append(
        f"assigned {run.count('partitions_assigned')}x, lost {run.count('partitions_lost')}x, "
        f"commit_failed {run.count('commit_failed')}x"
    )
    settle(env, setup, outcome, survives=True)
    outcome.seconds = time.monotonic() - started
    return outcome


def _kill_leader(rng: random.Random, cluster: KafkaCluster, setup: Setup, out: Outcome) -> None:
    # A leader that does not coordinate the group: the member keeps its partitions (a dead
    # coordinator would cost them, and new workers would start with fresh metadata), so
    # the running fetcher itself must find the new leader.
    led = leaders(setup)
    maintainer = coordinator(setup)
    choices = sorted(p for p, node in led.items() if node not in (maintainer, -1))
    if not choices:
        raise CaseFailed(f"every partition is led by the coordinator {maintainer}: {led}")
    partition = rng.choice(choices)
    node_id = led[partition]
    # Longer than Kafka's broker session (broker.session.timeout.ms, 9 s by default): the
    # controller fences the dead node and moves its leaderships while it is down.
    down = round(rng.uniform(10.0, 14.0), 2)
    node = cluster.node(node_id)
    killed = time.monotonic()
    node.kill()
    out.fault += (
        f"SIGKILL node {node_id} (leader of partition {partition}; coordinator {maintainer}) "
        f"for {down}s"
    )
    moved = None
    while time.monotonic() - killed < down:
        if moved is None and leaders(setup)[partition] not in (node_id, -1):
            moved = time.monotonic() - killed
        time.sleep(0.5)
    node.start()
    if moved is None:
        out.problems.append(f"partition {partition} found no new leader while {node_id} was down")
    else:
        out.notes.append(f"partition {partition} had a new leader {moved:.1f}s after the kill")


def _pause_node(rng: random.Random, cluster: KafkaCluster, setup: Setup, out: Outcome) -> None:
    target = rng.choice(["coordinator", "leader"])
    node_id = coordinator(setup) if target == "coordinator" else leaders(setup)[0]
    pause = round(rng.uniform(SESSION_S + 1, SESSION_S + 5), 2)
    node = cluster.node(node_id)
    out.fault += f"SIGSTOP node {node_id} (the {target}) for {pause}s"
    node.pause()
    try:
        time.sleep(pause)
    finally:
        node.resume()


def leader_kill(env: ChaosEnv, seed: int) -> Outcome:
    """SIGKILL the leader of a partition being fetched (3 nodes), restart it 10-14 s later;
    the run follows the new leader and ends exact without a rerun."""
    return _node_case(env, "leader-kill", seed, _kill_leader)


def node_pause(env: ChaosEnv, seed: int) -> Outcome:
    """SIGSTOP the group coordinator or a leader (3 nodes) past the session timeout, then
    SIGCONT; the run rides it out and ends exact without a rerun."""
    return _node_case(env, "node-pause", seed, _pause_node)


ADDED = 2  # partitions added mid-run, to the 4 the topic starts with


def partitions_added(env: ChaosEnv, seed: int) -> Outcome:
    """Partitions added to the topic while ``ingest run`` consumes (3 nodes), then records
    on every partition: the group's leader sees the new count within its metadata refresh
    (1 s here), rejoins, and the new partitions get workers; the table ends exact without
    a rerun."""
    from confluent_kafka.admin import AdminClient, NewPartitions

    name = "partitions-added"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    cluster = env.cluster
    all_running(cluster)
    setup = prepare(env, rng, name, broker=cluster, sections={"source": {"metadata_refresh": "1s"}})
    # No records arrive before the fault: the first batch may be the only one (seed 203
    # waited for a second).
    when = first_batch_moment(moment(rng))
    outcome = Outcome(name, seed, f"{ADDED} partitions added at {when[0]} #{when[1]} +{when[2]}s")
    run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
    try:
        if not wait_moment(run, when):
            raise CaseFailed(f"the run ended before the fault moment {when}")
        admin = AdminClient({"bootstrap.servers": setup.bootstrap})
        future = admin.create_partitions([NewPartitions(setup.topic, PARTITIONS + ADDED)])
        future[setup.topic].result(timeout=30)
        per = rng.randint(2_000, 4_000)
        produce(
            setup.bootstrap,
            setup.topic,
            (r for p in range(PARTITIONS + ADDED) for r in records(p, 100_000, per)),
            retries=1_000_000,
        )
        setup.produced += per * (PARTITIONS + ADDED)
        continuous_until_landed(run, setup, outcome, timeout=120)
    finally:
        run.kill()
    new = [f"{setup.topic}-{p}" for p in range(PARTITIONS, PARTITIONS + ADDED)]
    started_new = [p for p in new if f"event=worker_started partition={p} " in run.text()]
    outcome.notes.append(
        f"assigned {run.count('partitions_assigned')}x; new partitions with a worker: "
        f"{len(started_new)} of {ADDED}"
    )
    if len(started_new) != ADDED:
        outcome.problems.append(f"the added partitions never got a worker: {new}")
    settle(env, setup, outcome, survives=True)
    outcome.seconds = time.monotonic() - started
    return outcome


def replicas(setup: Setup) -> dict[int, tuple[list[int], list[int]]]:
    """partition -> (its replicas, preferred first; its in-sync replicas)."""
    from confluent_kafka.admin import AdminClient

    meta = AdminClient({"bootstrap.servers": setup.bootstrap}).list_topics(setup.topic, timeout=10)
    return {
        p: (list(i.replicas), list(i.isrs)) for p, i in meta.topics[setup.topic].partitions.items()
    }


def _move_off(rng: random.Random, cluster: KafkaCluster, setup: Setup) -> tuple[int, str, float]:
    """Kills or pauses a node preferred to lead some partitions until others lead them,
    then brings it back and waits until it is in sync again; returns (node, how, seconds
    until others led)."""
    preferred = {p: r[0] for p, (r, _) in replicas(setup).items()}
    node_id = rng.choice(sorted(set(preferred.values())))
    how = rng.choice(["SIGKILL", "SIGSTOP"])
    mine = [p for p, n in preferred.items() if n == node_id]
    node = cluster.node(node_id)
    began = time.monotonic()
    if how == "SIGKILL":
        node.kill()
    else:
        node.pause()
    try:
        # Kafka's broker session (9 s) passes, the controller fences the node.
        wait_until(
            lambda: all(leaders(setup)[p] not in (node_id, -1) for p in mine),
            60,
            f"partitions {mine} to move off node {node_id}",
        )
        moved = time.monotonic() - began
    finally:
        if how == "SIGKILL":
            node.start()
        else:
            node.resume()
    wait_until(
        lambda: all(node_id in isr for _, isr in replicas(setup).values()),
        90,
        f"node {node_id} back in sync",
    )
    return node_id, how, moved


def leader_election(env: ChaosEnv, seed: int) -> Outcome:
    """A preferred-leader election (ElectLeaders) while ``ingest run`` fetches (3 nodes),
    after a node preferred to lead was killed or paused and came back: leadership moves
    back to it under the running fetchers; the table ends exact without a rerun."""
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient

    name = "leader-election"
    rng = random.Random(f"{name}:{seed}")
    started = time.monotonic()
    cluster = env.cluster
    all_running(cluster)
    setup = prepare(env, rng, name, broker=cluster)
    node_id, how, moved = _move_off(rng, cluster, setup)
    when = moment(rng)
    outcome = Outcome(
        name, seed, f"{how} node {node_id} until others led; election at {when[0]} #{when[1]}: "
    )
    run = Run(["run", "-c", str(setup.path)], setup.work / "run.log")
    producer = None
    try:
        run.wait_for("partitions_assigned", 1, 90)
        producer = Producer(setup, rng.randint(5, 10), retries=1_000_000)
        if not wait_moment(run, when):
            raise CaseFailed(f"the run ended before the fault moment {when}")
        preferred = {p: r[0] for p, (r, _) in replicas(setup).items()}
        before = leaders(setup)
        off = sorted(p for p in preferred if before[p] != preferred[p])
        admin = AdminClient({"bootstrap.servers": setup.bootstrap})
        asked = [TopicPartition(setup.topic, p) for p in sorted(preferred)]
        answers = admin.elect_leaders(ElectionType.PREFERRED, asked).result(timeout=30)
        elected = sorted(tp.partition for tp, error in answers.items() if error is None)
        wait_until(
            lambda: all(leaders(setup)[p] == preferred[p] for p in elected),
            30,
            f"the elected leaders of {elected} in the metadata",
        )
        outcome.fault += (
            f"leaders {dict(sorted(before.items()))} -> {dict(sorted(leaders(setup).items()))}"
        )
        if not elected or run.process.poll() is not None:
            outcome.problems.append(
                f"no leader moved under the running fetchers (off the preferred before: {off}; "
                f"answers { ({tp.partition: str(e) for tp, e in answers.items()}) })"
            )
        producer.stop()
        # Records after the election, on every partition: a fetcher left on the old leader
        # (a follower now) leaves the table short of them.
        produce_rounds(setup, rng.randint(4_000, 8_000), retries=1_000_000)
        setup.produced = check(setup, complete=False).expected
        continuous_until_landed(run, setup, outcome, timeout=180)
    finally:
        if producer is not None:
            producer.stop()
        run.kill()
        all_running(cluster)
    outcome.notes.append(
        f"others led node {node_id}'s partitions {moved:.1f}s after the {how}; "
        f"assigned {run.count('partitions_assigned')}x, lost {run.count('partitions_lost')}x"
    )
    settle(env, setup, outcome, survives=True)
    outcome.seconds = time.monotonic() - started
    return outcome
