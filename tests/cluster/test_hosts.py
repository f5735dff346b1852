"""Several hosts on one machine (``ingest.testing.netns``): a 3-node Apache Kafka on three
network-namespace hosts, two ``ingest run`` supervisors on two more (see
``tests/chaos/host_cases.py``), and, for the Spark case, a standalone master on another
with a worker on each supervisor host (``SparkCluster(hosts=..., master_host=...)``).
Marker ``cluster``: ``scripts/test -m cluster``; skipped, naming the reason, where
namespaces cannot be made. The ``host-cut`` campaign over many
seeds: ``scripts/chaos host-cut --seed 0 --runs 10`` (docs/reliability.md).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.group import PartitionsLost
from ingest.membership.member import GroupMember
from ingest.testing import SparkCluster, create_topic
from ingest.testing.netns import unavailable
from tests.chaos.host_cases import (
    SPARK_MASTER,
    SUPERVISORS,
    HostSite,
    host_cut,
    prepare_on,
    produce_on,
    run_on,
    start_site,
    two_hosts_share,
    verdict_on,
)
from tests.cluster.support import RUN_TIMEOUT
from tests.supervisor.support import (
    REBALANCE_WAIT,
    SESSION,
    Recorder,
    client_config,
    group_config,
    pump_until,
)

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def site() -> Iterator[HostSite]:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no namespace hosts here: {reason}")
    hosts = start_site()
    yield hosts
    hosts.stop()


def test_a_cut_off_member_loses_its_partitions_within_its_session(
    site: HostSite, topic: str, group: str
) -> None:
    """A member whose host is cut off must see its partitions lost about one session
    timeout after its last heartbeat answer, not after a coordinator lookup's request
    timeout (15 s here): its supervisor stops their workers then."""
    host = site.supervisor("sup-a")
    bootstrap = site.cluster.bootstrap
    site.client.call(create_topic, bootstrap, topic, partitions=4)

    def join() -> GroupMember:
        # Made on a thread in the host: the membership thread it starts lives there too.
        member = GroupMember(client_config(bootstrap), group_config(group))
        member.subscribe([topic])
        return member

    here = Recorder(host.call(join), "here")
    try:
        pump_until([here], lambda: here.stable and len(here.owned) == 4, REBALANCE_WAIT, "4")
        host.cut()
        cut = time.monotonic()
        took = pump_until([here], lambda: bool(here.of(PartitionsLost)), 60, "the loss")
        # The session, the heartbeat interval before the first miss, and slack for a
        # loaded machine; a lookup that waits out its request timeout takes 15 s or more.
        assert took < SESSION + 4.0, f"partitions lost {took:.1f}s after the cut"
        assert here.owned == frozenset()
        assert time.monotonic() - cut < 30
    finally:
        host.restore()
        if here.member.alive:
            here.member.close()


def test_two_hosts_share_the_partitions_exactly(site: HostSite, tmp_path: Path) -> None:
    outcome = two_hosts_share(site, tmp_path, 0)
    print(outcome.line())
    assert outcome.passed, outcome.line()


def test_a_cut_off_host_lands_nothing_twice(site: HostSite, tmp_path: Path) -> None:
    # Seed 1: held before its Delta commit, which comes after B landed every record.
    outcome = host_cut(site, tmp_path, 1)
    print(outcome.line())
    assert outcome.passed, outcome.line()


@pytest.mark.spark
def test_two_hosts_each_with_a_spark_worker_land_exactly(site: HostSite, tmp_path: Path) -> None:
    """Two supervisor hosts in one group, each also a Spark standalone worker's host, the
    master on a third: both ``ingest run --until-end`` send their batches to the cluster,
    each as its own application capped at one core (``spark.cores.max``: uncapped, the
    first takes every core and the second gets no executor), the handoff in files mode on
    a directory both hosts and every executor share. Both land rows; the table is exact."""
    handoff = tmp_path / "handoff"
    handoff.mkdir()
    spark = SparkCluster(
        hosts=[site.supervisor(name) for name in SUPERVISORS],
        master_host=site.network[SPARK_MASTER],
        work_dir=tmp_path / "spark",
    )
    sections = {
        "spark": {"master": spark.master_url, "engine": "auto", "conf": {"spark.cores.max": "1"}},
        "handoff": {"mode": "files", "root": str(handoff)},
    }
    setup = prepare_on(site, tmp_path, "spark-hosts", sections=sections)
    produce_on(site, setup, 40_000)
    runs = []
    with spark:
        try:
            for name in SUPERVISORS:
                host = site.supervisor(name)
                # The driver binds to and advertises its host's address.
                env = {"SPARK_LOCAL_IP": host.address}
                runs.append(run_on(host, setup, f"run-{name}.log", env, ("--until-end",)))
            codes = [run.wait(RUN_TIMEOUT) for run in runs]
        finally:
            for run in runs:
                run.kill()
    texts = [run.text() for run in runs]
    assert codes == [0, 0], "\n".join(text[-3000:] for text in texts)
    for name, text in zip(SUPERVISORS, texts, strict=True):
        assert f"spark session {spark.master_url} started" in text, text[-3000:]
        assert "local engine" not in text
        rows = sum(int(n) for n in re.findall(r"event=batch_committed .*?rows=(\d+)", text))
        print(f"{name} landed {rows} rows")
        assert rows > 0, f"{name} landed nothing:\n{text[-3000:]}"
    for index in range(len(SUPERVISORS)):
        apps = list((spark.work_dir / f"worker-{index}" / "work").glob("app-*"))
        assert apps, f"the worker on {SUPERVISORS[index]} never ran an executor"
    verdict = verdict_on(site, setup, complete=True)
    verdict.raise_if_not_exact()
    assert verdict.rows == setup.produced
