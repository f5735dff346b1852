"""Ours and a librdkafka consumer (confluent-kafka) in one group (issue 16, item 6).

Each case runs one member of each kind on an 8-partition topic while a producer writes to
every partition all along, and goes through:

1. ours joins alone and takes everything; librdkafka joins; they split 4/4 (ours leads);
2. ours leaves (``GroupMember.close``: LeaveGroup); librdkafka owns all 8;
3. ours comes back (a new member); they split 4/4 again (librdkafka leads now);
4. librdkafka closes (LeaveGroup); ours owns all 8;
5. librdkafka comes back (a new consumer); they split 4/4 again (ours leads).

(In the consumer-protocol case the coordinator assigns: there is no leader, and a
member leaves with a ConsumerGroupHeartbeat at epoch -1 instead of a LeaveGroup.)

Asserted throughout, at every poll of every wait, rebalances included: no partition is
owned by both at once (ours as its events tell the application, librdkafka as its
``on_assign``/``on_revoke``/``on_lost`` callbacks do, read as increments), librdkafka reported
no error and polled no record of a partition it did not own, and neither lost partitions
(``PartitionsLost``/``on_lost``: nobody's session expired).

Asserted at each step:

* **both make progress**: after each of the five states is reached, each side consumes a
  record produced after that point from every partition it owns. librdkafka: the records
  it polls. Ours: ``GroupMember`` has no fetcher, so ingest's ``PartitionFetcher`` fetches
  each partition the member owns (a fetcher per partition, opened when the partition is
  assigned and closed when it goes); then ours commits those positions through the member
  (``commit``, which the coordinator takes only from a member of the current generation)
  and reads them back (``fetch_committed``).
* **a leave hands everything over within the session timeout**, both ways: from the call
  that leaves (``close``) to the other side owning all 8, measured and printed (``-s``),
  and at most the group's session timeout (``SESSION_MS``: both sides' ``session.timeout.ms``,
  or the KIP-848 group's ``consumer.session.timeout.ms``): a member that leaves says so
  (ours: a LeaveGroup, or its leaving heartbeat answered, ``Left``; in the consumer-protocol
  case the coordinator no longer lists the leaver right after ``close``, either side, since
  there a session expiring could beat the bound), and the group must not wait for its
  session to expire.
* **a rejoin splits 4/4 again**, no overlap. Cooperative and consumer-protocol cases: the
  member that stayed keeps what it keeps through the rejoin, on both sides (librdkafka
  staying in step 3, ours in step 5): it is revoked exactly what the newcomer gets, never
  anything it ends up owning, and is assigned nothing new.

Cases:

* **librdkafka's default assignors** (``range,roundrobin``) with ours offering
  ``["cooperative-sticky", "range"]``: the only protocol both offer is ``range``, so the
  group is eager (ours is eager too: one of its assignors is not cooperative). On Tansu
  the broker refuses librdkafka's JoinGroup (``INCONSISTENT_GROUP_PROTOCOL``): a strict xfail.
* **cooperative-sticky on both sides** (librdkafka
  ``partition.assignment.strategy=cooperative-sticky``, ours ``[CooperativeStickyAssignor()]``):
  the cooperative protocol, with incremental callbacks on librdkafka's side.
* **group.protocol=consumer on both sides (KIP-848)**: ours a ``GroupMember`` with a
  ``ConsumerGroupConfig``, librdkafka ``group.protocol=consumer``, both naming the
  coordinator's ``uniform`` assignor (``group.remote.assignor``); the group's
  ``consumer.session.timeout.ms`` (``SESSION_MS``) and ``consumer.heartbeat.interval.ms``
  (``CONSUMER_HEARTBEAT_MS``, the least the harness broker allows) are set with
  ``incremental_alter_configs`` before anyone joins. Reconciliation is incremental on both
  sides. On Apache Kafka only: Tansu 0.6.0 offers no ConsumerGroupHeartbeat, so no KIP-848
  group can form on it (docs/kafka-compat.md), and there is no Tansu parameter.

What a mixed group needs is in docs/deploy.md ("Rebalances: cooperative by default").
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
)

from ingest.client import Cluster
from ingest.group import (
    Assignor,
    ConsumerGroupConfig,
    CooperativeStickyAssignor,
    GroupConfig,
    Left,
    MemberState,
    OffsetsFetched,
    PartitionsAssigned,
    PartitionsLost,
    RangeAssignor,
    RebalanceProtocol,
)
from ingest.membership.member import Event, GroupMember, check_commit
from ingest.protocol.messages import LeaveGroupRequest
from ingest.protocol.partition import Partition
from ingest.testing import KafkaCluster, TansuBroker, create_topic, set_group_configs
from ingest.worker import FetchSettings, PartitionFetcher, StartPosition
from tests.brokers import tansu_deviates
from tests.supervisor.confluent import ConfluentMember
from tests.supervisor.support import (
    REBALANCE_WAIT,
    SESSION,
    SESSION_MS,
    Recorder,
    client_config,
    group_config,
    partitions,
)

PARTITIONS = 8
# A record to every partition this often, all through the test.
PRODUCE_EVERY = 0.02
# The KIP-848 group's heartbeat interval (a group config; the harness broker's
# group.consumer.min.heartbeat.interval.ms). Its session timeout is SESSION_MS too.
CONSUMER_HEARTBEAT_MS = 500
# The coordinator's assignor both sides name in the KIP-848 case.
SERVER_ASSIGNOR = "uniform"


@dataclass(frozen=True)
class Case:
    ours: tuple[Callable[[], Assignor], ...]
    theirs: str | None  # librdkafka's partition.assignment.strategy; None: its default
    protocol: RebalanceProtocol  # the classic group's; the consumer protocol's is incremental
    consumer: bool = False  # group.protocol=consumer on both sides (KIP-848)

    @property
    def incremental(self) -> bool:
        """Whether the member that stays keeps its partitions through a rejoin."""
        return self.consumer or self.protocol is RebalanceProtocol.COOPERATIVE


DEFAULTS = Case((CooperativeStickyAssignor, RangeAssignor), None, RebalanceProtocol.EAGER)
COOPERATIVE = Case(
    (CooperativeStickyAssignor,), "cooperative-sticky", RebalanceProtocol.COOPERATIVE
)
CONSUMER = Case((), None, RebalanceProtocol.COOPERATIVE, consumer=True)


@dataclass(frozen=True)
class Handoff:
    """One side left: the leave call took ``leaving`` seconds, and ``total`` passed from
    the call until the other side owned everything."""

    who: str
    leaving: float
    total: float

    def check(self, test: str) -> None:
        other = "ours" if self.who == "librdkafka" else "librdkafka"
        print(
            f"\n{test}: {self.who} left (the call took {self.leaving:.3f}s); {other} owned "
            f"all {PARTITIONS} partitions {self.total:.3f}s after the call"
        )
        assert self.total <= SESSION, (
            f"{other} took {self.total:.3f}s to own everything after {self.who} left, "
            f"longer than the session timeout ({SESSION_MS} ms)"
        )


class Producing:
    """A producer writing a record to every partition every ``PRODUCE_EVERY`` seconds, on a
    thread, and the offset of the last record delivered to each."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self._producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self._topic = topic
        self._lock = threading.Lock()
        self._delivered: dict[Partition, int] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _on_delivery(self, error: Any, message: Any) -> None:
        with self._lock:
            if error is not None:
                self.errors.append(str(error))
                return
            tp = Partition(message.topic(), message.partition())
            self._delivered[tp] = max(message.offset(), self._delivered.get(tp, -1))

    def _run(self) -> None:
        while not self._stop.wait(PRODUCE_EVERY):  # the pace of the writes, not a wait for one
            for index in range(PARTITIONS):
                self._producer.produce(
                    self._topic, value=b"v", partition=index, on_delivery=self._on_delivery
                )
            self._producer.poll(0)

    def delivered(self) -> dict[Partition, int]:
        with self._lock:
            assert not self.errors, f"the producer failed: {self.errors[:3]}"
            return dict(self._delivered)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self._producer.flush(10)
        self._producer.close()


