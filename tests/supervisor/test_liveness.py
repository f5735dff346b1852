"""Membership is kept by the membership thread, and lost only when the process is gone.

The second member runs in a process of its own (``member_process``), so that
it sees the group exactly as another consumer would, and can be SIGKILLed.
"""

from __future__ import annotations

import signal
import time

import pytest

from ingest.group import MemberState, PartitionsLost
from ingest.membership.member import GroupMember
from ingest.protocol.messages import HeartbeatRequest
from ingest.testing import KafkaCluster, create_topic
from tests.supervisor.member_process import MemberProcess
from tests.supervisor.support import (
    HEARTBEAT_MS,
    REBALANCE_WAIT,
    SESSION,
    Recorder,
    client_config,
    group_config,
    partitions,
    pump_until,
)

PARTITIONS = 8


def start_pair(broker: KafkaCluster, topic: str, group: str) -> tuple[Recorder, MemberProcess]:
    """Our member here and one in a child process, stable, four partitions each."""
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    everything = partitions(topic, PARTITIONS)
    child = MemberProcess(
        {"bootstrap": broker.bootstrap, "group": group, "topic": topic, "name": "child"}
    )
    here = Recorder(GroupMember(client_config(broker.bootstrap), group_config(group)), "here")
    here.member.subscribe([topic])

    def split() -> bool:
        mine, its = here.owned, child.owned
        assert not mine & its, f"both own {sorted(mine & its)}"
        return here.stable and len(mine) == 4 and mine | its == everything

    pump_until([here], split, REBALANCE_WAIT, "the two members to split the partitions")
    return here, child


@pytest.mark.slow
def test_a_busy_main_thread_keeps_the_membership(
    broker: KafkaCluster, topic: str, group: str
) -> None:
    here, child = start_pair(broker, topic, group)
    try:
        generation = here.member.generation_id
        child_events = len(child.events)
        heartbeats = here.member.requests_sent(HeartbeatRequest.api_key)

        time.sleep(3 * SESSION)  # the supervisor's main thread is busy (a Spark job), no poll

        assert here.pump(0.2) == [], "no rebalance event for the busy member"
        assert here.member.state is MemberState.STABLE
        assert here.member.generation_id == generation
        assert child.events[child_events:] == [], "the other member saw no rebalance either"
        sent = here.member.requests_sent(HeartbeatRequest.api_key) - heartbeats
        assert sent >= (3 * SESSION) / (HEARTBEAT_MS / 1000) / 2, f"only {sent} heartbeats"
    finally:
        child.stop()
        here.member.close()


@pytest.mark.slow
def test_a_killed_member_is_evicted_after_the_session_timeout(
    broker: KafkaCluster, topic: str, group: str
) -> None:
    here, child = start_pair(broker, topic, group)
    try:
        kept = here.owned
        since = time.monotonic()
        child.signal(signal.SIGKILL)
        child.process.wait(10)
        everything = partitions(topic, PARTITIONS)
        took = pump_until(
            [here],
            lambda: here.stable and here.owned == everything,
            REBALANCE_WAIT,
            "the killed member's partitions to be reassigned",
        )
        # Its last heartbeat was at most one interval before the kill.
        assert took >= SESSION - HEARTBEAT_MS / 1000, f"reassigned after {took:.2f}s"
        assert not here.revoked(since) & kept, "the survivor gave up partitions it keeps"
        assert here.of(PartitionsLost) == []
    finally:
        child.stop()
        here.member.close()
