"""ListOffsets, routed per leader: ``Cluster.list_offsets`` runs ``list_offsets`` here.

One request per leader, pipelined; partitions whose leader moved are retried
after a metadata refresh, within the cluster's ``retrying``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ingest.client.connection import BrokerConnection, InFlight, expect_response
from ingest.errors import BrokerError, ProtocolError
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import (
    ListOffsetsPartition,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ListOffsetsTopic,
)
from ingest.protocol.partition import Partition

if TYPE_CHECKING:
    from ingest.client.cluster import Cluster

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "ListedOffset", "list_offsets"]

READ_UNCOMMITTED = 0
READ_COMMITTED = 1


@dataclass(frozen=True, slots=True)
class ListedOffset:
    offset: int
    timestamp: int
    leader_epoch: int


def list_offsets(
    cluster: Cluster, timestamps: Mapping[Partition, int], *, isolation_level: int
) -> dict[Partition, ListedOffset]:
    """ListOffsets for each partition (timestamp, or EARLIEST/LATEST_TIMESTAMP)."""
    pending = {Partition(*tp): ts for tp, ts in timestamps.items()}
    results: dict[Partition, ListedOffset] = {}

    def attempt() -> dict[Partition, ListedOffset]:
        by_node: dict[int, list[Partition]] = {}
        for tp in pending:
            by_node.setdefault(cluster.leader(tp.topic, tp.partition).node_id, []).append(tp)
        sent: list[tuple[BrokerConnection, InFlight, list[Partition]]] = []
        try:
            for node_id, tps in by_node.items():
                connection = cluster.connection(node_id)
                request = ListOffsetsRequest(
                    isolation_level=isolation_level,
                    topics=tuple(
                        ListOffsetsTopic(
                            name=name,
                            partitions=tuple(
                                ListOffsetsPartition(
                                    partition_index=tp.partition,
                                    current_leader_epoch=cluster.leader_epoch(
                                        tp.topic, tp.partition
                                    ),
                                    timestamp=pending[tp],
                                )
                                for tp in tps
                                if tp.topic == name
                            ),
                        )
                        for name in dict.fromkeys(tp.topic for tp in tps)
                    ),
                )
                sent.append((connection, cluster.send(connection, request), tps))
        except BaseException:
            for connection, ticket, _ in sent:
                connection.abandon(ticket)
            raise
        received: list[tuple[str, ListOffsetsResponse, list[Partition]]] = []
        try:
            for connection, ticket, tps in sent:
                context = f"{connection.describe()}, ListOffsets v{ticket.version}"
                response = cluster.receive(connection, ticket)
                received.append(
                    (context, expect_response(response, ListOffsetsResponse, context), tps)
                )
        except BaseException:
            for other, later, _ in sent[len(received) + 1 :]:
                other.abandon(later)
            raise
        retry: BrokerError | None = None
        for context, response, tps in received:
            answered: dict[Partition, tuple[int, int, int, int]] = {}
            for topic in response.topics:
                for p in topic.partitions:
                    answered[Partition(topic.name, p.partition_index)] = (
                        p.error_code,
                        p.offset,
                        p.timestamp,
                        p.leader_epoch,
                    )
            for tp in tps:
                if tp not in answered:
                    raise ProtocolError(f"{context}: no answer for {tp}")
                code, offset, timestamp, epoch = answered[tp]
                if code:
                    info = error_for(code)
                    error = BrokerError(
                        info.code,
                        info.name,
                        info.retriable,
                        context=f"{context}, {tp}",
                        message=info.description,
                    )
                    if not cluster.note_error(code, tp.topic):
                        raise error
                    retry = error
                    continue
                results[tp] = ListedOffset(offset, timestamp, epoch)
                del pending[tp]
        if retry is not None:
            raise retry
        return results

    return cluster.retrying("ListOffsets", attempt)
