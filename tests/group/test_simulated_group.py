"""Several machines against an in-process fake coordinator (pure layer only).

The simulation checks after every delivered input that no partition is
consumed by two members at once; drivers acknowledge revocations late.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.group import (
    Commit,
    CooperativeStickyAssignor,
    FetchCommitted,
    Leave,
    MemberState,
    OffsetsCommitted,
    OffsetsFetched,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    RangeAssignor,
)
from ingest.protocol.partition import Partition
from tests.group.support import Simulation, config

TOPICS = {"orders": 7, "audit": 3}
EVERYTHING = {Partition(t, i) for t, n in TOPICS.items() for i in range(n)}


def assert_complete_and_balanced(sim: Simulation) -> None:
    owned = {c: p for c, p in sim.owned().items() if sim.machines[c].state is MemberState.STABLE}
    assert set().union(*owned.values()) == EVERYTHING
    assert sum(len(p) for p in owned.values()) == len(EVERYTHING)
    loads = [len(p) for p in owned.values()]
    assert max(loads) - min(loads) <= 1
    for client, partitions in owned.items():
        assert partitions == sim.consuming[client]


def events(sim: Simulation, since: int, kind: type) -> list[tuple[str, object]]:
    return [(c, o) for c, o in sim.history[since:] if isinstance(o, kind)]


def test_cooperative_group_grows_and_shrinks_without_double_consumption() -> None:
    sim = Simulation(TOPICS, ack_delay=3)
    for client in ("a", "b"):
        sim.add(client, config(), TOPICS)
    sim.run()
    assert_complete_and_balanced(sim)

    before = sim.owned()
    mark = len(sim.history)
    sim.add("c", config(), TOPICS)
    sim.run()
    assert_complete_and_balanced(sim)
    after = sim.owned()
    for client in ("a", "b"):
        # Sticky: an old member keeps its fair share of what it had.
        assert len(after[client] & before[client]) >= len(EVERYTHING) // 3
        # Cooperative: only the partitions that move are revoked, never everything.
        revoked = [o.partitions for c, o in events(sim, mark, PartitionsRevoked) if c == client]
        assert all(r and r < before[client] for r in revoked)
        assert frozenset().union(*revoked) == before[client] - after[client]
    assert not events(sim, mark, PartitionsLost)

    mark = len(sim.history)
    sim.send("a", Leave())
    sim.run()
    assert sim.machines["a"].state is MemberState.UNJOINED
    assert_complete_and_balanced(sim)
    assert not events(sim, mark, PartitionsLost)


def test_eager_leader_failover_stays_sticky_through_the_snapshot() -> None:
    """Eager members own nothing when they rejoin; the new leader, a former follower,
    reproduces the previous assignment from the user_data it stored."""
    eager = config(assignors=(CooperativeStickyAssignor(), RangeAssignor()))
    sim = Simulation(TOPICS)
    for client in ("a", "b", "c"):
        sim.add(client, eager, TOPICS)
    sim.run()
    assert sim.coordinator.protocol == "cooperative-sticky"
    assert sim.machines["a"].is_leader and not sim.machines["b"].is_leader
    before = sim.owned()
    mark = len(sim.history)

    sim.send("a", Leave())
    sim.run()
    assert sim.machines["b"].is_leader
    for metadata in sim.subscription_metadata().values():
        assert metadata.owned_partitions == ()  # eager: revoked before rejoining
    after = sim.owned()
    assert before["b"] <= after["b"] and before["c"] <= after["c"]
    assert after["b"] | after["c"] == EVERYTHING
    revoked_everything = {c for c, o in events(sim, mark, PartitionsRevoked)}
    assert revoked_everything == {"a", "b", "c"}  # eager, as configured


def test_restarted_static_member_gets_its_partitions_back() -> None:
    # Eager, so nobody reports owned partitions: only the snapshot remembers who had what.
    assignors = (CooperativeStickyAssignor(), RangeAssignor())
    sim = Simulation(TOPICS, ack_delay=1)
    for i in (3, 1, 2):
        sim.add(f"s{i}", config(group_instance_id=f"host-{i}", assignors=assignors), TOPICS)
    sim.run()
    three = sim.owned()
    # A fourth member: the old members keep their fair share although, being eager,
    # they reported no owned partitions; the layout now differs from a fresh one.
    sim.add("s4", config(group_instance_id="host-4", assignors=assignors), TOPICS)
    sim.run()
    before = sim.owned()
    for client in ("s1", "s2", "s3"):
        assert len(before[client] & three[client]) >= len(EVERYTHING) // 4
    # s2 dies without leaving (no LeaveGroup for static members); a new process
    # with the same group.instance.id takes its place.
    del sim.machines["s2"]
    del sim.consuming["s2"]
    sim.add("s2-restarted", config(group_instance_id="host-2", assignors=assignors), TOPICS)
    sim.run()
    after = sim.owned()
    assert after["s2-restarted"] == before["s2"]
    assert all(after[c] == before[c] for c in ("s1", "s3", "s4"))


def test_commits_and_fetches_through_the_group() -> None:
    sim = Simulation(TOPICS)
    sim.add("a", config(), TOPICS)
    sim.run()
    partition = Partition("orders", 3)
    sim.send("a", Commit({partition: 120}, metadata="delta-v4"))
    sim.send("a", FetchCommitted(frozenset({partition, Partition("audit", 0)})))
    sim.run()
    (committed,) = events(sim, 0, OffsetsCommitted)
    assert committed[0] == "a"
    (fetched,) = events(sim, 0, OffsetsFetched)
    offsets = fetched[1].offsets  # type: ignore[attr-defined]
    assert offsets[partition].offset == 120 and offsets[partition].metadata == "delta-v4"
    assert offsets[Partition("audit", 0)] is None


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["join", "leave"]), st.sampled_from("abcde"), st.integers(0, 4)),
        min_size=1,
        max_size=8,
    )
)
def test_random_membership_changes_never_share_a_partition(
    changes: list[tuple[str, str, int]],
) -> None:
    sim = Simulation(TOPICS)
    active: set[str] = set()
    left: set[str] = set()
    for action, client, ack_delay in changes:
        sim.ack_delay = ack_delay
        if action == "join" and client not in active and client not in left:
            sim.add(client, config(), TOPICS)
            active.add(client)
        elif action == "leave" and client in active:
            sim.send(client, Leave())
            active.remove(client)
            left.add(client)
        sim.run()  # checks exclusivity after every step
    if active:
        assert_complete_and_balanced(sim)
    assigned = [o for _, o in sim.history if isinstance(o, PartitionsAssigned)]
    assert all(o.added <= o.assignment for o in assigned)
    assert not any(isinstance(o, PartitionsLost) for _, o in sim.history)
