"""Assignors: Kafka's known answers for range and roundrobin, properties of cooperative-sticky."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ingest.group import (
    CooperativeStickyAssignor,
    MemberAssignment,
    MemberSubscription,
    RangeAssignor,
    RoundRobinAssignor,
)
from ingest.group.snapshot import (
    SNAPSHOT_MAGIC,
    AssignmentSnapshot,
    decode_snapshot,
    encode_snapshot,
)
from ingest.protocol.partition import Partition

T1, T2 = "topic1", "topic2"


def tps(*pairs: tuple[str, int]) -> frozenset[Partition]:
    return frozenset(Partition(t, p) for t, p in pairs)


def sub(*topics: str, instance: str | None = None, **kw: object) -> MemberSubscription:
    return MemberSubscription(topics=frozenset(topics), group_instance_id=instance, **kw)  # type: ignore[arg-type]


def parts(result: Mapping[str, MemberAssignment]) -> dict[str, frozenset[Partition]]:
    return {m: a.partitions for m, a in result.items()}


# -- range: the results of Kafka's RangeAssignorTest ------------------------------------

RANGE = RangeAssignor()
ROBIN = RoundRobinAssignor()


@pytest.mark.parametrize("assignor", [RANGE, ROBIN], ids=["range", "roundrobin"])
def test_no_topics_or_nonexistent_topic_gives_an_empty_assignment(assignor: object) -> None:
    assert isinstance(assignor, RangeAssignor | RoundRobinAssignor)
    assert parts(assignor.assign({"c": sub()}, {})) == {"c": frozenset()}
    assert parts(assignor.assign({"c": sub("t")}, {})) == {"c": frozenset()}
    assert parts(assignor.assign({"c": sub("t")}, {"t": 0})) == {"c": frozenset()}


@pytest.mark.parametrize("assignor", [RANGE, ROBIN], ids=["range", "roundrobin"])
def test_single_consumer_cases(assignor: RangeAssignor | RoundRobinAssignor) -> None:
    assert parts(assignor.assign({"c": sub(T1)}, {T1: 3})) == {"c": tps((T1, 0), (T1, 1), (T1, 2))}
    only_subscribed = assignor.assign({"c": sub(T1)}, {T1: 3, "other": 3})
    assert parts(only_subscribed) == {"c": tps((T1, 0), (T1, 1), (T1, 2))}
    both = assignor.assign({"c": sub(T1, T2)}, {T1: 1, T2: 2})
    assert parts(both) == {"c": tps((T1, 0), (T2, 0), (T2, 1))}


@pytest.mark.parametrize("assignor", [RANGE, ROBIN], ids=["range", "roundrobin"])
def test_two_consumers_one_topic(assignor: RangeAssignor | RoundRobinAssignor) -> None:
    members = {"consumer1": sub(T1), "consumer2": sub(T1)}
    assert parts(assignor.assign(members, {T1: 1})) == {
        "consumer1": tps((T1, 0)),
        "consumer2": frozenset(),
    }
    assert parts(assignor.assign(members, {T1: 2})) == {
        "consumer1": tps((T1, 0)),
        "consumer2": tps((T1, 1)),
    }


@pytest.mark.parametrize("assignor", [RANGE, ROBIN], ids=["range", "roundrobin"])
def test_mixed_topics(assignor: RangeAssignor | RoundRobinAssignor) -> None:
    members = {"consumer1": sub(T1), "consumer2": sub(T1, T2), "consumer3": sub(T1)}
    assert parts(assignor.assign(members, {T1: 3, T2: 2})) == {
        "consumer1": tps((T1, 0)),
        "consumer2": tps((T1, 1), (T2, 0), (T2, 1)),
        "consumer3": tps((T1, 2)),
    }


def test_range_two_consumers_two_topics() -> None:
    members = {"consumer1": sub(T1, T2), "consumer2": sub(T1, T2)}
    assert parts(RANGE.assign(members, {T1: 3, T2: 3})) == {
        "consumer1": tps((T1, 0), (T1, 1), (T2, 0), (T2, 1)),
        "consumer2": tps((T1, 2), (T2, 2)),
    }


def test_range_orders_static_members_by_instance_id() -> None:
    # consumer-a sorts first by member id, but instance ids decide between static members.
    static = {
        "consumer-b": sub(T1, T2, instance="instance1"),
        "consumer-a": sub(T1, T2, instance="instance2"),
    }
    expected = {
        "consumer-b": tps((T1, 0), (T1, 1), (T2, 0), (T2, 1)),
        "consumer-a": tps((T1, 2), (T2, 2)),
    }
    assert parts(RANGE.assign(static, {T1: 3, T2: 3})) == expected
    # A static member sorts before any dynamic one.
    mixed = {"consumer-b": sub(T1, T2, instance="instance1"), "consumer-a": sub(T1, T2)}
    assert parts(RANGE.assign(mixed, {T1: 3, T2: 3})) == expected


def test_range_static_assignment_is_persistent() -> None:
    members = {f"consumer{i}": sub(T1, T2, instance=f"instance{i}") for i in (1, 2, 3)}
    members["consumer4"] = sub(T1, T2)
    expected = {
        "consumer1": tps((T1, 0), (T1, 1), (T2, 0)),
        "consumer2": tps((T1, 2), (T2, 1)),
        "consumer3": tps((T1, 3), (T2, 2)),
        "consumer4": tps((T1, 4), (T2, 3)),
    }
    assert parts(RANGE.assign(members, {T1: 5, T2: 4})) == expected
    del members["consumer4"]
    members["consumer5"] = sub(T1, T2)
    expected["consumer5"] = expected.pop("consumer4")
    assert parts(RANGE.assign(members, {T1: 5, T2: 4})) == expected


def _by_instance(
    result: Mapping[str, MemberAssignment], members: Mapping[str, MemberSubscription]
) -> dict[str | None, frozenset[Partition]]:
    return {members[m].group_instance_id: a.partitions for m, a in result.items()}


@pytest.mark.parametrize(
    ("assignor", "expected"),
    [
        (
            RANGE,
            {
                "instance1": tps((T1, 0), (T1, 1), (T2, 0), (T2, 1)),
                "instance2": tps((T1, 2), (T1, 3), (T2, 2), (T2, 3)),
                "instance3": tps((T1, 4), (T2, 4)),
            },
        ),
        (
            ROBIN,
            {
                "instance1": tps((T1, 0), (T1, 3), (T2, 1), (T2, 4)),
                "instance2": tps((T1, 1), (T1, 4), (T2, 2)),
                "instance3": tps((T1, 2), (T2, 0), (T2, 3)),
            },
        ),
    ],
    ids=["range", "roundrobin"],
)
def test_static_assignment_survives_member_id_changes(
    assignor: RangeAssignor | RoundRobinAssignor, expected: dict[str, frozenset[Partition]]
) -> None:
    members = {f"consumer{i}": sub(T1, T2, instance=f"instance{i}") for i in (1, 2, 3)}
    assert _by_instance(assignor.assign(members, {T1: 5, T2: 5}), members) == expected
    members["consumer4"] = members.pop("consumer3")
    members["consumer5"] = members.pop("consumer2")
    assert _by_instance(assignor.assign(members, {T1: 5, T2: 5}), members) == expected


# -- roundrobin: the results of Kafka's RoundRobinAssignorTest ---------------------------


def test_roundrobin_two_consumers_two_topics() -> None:
    dynamic = {"consumer1": sub(T1, T2), "consumer2": sub(T1, T2)}
    assert parts(ROBIN.assign(dynamic, {T1: 3, T2: 3})) == {
        "consumer1": tps((T1, 0), (T1, 2), (T2, 1)),
        "consumer2": tps((T1, 1), (T2, 0), (T2, 2)),
    }
    expected = {
        "consumer-b": tps((T1, 0), (T1, 2), (T2, 1)),
        "consumer-a": tps((T1, 1), (T2, 0), (T2, 2)),
    }
    static = {
        "consumer-b": sub(T1, T2, instance="instance1"),
        "consumer-a": sub(T1, T2, instance="instance2"),
    }
    assert parts(ROBIN.assign(static, {T1: 3, T2: 3})) == expected
    mixed = {"consumer-b": sub(T1, T2, instance="instance1"), "consumer-a": sub(T1, T2)}
    assert parts(ROBIN.assign(mixed, {T1: 3, T2: 3})) == expected


def test_roundrobin_static_assignment_is_persistent() -> None:
    members = {f"consumer{i}": sub(T1, T2, instance=f"instance{i}") for i in (1, 2, 3)}
    members["consumer4"] = sub(T1, T2)
    expected = {
        "consumer1": tps((T1, 0), (T2, 1)),
        "consumer2": tps((T1, 1), (T2, 2)),
        "consumer3": tps((T1, 2)),
        "consumer4": tps((T2, 0)),
    }
    assert parts(ROBIN.assign(members, {T1: 3, T2: 3})) == expected
    del members["consumer4"]
    members["consumer5"] = sub(T1, T2)
    expected["consumer5"] = expected.pop("consumer4")
    assert parts(ROBIN.assign(members, {T1: 3, T2: 3})) == expected


@pytest.mark.parametrize("assignor", [RANGE, ROBIN], ids=["range", "roundrobin"])
def test_members_sort_as_java_strings(assignor: RangeAssignor | RoundRobinAssignor) -> None:
    # U+10000 is a surrogate pair (D800 DC00) in Java, so it sorts before U+FFFF there,
    # while Python's code-point order puts it after.
    high, astral = "m\uffff", "m\U00010000"
    result = parts(assignor.assign({high: sub("t"), astral: sub("t")}, {"t": 1}))
    assert result == {astral: tps(("t", 0)), high: frozenset()}


# -- cooperative-sticky ------------------------------------------------------------------

STICKY = CooperativeStickyAssignor()


@st.composite
def groups(draw: st.DrawFn, *, equal: bool) -> tuple[dict[str, MemberSubscription], dict[str, int]]:
    """Members, their subscriptions and a valid previous ownership (each partition at most once)."""
    topics = draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3, unique=True))
    counts = {t: draw(st.integers(0, 9)) for t in topics}
    names = draw(
        st.lists(st.text("mnopq", min_size=1, max_size=3), min_size=1, max_size=6, unique=True)
    )
    if equal:
        subscribed = {m: frozenset(topics) for m in names}
    else:
        subscribed = {
            m: frozenset(draw(st.lists(st.sampled_from(topics), min_size=1, unique=True)))
            for m in names
        }
    owned: dict[str, set[Partition]] = {m: set() for m in names}
    for topic, count in counts.items():
        for index in range(count):
            holder = draw(st.sampled_from([None, *names]))
            if holder is not None and topic in subscribed[holder]:
                owned[holder].add(Partition(topic, index))
    static = draw(st.booleans())
    members = {
        m: MemberSubscription(
            topics=subscribed[m],
            owned_partitions=frozenset(owned[m]),
            generation_id=3,
            group_instance_id=f"i-{m}" if static else None,
        )
        for m in names
    }
    return members, counts


def all_partitions(
    members: Mapping[str, MemberSubscription], counts: Mapping[str, int]
) -> set[Partition]:
    topics = {t for s in members.values() for t in s.topics}
    return {Partition(t, i) for t in topics for i in range(counts.get(t, 0))}


def follow_up(
    members: Mapping[str, MemberSubscription],
    result: Mapping[str, MemberAssignment],
    generation: int,
) -> dict[str, MemberSubscription]:
    """Each member now owns what it was assigned (it revoked the rest) and rejoins."""
    return {
        m: MemberSubscription(
            topics=s.topics,
            owned_partitions=result[m].partitions,
            generation_id=generation,
            group_instance_id=s.group_instance_id,
        )
        for m, s in members.items()
    }


def snapshot_of(result: Mapping[str, MemberAssignment]) -> bytes | None:
    """The user_data every member got (the leader writes the same snapshot to all)."""
    snapshots = {a.user_data for a in result.values()}
    assert len(snapshots) == 1
    return snapshots.pop()


def check_cooperative_round(
    members: Mapping[str, MemberSubscription],
    counts: Mapping[str, int],
    result: Mapping[str, MemberAssignment],
) -> None:
    assert set(result) == set(members)
    seen: dict[Partition, str] = {}
    for member, assignment in result.items():
        for partition in assignment.partitions:
            assert partition not in seen, f"{partition} given to {seen[partition]} and {member}"
            seen[partition] = member
            assert partition.topic in members[member].topics
            assert 0 <= partition.partition < counts[partition.topic]
        # A partition new to this member is not still owned by anyone else.
        for partition in assignment.partitions - members[member].owned_partitions:
            holders = [m for m, s in members.items() if partition in s.owned_partitions]
            assert holders == [], f"{partition} assigned to {member} while {holders} own it"


def balanced(
    members: Mapping[str, MemberSubscription], result: Mapping[str, MemberAssignment]
) -> bool:
    loads = {m: len(a.partitions) for m, a in result.items()}
    for source, assignment in result.items():
        for target in result:
            if loads[target] + 2 <= loads[source] and any(
                p.topic in members[target].topics for p in assignment.partitions
            ):
                return False
    return True


@settings(max_examples=300, deadline=None)
@given(groups(equal=True))
def test_sticky_equal_subscriptions(
    group: tuple[dict[str, MemberSubscription], dict[str, int]],
) -> None:
    members, counts = group
    first = STICKY.assign(members, counts, generation_id=4)
    check_cooperative_round(members, counts, first)
    total = len(all_partitions(members, counts))
    fair = total // len(members)
    for member, subscription in members.items():
        kept = first[member].partitions & subscription.owned_partitions
        assert len(kept) >= min(len(subscription.owned_partitions), fair), member

    second_members = follow_up(members, first, 4)
    second = STICKY.assign(
        second_members, counts, generation_id=5, retained_user_data=snapshot_of(first)
    )
    check_cooperative_round(second_members, counts, second)
    assigned = [p for a in second.values() for p in a.partitions]
    assert set(assigned) == all_partitions(members, counts), "a partition is left unassigned"
    loads = [len(a.partitions) for a in second.values()]
    assert max(loads) - min(loads) <= 1
    # Once balanced, another rebalance with the same members moves nothing.
    third = STICKY.assign(
        follow_up(second_members, second, 5),
        counts,
        generation_id=6,
        retained_user_data=snapshot_of(second),
    )
    assert parts(third) == parts(second)


@settings(max_examples=300, deadline=None)
@given(groups(equal=False))
def test_sticky_unequal_subscriptions(
    group: tuple[dict[str, MemberSubscription], dict[str, int]],
) -> None:
    members, counts = group
    first = STICKY.assign(members, counts, generation_id=4)
    check_cooperative_round(members, counts, first)
    second_members = follow_up(members, first, 4)
    second = STICKY.assign(
        second_members, counts, generation_id=5, retained_user_data=snapshot_of(first)
    )
    check_cooperative_round(second_members, counts, second)
    assert {p for a in second.values() for p in a.partitions} == all_partitions(members, counts)
    assert balanced(members, second)
    assert STICKY.assign(members, counts, generation_id=4) == first, "not deterministic"


def test_sticky_conflicting_claims() -> None:
    older = MemberSubscription(
        topics=frozenset("t"), owned_partitions=tps(("t", 0)), generation_id=2
    )
    newer = MemberSubscription(
        topics=frozenset("t"), owned_partitions=tps(("t", 0)), generation_id=3
    )
    result = parts(STICKY.assign({"a": older, "b": newer}, {"t": 2}))
    # Both still consume t-0 until they revoke it, so neither may be assigned it anew;
    # the newer claim wins the stickiness, the older claimant gives it up.
    assert result["b"] == tps(("t", 0))
    assert ("t", 0) not in result["a"]


def test_sticky_moves_a_partition_in_two_rebalances() -> None:
    a = MemberSubscription(
        topics=frozenset("t"), owned_partitions=tps(("t", 0), ("t", 1)), generation_id=1
    )
    b = MemberSubscription(topics=frozenset("t"), generation_id=-1)
    first = parts(STICKY.assign({"a": a, "b": b}, {"t": 2}, generation_id=2))
    assert first == {"a": tps(("t", 0)), "b": frozenset()}  # t-1 is revoked first
    a2 = MemberSubscription(topics=frozenset("t"), owned_partitions=first["a"], generation_id=2)
    b2 = MemberSubscription(topics=frozenset("t"), generation_id=2)
    second = parts(STICKY.assign({"a": a2, "b": b2}, {"t": 2}, generation_id=3))
    assert second == {"a": tps(("t", 0)), "b": tps(("t", 1))}


def test_sticky_from_snapshot_when_owned_partitions_are_absent() -> None:
    """A leader that never led reproduces the previous assignment from the stored user_data."""
    counts = {"t": 7, "u": 3}
    before = {
        m: MemberSubscription(topics=frozenset(counts), group_instance_id=i)
        for m, i in (("m1", None), ("m2", "static-2"), ("m3", None))
    }
    first = STICKY.assign(before, counts, generation_id=7)
    snapshot = first["m2"].user_data
    assert snapshot is not None and all(a.user_data == snapshot for a in first.values())
    # m1 is gone; m2 (static) comes back with a new member id; nobody reports owned partitions.
    after = {
        "m2-new": MemberSubscription(topics=frozenset(counts), group_instance_id="static-2"),
        "m3": MemberSubscription(topics=frozenset(counts)),
    }
    second = parts(STICKY.assign(after, counts, generation_id=8, retained_user_data=snapshot))
    assert first["m2"].partitions <= second["m2-new"]
    assert first["m3"].partitions <= second["m3"]
    assert second["m2-new"] | second["m3"] == all_partitions(after, counts)
    # Without the snapshot the same leader has nothing to be sticky with.
    fresh = parts(STICKY.assign(after, counts, generation_id=8))
    assert fresh != second


def test_sticky_subscription_user_data_is_kafka_generation() -> None:
    assert STICKY.subscription_user_data(5) == b"\x00\x00\x00\x05"
    # A v0/v1 subscription carries its generation only there.
    old = MemberSubscription(
        topics=frozenset("t"), owned_partitions=tps(("t", 0)), user_data=b"\x00\x00\x00\x09"
    )
    new = MemberSubscription(topics=frozenset("t"), owned_partitions=tps(("t", 0)), generation_id=8)
    assert parts(STICKY.assign({"old": old, "new": new}, {"t": 1}))["old"] == tps(("t", 0))


# -- the snapshot layout ----------------------------------------------------------------


def test_snapshot_round_trip_and_layout() -> None:
    snapshot = AssignmentSnapshot.build(
        12, {"b": tps(("t", 1), ("t", 0)), "a": frozenset()}, {"a": None, "b": "inst"}
    )
    data = encode_snapshot(snapshot)
    assert data.startswith(SNAPSHOT_MAGIC + b"\x00\x00" + (12).to_bytes(4, "big"))
    decoded = decode_snapshot(data)
    assert decoded == snapshot
    assert [m.member_id for m in decoded.members] == ["a", "b"]
    assert decoded.members[1].partition_set() == tps(("t", 0), ("t", 1))
    # A newer version may append fields; this reader reads what it knows.
    newer = SNAPSHOT_MAGIC + b"\x00\x01" + data[len(SNAPSHOT_MAGIC) + 2 :] + b"\x07\x07"
    assert decode_snapshot(newer) == snapshot


@pytest.mark.parametrize(
    "data",
    [
        None,
        b"",
        b"\x00\x00\x00\x05",
        SNAPSHOT_MAGIC,
        SNAPSHOT_MAGIC + b"\x00\x00\x00",
        b"INGX" + b"\x00" * 10,
    ],
)
def test_foreign_or_corrupt_snapshots_are_ignored(data: bytes | None) -> None:
    assert decode_snapshot(data) is None


@given(st.binary(max_size=64))
def test_snapshot_decoder_never_raises(data: bytes) -> None:
    decode_snapshot(SNAPSHOT_MAGIC + data)


@st.composite
def messy_groups(draw: st.DrawFn) -> tuple[dict[str, MemberSubscription], dict[str, int]]:
    """Claims as a confused group may send them: overlapping, stale, out of range."""
    counts = {t: draw(st.integers(0, 6)) for t in ("a", "b")}
    names = draw(st.lists(st.sampled_from("mnopqr"), min_size=1, max_size=5, unique=True))
    claimable = st.builds(Partition, st.sampled_from(["a", "b", "gone"]), st.integers(0, 7))
    members = {
        m: MemberSubscription(
            topics=frozenset(draw(st.lists(st.sampled_from(["a", "b"]), min_size=1, unique=True))),
            owned_partitions=frozenset(draw(st.lists(claimable, max_size=6))),
            generation_id=draw(st.integers(-1, 3)),
        )
        for m in names
    }
    return members, counts


@settings(max_examples=300, deadline=None)
@given(messy_groups())
def test_sticky_is_safe_with_conflicting_and_stale_claims(
    group: tuple[dict[str, MemberSubscription], dict[str, int]],
) -> None:
    members, counts = group
    first = STICKY.assign(members, counts, generation_id=4)
    check_cooperative_round(members, {**counts, "gone": 0}, first)
    second_members = follow_up(members, first, 4)
    second = STICKY.assign(
        second_members, counts, generation_id=5, retained_user_data=snapshot_of(first)
    )
    check_cooperative_round(second_members, counts, second)
    assert {p for a in second.values() for p in a.partitions} == all_partitions(members, counts)
    assert balanced(members, second)