class Ours:
    """Our member, with a ``PartitionFetcher`` for each partition it owns."""

    def __init__(self, bootstrap: str, group: str, topic: str, case: Case, name: str) -> None:
        config: GroupConfig | ConsumerGroupConfig
        if case.consumer:
            config = ConsumerGroupConfig(
                group_id=group,
                server_assignor=SERVER_ASSIGNOR,
                session_timeout_ms=SESSION_MS,  # the group's, set by consumer_group_settings
                heartbeat_interval_ms=CONSUMER_HEARTBEAT_MS,
                rebalance_timeout_ms=10_000,
            )
        else:
            config = group_config(group, assignors=tuple(make() for make in case.ours))
            assert config.rebalance_protocol is case.protocol
        self.consumer = case.consumer
        member = GroupMember(client_config(bootstrap), config, name=name)
        member.subscribe([topic])
        self.recorder = Recorder(member, name)
        self.cluster = Cluster(client_config(bootstrap))
        self.fetchers: dict[Partition, PartitionFetcher] = {}
        self.consumed: dict[Partition, int] = {}

    @property
    def owned(self) -> frozenset[Partition]:
        return self.recorder.owned

    @property
    def stable(self) -> bool:
        """Stable, with everything it owns handed to the application. In a KIP-848 group
        the member epoch moves on without an assignment of its own (another member's
        change), so there the last PartitionsAssigned need not carry the current epoch."""
        if not self.consumer:
            return self.recorder.stable
        member = self.recorder.member
        return (
            member.state is MemberState.STABLE
            and bool(self.recorder.of(PartitionsAssigned))
            and self.owned == member.assignment
        )

    def fetch(self) -> None:
        """One Fetch for each partition it owns; drops the fetchers of partitions it does not."""
        owned = self.owned
        for tp in [tp for tp in self.fetchers if tp not in owned]:
            self.fetchers.pop(tp).close()
        for tp in sorted(owned):
            fetcher = self.fetchers.get(tp)
            if fetcher is None:
                fetcher = PartitionFetcher(
                    self.cluster,
                    tp.topic,
                    tp.partition,
                    FetchSettings(max_wait_ms=20),
                    start=StartPosition.earliest(),
                )
                self.fetchers[tp] = fetcher
            result = fetcher.poll(prefetch=False)
            if result.rows:
                self.consumed[tp] = max(result.position - 1, self.consumed.get(tp, -1))

    def commit_and_read_back(self) -> None:
        """Commits the fetchers' positions through the member and reads them back."""
        positions = {tp: fetcher.position for tp, fetcher in self.fetchers.items()}
        offsets = {tp: position for tp, position in positions.items() if position is not None}
        assert set(offsets) == self.owned
        check_commit(self.recorder.member.commit(offsets, timeout=15))
        fetched = self.recorder.member.fetch_committed(offsets, timeout=15)
        assert isinstance(fetched, OffsetsFetched), fetched
        read = {tp: c.offset for tp, c in fetched.offsets.items() if c is not None}
        assert read == offsets

    def close(self) -> list[Event]:
        """Closes the fetchers and the member (it leaves); the events the close gave."""
        for fetcher in self.fetchers.values():
            fetcher.close()
        self.cluster.close()
        if self.recorder.member.alive:
            return self.recorder.member.close()
        return []


