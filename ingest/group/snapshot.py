"""The assignment snapshot the cooperative-sticky leader writes into every member's user_data.

Each member keeps the snapshot from its last SyncGroup. A member that becomes
leader later (even one that never led) reads the previous assignment of the
whole group from it, so it stays sticky when members report no owned
partitions (eager rebalances, restarted static members, v0 subscriptions).

Binary layout (big-endian, Kafka's non-flexible primitives)::

    magic          4 bytes  b"INGS"
    version        int16    0
    generation_id  int32    generation the assignment was made for
    members        int32 count, then per member:
        member_id          string  (int16 length + UTF-8)
        group_instance_id  nullable string (length -1 = null)
        partitions         int32 count, then per topic:
            topic          string
            partitions     int32 count, then int32 each
        pending            same layout: partitions promised to this member once
                           their current owner has revoked them (cooperative)

A newer version only appends fields; a reader reads the fields it knows.
Bytes without the magic (another client's user_data) decode to ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import cast

from ingest.errors import DecodeError
from ingest.group.types import java_order, partitions_by_topic
from ingest.protocol import primitives as p
from ingest.protocol.consumer import TopicPartition
from ingest.protocol.partition import Partition
from ingest.protocol.primitives import Reader
from ingest.protocol.schema import INT32, STRING, Struct, array, spec
from ingest.protocol.struct_codec import codec_for

__all__ = [
    "SNAPSHOT_MAGIC",
    "SNAPSHOT_VERSION",
    "AssignmentSnapshot",
    "SnapshotMember",
    "decode_snapshot",
    "encode_snapshot",
]

SNAPSHOT_MAGIC = b"INGS"
SNAPSHOT_VERSION = 0


@dataclass(frozen=True, kw_only=True, slots=True)
class SnapshotMember(Struct):
    member_id: str = spec(STRING, "0+")
    group_instance_id: str | None = spec(STRING, "0+", nullable="0+", default=None)
    partitions: tuple[TopicPartition, ...] = spec(array(TopicPartition), "0+")
    pending: tuple[TopicPartition, ...] = spec(array(TopicPartition), "0+")

    def partition_set(self) -> frozenset[Partition]:
        return _flatten(self.partitions)

    def pending_set(self) -> frozenset[Partition]:
        return _flatten(self.pending)


def _flatten(grouped: tuple[TopicPartition, ...]) -> frozenset[Partition]:
    return frozenset(Partition(tp.topic, index) for tp in grouped for index in tp.partitions)


def _grouped(partitions: Iterable[Partition]) -> tuple[TopicPartition, ...]:
    return tuple(
        TopicPartition(topic=topic, partitions=tuple(indexes))
        for topic, indexes in partitions_by_topic(partitions).items()
    )


@dataclass(frozen=True, kw_only=True, slots=True)
class AssignmentSnapshot(Struct):
    generation_id: int = spec(INT32, "0+")
    members: tuple[SnapshotMember, ...] = spec(array(SnapshotMember), "0+")

    @classmethod
    def build(
        cls,
        generation_id: int,
        assignment: Mapping[str, Iterable[Partition]],
        instance_ids: Mapping[str, str | None],
        pending: Mapping[str, Iterable[Partition]] | None = None,
    ) -> AssignmentSnapshot:
        members = tuple(
            SnapshotMember(
                member_id=member_id,
                group_instance_id=instance_ids.get(member_id),
                partitions=_grouped(assignment[member_id]),
                pending=_grouped(pending.get(member_id, ()) if pending else ()),
            )
            for member_id in sorted(assignment, key=java_order)
        )
        return cls(generation_id=generation_id, members=members)


def encode_snapshot(snapshot: AssignmentSnapshot) -> bytes:
    buf = bytearray(SNAPSHOT_MAGIC)
    p.write_int16(buf, SNAPSHOT_VERSION)
    codec_for(AssignmentSnapshot, 0, False).encode_into(buf, snapshot)
    return bytes(buf)


def decode_snapshot(data: bytes | None) -> AssignmentSnapshot | None:
    """The snapshot in ``data``, or None when ``data`` is absent, foreign or corrupt.

    A bad snapshot only costs stickiness, never correctness, so it is dropped
    rather than raised.
    """
    if not data or not data.startswith(SNAPSHOT_MAGIC):
        return None
    reader = Reader(data, len(SNAPSHOT_MAGIC))
    try:
        version = reader.int16()
        if version < 0:
            return None
        snapshot = codec_for(AssignmentSnapshot, 0, False).decode(reader)
        if version == SNAPSHOT_VERSION:
            reader.expect_end("assignment snapshot")
    except DecodeError:
        return None
    return cast(AssignmentSnapshot, snapshot)
