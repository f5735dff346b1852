"""A group's committed offsets, read without joining it: an OffsetFetch to its coordinator."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from ingest.client import Cluster
from ingest.client.connection import expect_response
from ingest.errors import BrokerError
from ingest.group import CommittedOffset
from ingest.group.requests import fetch_outcome, offset_fetch_request
from ingest.protocol.error_codes import error_for
from ingest.protocol.messages import OffsetFetchRequest, OffsetFetchResponse
from ingest.protocol.partition import Partition

__all__ = ["as_offsets", "committed_offsets", "committed_value"]


def committed_offsets(
    cluster: Cluster, group: str, partitions: Iterable[Partition]
) -> dict[Partition, CommittedOffset | None]:
    """The group's committed offsets (OffsetFetch to its coordinator)."""
    wanted = sorted(set(partitions))
    if not wanted:
        return {}

    def attempt() -> dict[Partition, CommittedOffset | None]:
        coordinator = cluster.find_coordinator(group)
        connection = cluster.connection(coordinator.node_id)
        version = connection.version_for(OffsetFetchRequest.api_key)
        context = f"{connection.describe()}, OffsetFetch v{version}, group {group!r}"
        response = expect_response(
            cluster.request(connection, offset_fetch_request(group, wanted, version=version)),
            OffsetFetchResponse,
            context,
        )
        outcome = fetch_outcome(response, group, wanted)
        if outcome.error_code:
            info = error_for(outcome.error_code)
            raise BrokerError(
                info.code,
                info.name,
                outcome.retriable or info.retriable,
                context=context + (f", {outcome.detail}" if outcome.detail else ""),
            )
        return outcome.offsets

    return cluster.retrying(f"OffsetFetch of group {group!r}", attempt)


def committed_value(offset: CommittedOffset | None) -> int | None:
    return None if offset is None else offset.offset


def as_offsets(values: Mapping[Partition, CommittedOffset | None]) -> dict[Partition, int | None]:
    return {p: committed_value(v) for p, v in values.items()}