class Group:
    """Ours and librdkafka in one group (either may be absent), and every wait on them."""

    def __init__(self, bootstrap: str, group: str, topic: str, case: Case) -> None:
        self.bootstrap = bootstrap
        self.group = group
        self.topic = topic
        self.case = case
        self.everything = partitions(topic, PARTITIONS)
        self.producing = Producing(bootstrap, topic)
        self.ours: Ours | None = None
        self.theirs: ConfluentMember | None = None
        self._joins = 0

    def join_ours(self) -> Ours:
        self._joins += 1
        self.ours = Ours(self.bootstrap, self.group, self.topic, self.case, f"ours{self._joins}")
        return self.ours

    def join_theirs(self) -> ConfluentMember:
        self.theirs = ConfluentMember(
            self.bootstrap,
            self.group,
            self.topic,
            strategy=self.case.theirs,
            remote_assignor=SERVER_ASSIGNOR if self.case.consumer else None,
        )
        return self.theirs

    def owned(self) -> tuple[frozenset[Partition], frozenset[Partition]]:
        """(ours, librdkafka's), checking that no partition is in both."""
        mine = self.ours.owned if self.ours is not None else frozenset()
        its = self.theirs.owned if self.theirs is not None else frozenset()
        assert not mine & its, (
            f"both own {sorted(mine & its)}: ours {sorted(mine)}, librdkafka {sorted(its)}"
        )
        return mine, its

    def check(self) -> None:
        """What must hold at every moment."""
        self.owned()
        if self.theirs is not None:
            assert not self.theirs.errors, f"librdkafka reported {self.theirs.errors}"
            assert not self.theirs.strays, (
                f"librdkafka polled records of partitions it did not own: {self.theirs.strays[:5]}"
            )
            lost = self.theirs.since("lost", 0.0)
            assert not lost, f"librdkafka lost {sorted(lost)}"
        if self.ours is not None:
            lost_events = self.ours.recorder.of(PartitionsLost)
            assert not lost_events, f"ours lost partitions: {lost_events}"

    def until(self, condition: Callable[[], bool], what: str, *, fetch: bool = False) -> float:
        """Polls (and with ``fetch``, fetches for ours) until ``condition``, checking
        ``check`` each time; the time it took."""
        start = time.monotonic()
        end = start + REBALANCE_WAIT

        def checked() -> bool:
            self.check()
            return condition()

        while True:
            if self.ours is not None:
                self.ours.recorder.pump(0.02)
                if fetch:
                    self.ours.fetch()
                if checked():
                    return time.monotonic() - start
            else:
                assert self.theirs is not None
                if self.theirs.wait(checked, max(end - time.monotonic(), 0.0)):
                    return time.monotonic() - start
            if time.monotonic() > end:
                mine, its = self.owned()
                raise AssertionError(
                    f"timed out after {REBALANCE_WAIT:.0f}s waiting for {what}: "
                    f"ours {sorted(mine)}, librdkafka {sorted(its)}"
                )

    def split(self) -> bool:
        mine, its = self.owned()
        return (
            self.ours is not None
            and self.ours.stable
            and mine | its == self.everything
            and len(mine) == len(its) == PARTITIONS // 2
        )

    def wait_for_split(self, what: str) -> None:
        self.until(self.split, what)

    def progress(self, what: str) -> None:
        """Each side consumes, from every partition it owns, a record produced from now on;
        then ours commits its positions through the member and reads them back."""
        marks = self.producing.delivered()

        def consumed_since_marks() -> bool:
            mine, its = self.owned()
            ours_done = self.ours is None or all(
                self.ours.consumed.get(tp, -1) > marks.get(tp, -1) for tp in mine
            )
            theirs_done = self.theirs is None or all(
                self.theirs.consumed.get(tp, -1) > marks.get(tp, -1) for tp in its
            )
            return ours_done and theirs_done

        self.until(consumed_since_marks, f"both to consume new records ({what})", fetch=True)
        if self.ours is not None:
            self.ours.commit_and_read_back()

    def ours_leaves(self) -> Handoff:
        """Ours leaves; how long that took, and until librdkafka owned everything."""
        assert self.ours is not None and self.theirs is not None
        theirs = self.theirs
        member = self.ours.recorder.member
        member_id = member.member_id
        start = time.monotonic()
        events = self.ours.close()
        self.ours = None
        left = time.monotonic() - start
        # It said it left: the group need not wait for its session to expire. A KIP-848
        # member says it with its leaving heartbeat (epoch -1): answered without error, and
        # the coordinator has let it go already (a member that went quietly stays listed
        # until its session expires). The time bound alone cannot tell: closed without the
        # leaving heartbeat, ours handed over in 1.85 s, its session expiring 1.5-2 s after
        # its last heartbeat.
        leave_groups = member.requests_sent(LeaveGroupRequest.api_key)
        if self.case.consumer:
            assert leave_groups == 0
            assert Left() in events, f"ours did not leave cleanly: {events}"
            members = group_members(self.bootstrap, self.group)
            assert member_id not in members, f"ours ({member_id}) is still in {members}"
        else:
            assert leave_groups == 1
        self.until(lambda: theirs.owned == self.everything, "librdkafka to own everything")
        return Handoff("ours", left, time.monotonic() - start)

    def _theirs_member_id(self) -> str:
        """librdkafka's member id, as the coordinator lists it: its ``Consumer.memberid()``,
        called beside the thread that polls, blocked for minutes."""
        assert self.ours is not None
        members = set(group_members(self.bootstrap, self.group))
        others = members - {self.ours.recorder.member.member_id}
        assert len(others) == 1, members
        return others.pop()

    def theirs_leaves(self) -> Handoff:
        """librdkafka leaves; how long that took, and until ours owned everything."""
        assert self.ours is not None and self.theirs is not None
        ours = self.ours
        member_id = self._theirs_member_id() if self.case.consumer else None
        start = time.monotonic()
        self.theirs.close()
        self.theirs = None
        left = time.monotonic() - start
        if member_id is not None:  # as for ours: its leaving heartbeat was taken
            members = group_members(self.bootstrap, self.group)
            assert member_id not in members, f"librdkafka ({member_id}) is still in {members}"
        self.until(lambda: ours.stable and ours.owned == self.everything, "ours to own everything")
        return Handoff("librdkafka", left, time.monotonic() - start)

    def close(self) -> None:
        if self.theirs is not None:
            self.theirs.close()
        if self.ours is not None:
            self.ours.close()
        self.producing.close()


