"""``ingest run``: the engine fed by the consumer group. Partitions come and go with
the group's assignments; offsets are committed after the Delta commit, asynchronously, so
the loop never waits on the coordinator."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

from ingest.client.admin import describe_group, source_topics, topic_partitions
from ingest.config import IngestConfig
from ingest.errors import (
    FencedError,
    GroupError,
    IngestError,
)
from ingest.group import (
    CommitFailed,
    CommittedOffset,
    ConsumerGroupConfig,
    Fatal,
    Fenced,
    MemberState,
    OffsetFetchFailed,
    OffsetsCommitted,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
)
from ingest.logs import event
from ingest.membership.committed import committed_value
from ingest.membership.member import GroupMember
from ingest.membership.until_end import OthersWatch
from ingest.protocol.codec import API_NAMES
from ingest.protocol.partition import Partition
from ingest.sink.batch import BatchResult
from ingest.sink.durable import start_offset, txn_versions
from ingest.supervisor.engine.batches import (
    BatchThread,
)
from ingest.supervisor.engine.partitions import Change, PartitionState, range_done
from ingest.supervisor.engine.runtime import Engine
from ingest.supervisor.engine.source import RunOutcome
from ingest.supervisor.modes.offset_commits import OffsetCommits
from ingest.supervisor.output.metrics import Metrics
from ingest.supervisor.output.progress import Progress
from ingest.supervisor.wiring import (
    member_config,
)
from ingest.worker import EndPosition, StartPosition, WorkerStarted
from ingest.worker.ends import end_offsets

__all__ = ["GroupSource", "group_run"]

log = logging.getLogger("ingest.supervisor")


def group_run(
    config: IngestConfig,
    *,
    until_end: bool = False,
    spark: Any | None = None,
    metrics: Metrics | None = None,
    progress: Progress | None = None,
) -> Engine:
    """The engine of ``ingest run [--until-end]``, fed by the consumer group; ``progress``
    (``--until-end``) reports the records landed of those up to the ends."""
    return Engine(
        config,
        lambda engine: GroupSource(engine, until_end=until_end, progress=progress),
        spark=spark,
        metrics=metrics,
        maintenance=config.maintenance.enabled,
    )


class GroupSource:
    """``ingest run``: the partitions the consumer group assigns, committed after Delta.

    ``until_end``: each partition's end offset is snapshotted at start; the run
    lands everything before it, commits, leaves the group and returns.
    """

    overwrite = False

    def __init__(
        self, engine: Engine, *, until_end: bool = False, progress: Progress | None = None
    ) -> None:
        self.engine = engine
        self.progress = progress or (Progress("until-end") if until_end else None)
        config = engine.config
        self.until_end = until_end
        self.mode = "run --until-end" if until_end else "run"
        self.group = member_config(config)
        self.member: GroupMember | None = None
        self.ends: dict[Partition, int] = {}
        self.no_topics = False  # --until-end, and topic_pattern matched no topic
        self.revocations: deque[frozenset[Partition]] = deque()
        self.joined = False
        # The generation of the last assignment handled: commits are made for it (the
        # classic member refuses them once it is in another; ``Commit``).
        self.generation: int | None = None
        self.commits = OffsetCommits(engine)  # at most one OffsetCommit in flight
        self._revocation_committed = False
        self._others: OthersWatch | None = None  # --until-end: partitions owned elsewhere

    def _member(self) -> GroupMember:
        assert self.member is not None, "the group is joined in start()"
        return self.member

    def on_worker_started(self, state: PartitionState, message: WorkerStarted) -> None:
        """Nothing to check: the group's start offsets come from the group and the table."""

    def complete(self) -> RunOutcome:
        self._show_progress(final=True)
        return self.engine.complete()

    def _show_progress(self, final: bool = False) -> None:
        if self.progress is None:
            return
        batch = self.engine.batch
        in_batch = batch.partitions if batch is not None else frozenset()
        self.progress.update(*range_done(self.engine.states.values(), in_batch), final=final)

    # -- the source: the group ---------------------------------------------------------

    def start(self) -> None:
        assert self.engine.cluster is not None
        source = self.engine.config.source
        topics = source_topics(self.engine.cluster, source.topics, source.topic_pattern)
        try:
            partitions = topic_partitions(self.engine.cluster, topics)
        except IngestError as exc:
            raise IngestError(
                f"cannot read the metadata of {', '.join(topics)} from "
                f"{', '.join(self.engine.config.kafka.bootstrap_servers)}: {exc}"
            ) from exc
        if self.until_end:
            self.ends = end_offsets(self.engine.cluster, partitions, self.engine.fetch)
            event(
                log,
                "end_offsets",
                ends={str(p): o for p, o in sorted(self.ends.items())},
            )
            # The table lacks offsets below the ends: a batch will come, so the JVM starts
            # now, overlapping the JoinGroup and the fetching.
            durable = txn_versions(self.engine.router, partitions)
            if any(end > (start_offset(None, durable[p]) or 0) for p, end in self.ends.items()):
                self.engine.lander.warm()
        else:
            self.engine.lander.warm()
        # A pattern is looked at again while the run goes on; --until-end lands the topics
        # it matched at the start.
        pattern = None if self.until_end else source.topic_pattern
        self.member = GroupMember(
            self.engine.client,
            self.group,
            notify=self.engine.wakeup.set,
            topic_pattern=pattern,
            pattern_refresh=float(source.metadata_refresh),
        )
        if topics:
            self.member.subscribe(topics)
        elif self.until_end:
            self.no_topics = True  # nothing matches the pattern: nothing to land
        event(
            log,
            "joining",
            group=self.group.group_id,
            topics=",".join(topics),
            topic_pattern=source.topic_pattern,
            protocol=(
                "consumer"
                if isinstance(self.group, ConsumerGroupConfig)
                else self.group.rebalance_protocol.value
            ),
            static=self.group.is_static,
        )

    def poll(self) -> None:
        member = self._member()
        try:
            events = member.poll(0.0)
        except GroupError as exc:
            raise GroupError(f"the group membership failed: {exc}") from exc
        for item in events:
            if isinstance(item, OffsetsCommitted | CommitFailed):
                self.commits.done(item)
            elif isinstance(item, PartitionsAssigned):
                self._assigned(item)
            elif isinstance(item, PartitionsRevoked):
                self._revoked(item.partitions)
            elif isinstance(item, PartitionsLost):
                self._lost(item.partitions, item.reason)
            elif isinstance(item, Fenced):
                raise FencedError(f"fenced out of group {self.group.group_id!r}: {item.reason}")
            elif isinstance(item, Fatal):
                error = item.exception()  # RemoteProtocolError, LocalProtocolError or GroupError
                raise type(error)(
                    f"group {self.group.group_id!r}: {item.error_name}: {item.message}"
                    + self._fatal_hint(item)
                ) from error

    def _fatal_hint(self, fatal: Fatal) -> str:
        """For a group whose members' protocols ingest cannot join: theirs, and what to set."""
        if fatal.error_name != "INCONSISTENT_GROUP_PROTOCOL":
            return ""
        theirs = "unknown (DescribeGroups failed)"
        if self.engine.cluster is not None:
            try:
                found = describe_group(self.engine.cluster, self.group.group_id)
                theirs = f"protocol type {found.protocol_type!r}, assignor {found.protocol!r}"
            except IngestError:
                pass
        return (
            f"; the group's members use {theirs}, ingest offered "
            f"{', '.join(self.engine.config.source.assignors)} "
            f"({self.engine.config.source.group_protocol} protocol): set source.assignors to "
            "include the members' assignor, or source.group_protocol, or use another group_id"
        )

    def _assigned(self, assigned: PartitionsAssigned) -> None:
        self.joined = True
        self.generation = assigned.generation_id
        self.engine.metrics.inc("ingest_rebalances_total")
        new = sorted(p for p in assigned.assignment if p not in self.engine.states)
        event(
            log,
            "partitions_assigned",
            generation=assigned.generation_id,
            member_id=assigned.member_id,
            assignment=",".join(str(p) for p in sorted(assigned.assignment)),
            new=",".join(str(p) for p in new),
        )
        if not new:
            return
        if self.engine.stopping:
            # Partitions handed over while we stop (another member left first): starting
            # workers now would hold the stop up; leaving the group hands them on.
            event(
                log,
                "partitions_not_started",
                level=logging.WARNING,
                partitions=",".join(str(p) for p in new),
                reason="assigned while stopping; leaving the group hands them on",
            )
            return
        fetched = self._fetch_committed(new)
        committed = {p: committed_value(fetched[p]) for p in new}
        durable = txn_versions(self.engine.router, new)
        missing = [p for p in new if self.until_end and p not in self.ends]
        if missing:
            assert self.engine.cluster is not None
            self.ends.update(end_offsets(self.engine.cluster, missing, self.engine.fetch))
        repairs: dict[Partition, int] = {}
        for partition in new:
            offset = start_offset(committed[partition], durable[partition])
            restored = fetched[partition]
            if offset is not None:
                # The committed leader epoch goes with the committed offset only: a table
                # ahead of the group (a crash between the commits) leaves it unknown.
                epoch = restored.leader_epoch if restored and restored.offset == offset else -1
                start = StartPosition.offset(offset, epoch)
            elif self.engine.config.source.auto_offset_reset == "latest":
                start = StartPosition.latest()
            else:
                start = StartPosition.earliest()
            end = EndPosition.offset(self.ends[partition]) if self.until_end else None
            state = self.engine.new_state(partition, start, end)
            state.committed = committed[partition]
            version = durable[partition]
            state.durable_next = None if version is None else version + 1
            if offset is not None and (committed[partition] or 0) < offset:
                # The table is ahead of the group (a crash between the two commits).
                repairs[partition] = offset
            if offset is None and self.engine.config.source.auto_offset_reset == "fail":
                state.change(
                    Change.FAIL, failure="no committed offset and source.auto_offset_reset = fail"
                )
                continue
            if end is not None and offset is not None and offset > self.ends[partition]:
                # The log ends below what the group and the table hold: truncated under
                # them (an unclean election) or re-created. The worker validates the
                # position (OffsetForLeaderEpoch) before it finishes at once.
                event(
                    log,
                    "end_below_position",
                    level=logging.WARNING,
                    partition=str(partition),
                    end=self.ends[partition],
                    position=offset,
                )
            elif end is not None and offset is not None and offset == self.ends[partition]:
                state.change(Change.FINISH)
                state.first_offset = state.landed_next = state.resume_offset = offset
                continue
            self.engine.spawn(state)
        if repairs:
            # The table is ahead of the group: commit what it holds (now, or on a later step
            # when another commit is in flight).
            event(
                log,
                "commit_repair",
                level=logging.WARNING,
                offsets={str(p): o for p, o in sorted(repairs.items())},
                group_offsets={str(p): committed[p] for p in sorted(repairs)},
                reason="the group's committed offsets are behind the table's (a crash between "
                "the Delta commit and the offset commit, or a reset such as "
                "kafka-consumer-groups --reset-offsets): exactly once keeps the table's; to "
                "land a range again, use `ingest replay`",
            )
            self._commit_owned(repairs)

    def _fetch_committed(
        self, partitions: list[Partition]
    ) -> dict[Partition, CommittedOffset | None]:
        deadline = time.monotonic() + float(self.engine.config.kafka.retry_timeout)
        while True:
            answer = self._member().fetch_committed(
                partitions, timeout=float(self.engine.config.kafka.request_timeout) + 5
            )
            if not isinstance(answer, OffsetFetchFailed):
                return {p: answer.offsets.get(p) for p in partitions}
            if not answer.retriable or time.monotonic() > deadline:
                raise GroupError(
                    f"OffsetFetch for {', '.join(map(str, partitions))} failed: "
                    f"{answer.error_name}: {answer.message}"
                )
            time.sleep(0.2)

    def _revoked(self, partitions: frozenset[Partition]) -> None:
        event(log, "partitions_revoked", partitions=",".join(str(p) for p in sorted(partitions)))
        for partition in partitions:
            state = self.engine.states.get(partition)
            if state is None:
                continue
            state.abandon = True
            self.engine.retire(state)
            self.engine.abandon_pending(state)
        self.revocations.append(partitions)

    def _lost(self, partitions: frozenset[Partition], reason: str) -> None:
        event(
            log,
            "partitions_lost",
            level=logging.WARNING,
            partitions=",".join(str(p) for p in sorted(partitions)),
            reason=reason,
        )
        self.engine.metrics.inc("ingest_partitions_lost_total", len(partitions))
        for partition in partitions:
            state = self.engine.states.pop(partition, None)
            if state is None:
                continue
            state.abandon = True
            self.engine.retire(state)
            self.engine.abandon_pending(state)
            self.engine.metrics.remove(
                "ingest_partition_failed", topic=partition.topic, partition=partition.partition
            )

    def after_step(self) -> None:
        self._show_progress()
        self._process_revocations()
        if time.monotonic() >= self.commits.after:
            self._commit_owned()

    def _process_revocations(self) -> None:
        while self.revocations:
            partitions = self.revocations[0]
            if self.engine.batch is not None and self.engine.batch.partitions & partitions:
                return  # the in-flight batch holding them finishes first
            if self.commits.in_flight is not None:
                return  # its outcome first: the committed offsets must be known
            if not self._revocation_committed:
                self._revocation_committed = True
                if self._commit_owned(partitions):
                    return  # given up once the commit's outcome is in, kept or failed
            for partition in partitions:
                self.engine.states.pop(partition, None)
            self.revocations.popleft()
            self._revocation_committed = False
            self._member().revocation_done()

    # -- commits -----------------------------------------------------------------------

    def _commit_target(self, state: PartitionState) -> int | None:
        return self.commits.target(state)

    def _commit_owned(self, only: Iterable[Partition] | None = None) -> bool:
        """Sends an OffsetCommit of what is durable and not yet committed, unless one is
        in flight; returns whether it sent one."""
        return self.commits.send(self._member(), self._committable(), self.generation, only)

    def _committable(self) -> frozenset[Partition]:
        revoking = frozenset().union(*self.revocations) if self.revocations else frozenset()
        return frozenset(self._member().assignment) | revoking

    def after_batch(self, batch: BatchThread, result: BatchResult) -> None:
        self._commit_owned(batch.partitions)

    # -- ending ------------------------------------------------------------------------

    def draining(self) -> bool:
        if self.engine.stopping:
            return True
        return self.until_end and not any(s.live for s in self.engine.states.values())

    def _settled(self, state: PartitionState) -> bool:
        if not (state.finished or state.failed) or len(state.pending):
            return False
        target = self._commit_target(state)
        return target is None or (state.committed is not None and state.committed >= target)

    def _uncommitted(self) -> list[Partition]:
        """Owned partitions whose durable offset the group does not hold yet."""
        owned = self._committable()
        behind = []
        for partition in owned:
            state = self.engine.states.get(partition)
            if state is None:
                continue
            target = self._commit_target(state)
            if target is not None and (state.committed is None or state.committed < target):
                behind.append(partition)
        return sorted(behind)

    def finished(self) -> bool:
        if self.no_topics:
            return True
        if self.commits.in_flight is not None:
            return False
        if self.engine.stopping:
            if not self.engine.shutdown_done() or self.revocations:
                return False
            # A commit refused mid-rebalance (REBALANCE_IN_PROGRESS) is retried until the
            # group holds what the table holds, while the member can still commit; the
            # shutdown deadline bounds the wait.
            member = self.member
            if member is None or member.state in (MemberState.FENCED, MemberState.FAILED):
                return True
            if not member.alive:
                return True
            return not self._uncommitted()
        if not self.until_end or not self.joined or self.engine.batch is not None:
            return False
        if self.revocations or self._member().state is not MemberState.STABLE:
            return False
        if not all(self._settled(s) for s in self.engine.states.values()):
            return False
        if self._others is None:
            self._others = OthersWatch(self.ends, self._fetch_committed)
        return self._others.landed(self.engine.states.keys(), time.monotonic())

    def close(self, outcome_ok: bool) -> None:
        member = self.member
        if member is None:
            return
        # With a batch still in flight nothing more is committed: whoever takes over
        # lands its rows again, and the txn filter keeps each of them once.
        member.close(timeout=float(self.engine.config.kafka.request_timeout) + 5)
        event(log, "left_group", group=self.group.group_id, static=self.group.is_static)

    def status(self) -> dict[str, Any]:
        member = self.member
        if member is None:
            return {"group": self.group.group_id}
        status = member.status
        for api_key, count in member.requests_sent_by_api().items():
            name = API_NAMES.get(api_key, str(api_key))
            self.engine.metrics.advance_to("ingest_group_requests_total", count, api=name)
        return {
            "group": self.group.group_id,
            "member_id": status.member_id,
            "generation": status.generation_id,
            "member_state": status.state.value,
        }
