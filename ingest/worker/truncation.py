"""Validating a restored position against the log (KIP-320): OffsetForLeaderEpoch.

A position restored from a committed offset carries the committed leader epoch, the
epoch of the last record consumed before it. The leader answers OffsetForLeaderEpoch
with the end offset of that epoch in its log now (the first offset of the next epoch,
or the log end). An end offset below the position means the log diverged there: an
unclean leader election (or a lost disk) truncated records that were read and are in
the table, and other records may now sit at those offsets.

What follows is the ``auto_offset_reset`` policy, never a silent skip or re-read:

* ``fail``: ``LogTruncationError``; the partition stops, and the message names the
  diverged span and how to land the broker's records now at those offsets.
* ``earliest`` / ``latest``: the position stays (the table already holds offsets below
  it, so reading them again would put a second row at an offset), and an error is
  logged naming the span, which ``ingest replay --overwrite`` can land again.

A broker without OffsetForLeaderEpoch (Tansu 0.6.0) cannot be asked: the position is
used as it is, and a debug line says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ingest.client.cluster import Cluster
from ingest.client.connection import expect_response
from ingest.errors import BrokerError, LogTruncationError, ProtocolError
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import (
    OffsetForLeaderEpochRequest,
    OffsetForLeaderEpochResponse,
    OffsetForLeaderPartition,
    OffsetForLeaderTopic,
)
from ingest.protocol.partition import Partition

__all__ = ["Divergence", "epoch_end_offset", "validate_position"]

log = logging.getLogger("ingest.worker")


@dataclass(frozen=True, slots=True)
class Divergence:
    """The log now ends the committed epoch at ``end_offset`` (in its epoch
    ``leader_epoch``), below the restored ``position``."""

    position: int
    committed_epoch: int
    end_offset: int
    leader_epoch: int


def epoch_end_offset(cluster: Cluster, tp: Partition, epoch: int) -> tuple[int, int] | None:
    """(leader epoch, end offset) of ``epoch`` at the partition's leader: the largest
    epoch at or below it that the log holds, and where it ends. None: the broker does
    not offer OffsetForLeaderEpoch."""

    def attempt() -> tuple[int, int] | None:
        connection = cluster.leader_connection(tp.topic, tp.partition)
        negotiation = connection.negotiation
        if negotiation is None or not negotiation.speaks(OffsetForLeaderEpochRequest.api_key):
            return None
        request = OffsetForLeaderEpochRequest(
            topics=(
                OffsetForLeaderTopic(
                    topic=tp.topic,
                    partitions=(
                        OffsetForLeaderPartition(
                            partition=tp.partition,
                            current_leader_epoch=cluster.leader_epoch(tp.topic, tp.partition),
                            leader_epoch=epoch,
                        ),
                    ),
                ),
            )
        )
        context = f"{connection.describe()}, OffsetForLeaderEpoch of {tp} at epoch {epoch}"
        response = expect_response(
            cluster.request(connection, request), OffsetForLeaderEpochResponse, context
        )
        answer = next(
            (
                p
                for t in response.topics
                if t.topic == tp.topic
                for p in t.partitions
                if p.partition == tp.partition
            ),
            None,
        )
        if answer is None:
            raise ProtocolError(f"{context}: the answer does not name the partition")
        if answer.error_code:
            info = error_for(answer.error_code)
            cluster.note_error(answer.error_code, tp.topic)
            raise BrokerError(info.code, info.name, info.retriable, context=context)
        return answer.leader_epoch, answer.end_offset

    return cluster.retrying(f"OffsetForLeaderEpoch of {tp}", attempt)


def validate_position(
    cluster: Cluster, tp: Partition, position: int, committed_epoch: int, policy: str
) -> Divergence | None:
    """Checks that the log still holds the records before ``position`` in
    ``committed_epoch``. Returns the divergence found (after logging it) unless
    ``policy`` is ``fail``, which raises ``LogTruncationError`` instead."""
    if committed_epoch < 0:
        return None
    answer = epoch_end_offset(cluster, tp, committed_epoch)
    if answer is None:
        log.debug(
            "%s: the broker offers no OffsetForLeaderEpoch; position %d not validated", tp, position
        )
        return None
    leader_epoch, end_offset = answer
    if end_offset >= position and leader_epoch >= 0:
        return None
    divergence = Divergence(position, committed_epoch, end_offset, leader_epoch)
    if end_offset < 0 or leader_epoch < 0:
        span = f"the log holds no epoch at or below {committed_epoch} any more"
        first = 0
    else:
        span = (
            f"the log ends epoch {committed_epoch} at offset {end_offset} "
            f"(as epoch {leader_epoch}), below the committed position {position}"
        )
        first = end_offset
    message = (
        f"{tp}: the log was truncated below the position restored: {span}. Offsets "
        f"{first}-{position - 1} were read into the table but are no longer the broker's "
        "(an unclean leader election?); records the broker holds there now were not read. "
        "To land them in place of the table's, once the log has passed offset "
        f"{position}: ingest replay --overwrite --partitions {tp.partition} "
        f"--from {first} --to latest"
    )
    if policy == "fail":
        raise LogTruncationError(
            message, topic=tp.topic, partition=tp.partition, first_offset=first, position=position
        )
    log.error("%s; going on from %d (source.auto_offset_reset = %s)", message, position, policy)
    return divergence