def _librdkafka_kept_its_partitions(
    theirs: ConfluentMember,
    before: frozenset[Partition],
    since: float,
    newcomer: frozenset[Partition],
) -> None:
    revoked = theirs.since("revoke", since)
    assert not revoked & theirs.owned, (
        f"librdkafka was revoked {sorted(revoked & theirs.owned)}, which it kept"
    )
    assert revoked == newcomer == before - theirs.owned
    assert not theirs.since("assign", since), "librdkafka was assigned partitions while one joined"


def _ours_kept_its_partitions(
    ours: Ours, before: frozenset[Partition], since: float, newcomer: frozenset[Partition]
) -> None:
    revoked = ours.recorder.revoked(since)
    assert not revoked & ours.owned, (
        f"ours was revoked {sorted(revoked & ours.owned)}, which it kept"
    )
    assert revoked == newcomer == before - ours.owned
    added = [
        e.added
        for e in ours.recorder.of(PartitionsAssigned, since)
        if isinstance(e, PartitionsAssigned)
    ]
    assert not frozenset().union(*added), f"ours was assigned {added} while one joined"


def consumer_group_settings(bootstrap: str, group: str) -> None:
    """The KIP-848 group's session timeout and heartbeat interval (group configs, Kafka
    3.8+), set before anyone joins: by default 45 s and 5 s."""
    set_group_configs(
        bootstrap,
        group,
        {
            "consumer.session.timeout.ms": SESSION_MS,
            "consumer.heartbeat.interval.ms": CONSUMER_HEARTBEAT_MS,
        },
    )


