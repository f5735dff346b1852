"""Several hosts on one machine (``ingest.testing.netns``): a 3-node Apache Kafka on three
network-namespace hosts, two ``ingest run`` supervisors on two more (see
``tests/chaos/host_cases.py``). Marker ``cluster``: ``scripts/test -m cluster``; skipped,
naming the reason, where namespaces cannot be made. The ``host-cut`` campaign over many
seeds: ``scripts/chaos host-cut --seed 0 --runs 10`` (docs/reliability.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.group import PartitionsLost
from ingest.supervisor.membership import GroupMember
from ingest.testing import create_topic
from ingest.testing.netns import unavailable
from tests.chaos.host_cases import HostSite, host_cut, start_site, two_hosts_share
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