def group_members(bootstrap: str, group: str) -> list[str]:
    """The member ids the coordinator lists in ``group`` (librdkafka's admin client)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    described = admin.describe_consumer_groups([group])[group].result(timeout=15)
    return [member.member_id for member in described.members]


def _share_hand_over_and_split_again(mixed: Group, test: str) -> None:
    """The five steps of the module docstring, and their checks."""
    case = mixed.case
    ours = mixed.join_ours()
    mixed.until(lambda: ours.stable and ours.owned == mixed.everything, "ours alone")
    mixed.join_theirs()
    mixed.wait_for_split("ours and librdkafka to split")
    if not case.consumer:  # the coordinator assigns in a KIP-848 group: no leader
        assert ours.recorder.member.status.is_leader
    mixed.progress("split")

    mixed.ours_leaves().check(test)
    mixed.progress("librdkafka alone")

    theirs = mixed.theirs
    assert theirs is not None
    before, since = theirs.owned, time.monotonic()
    ours = mixed.join_ours()
    mixed.wait_for_split("ours to rejoin and split")
    assert not ours.recorder.member.status.is_leader
    if case.incremental:
        _librdkafka_kept_its_partitions(theirs, before, since, ours.owned)
    mixed.progress("split after ours rejoined")

    mixed.theirs_leaves().check(test)
    mixed.progress("ours alone")

    before, since = ours.owned, time.monotonic()
    theirs = mixed.join_theirs()
    mixed.wait_for_split("librdkafka to rejoin and split")
    if not case.consumer:
        assert ours.recorder.member.status.is_leader
    if case.incremental:
        _ours_kept_its_partitions(ours, before, since, theirs.owned)
    mixed.progress("split after librdkafka rejoined")


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(DEFAULTS, id="librdkafka-defaults"),
        pytest.param(COOPERATIVE, id="cooperative-sticky"),
    ],
)
def test_ours_and_librdkafka_share_hand_over_and_split_again(
    any_broker: KafkaCluster | TansuBroker,
    request: pytest.FixtureRequest,
    topic: str,
    group: str,
    case: Case,
) -> None:
    if case is DEFAULTS:
        tansu_deviates(
            request,
            reason="Tansu 0.6.0 answers librdkafka's JoinGroup (range, roundrobin) with "
            "INCONSISTENT_GROUP_PROTOCOL in a group whose member offers (cooperative-sticky, "
            "range), although both offer range (docs/kafka-compat.md)",
            raises=AssertionError,
        )
    create_topic(any_broker.bootstrap, topic, partitions=PARTITIONS)
    mixed = Group(any_broker.bootstrap, group, topic, case)
    try:
        _share_hand_over_and_split_again(mixed, request.node.name)
    finally:
        mixed.close()


@pytest.mark.slow
def test_ours_and_librdkafka_share_hand_over_and_split_again_in_a_consumer_protocol_group(
    broker: KafkaCluster, request: pytest.FixtureRequest, topic: str, group: str
) -> None:
    """Case 3, group.protocol=consumer on both sides: Apache Kafka only (Tansu 0.6.0 offers
    no ConsumerGroupHeartbeat)."""
    create_topic(broker.bootstrap, topic, partitions=PARTITIONS)
    consumer_group_settings(broker.bootstrap, group)
    mixed = Group(broker.bootstrap, group, topic, CONSUMER)
    try:
        _share_hand_over_and_split_again(mixed, request.node.name)
    finally:
        mixed.close()
