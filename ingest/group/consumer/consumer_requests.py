"""The consumer protocol's ConsumerGroupHeartbeat requests, built from what the member knows.

Heartbeats follow Kafka's consumer: every field when joining or after an error,
afterwards only the fields that changed since the last one sent (``SentFields``);
``topic_partitions`` is what the member owns (those being revoked included, until
RevocationDone), by topic id. The leaving heartbeat carries epoch -1 (or -2 for a
static member). Pure functions.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from ingest.group.consumer.consumer_config import ConsumerGroupConfig
from ingest.group.types import partitions_by_topic
from ingest.protocol.messages import ConsumerGroupHeartbeatRequest, TopicPartitions
from ingest.protocol.partition import Partition

__all__ = ["HEARTBEAT", "REGEX_VERSION", "SentFields", "heartbeat_request", "leave_request"]

HEARTBEAT = ConsumerGroupHeartbeatRequest.api_key
#: ConsumerGroupHeartbeat carries ``subscribed_topic_regex`` from v1.
REGEX_VERSION = 1


@dataclass
class SentFields:
    """The fields of the last heartbeat that carried them; None: never sent (send it)."""

    rebalance_timeout_ms: int | None = None
    rack_id: str | None = None
    topics: frozenset[str] | None = None
    regex: str | None = None
    server_assignor: str | None = None
    owned: frozenset[Partition] | None = None


def heartbeat_request(
    config: ConsumerGroupConfig,
    sent: SentFields | None,
    *,
    joining: bool,
    topics: frozenset[str],
    regex: str | None,
    owned: frozenset[Partition],
    member_id: str,
    member_epoch: int,
    names: Mapping[uuid.UUID, str],
    target: Mapping[uuid.UUID, frozenset[int]] | None,
    version: int,
) -> tuple[ConsumerGroupHeartbeatRequest, SentFields]:
    """The next heartbeat, and the fields it sends: every field when ``joining`` or after
    an error (``sent`` None), else what changed since ``sent``. ``owned``: what the
    member owns, those being revoked included (a joining member reports nothing)."""
    last = SentFields() if joining or sent is None else sent
    owned = frozenset() if joining else owned
    now_sent = SentFields(
        rebalance_timeout_ms=config.rebalance_timeout_ms,
        rack_id=config.rack_id,
        topics=topics if regex is None else frozenset(),
        regex=regex,
        server_assignor=config.server_assignor,
        owned=owned,
    )
    subscribed: tuple[str, ...] | None = None
    subscribed_regex: str | None = None
    if regex is None:
        if topics != last.topics:
            subscribed = tuple(sorted(topics))
        if last.regex is not None and version >= REGEX_VERSION:
            subscribed_regex = ""  # an empty regex clears the one sent before (v1)
    else:
        if regex != last.regex:
            subscribed_regex = regex
        if last.topics:
            subscribed = ()  # an empty list clears the names sent before
    request = ConsumerGroupHeartbeatRequest(
        group_id=config.group_id,
        member_id=member_id,
        member_epoch=member_epoch,
        instance_id=config.group_instance_id,
        rack_id=config.rack_id if config.rack_id != last.rack_id else None,
        rebalance_timeout_ms=(
            config.rebalance_timeout_ms
            if config.rebalance_timeout_ms != last.rebalance_timeout_ms
            else -1
        ),
        subscribed_topic_names=subscribed,
        subscribed_topic_regex=subscribed_regex,
        server_assignor=(
            config.server_assignor if config.server_assignor != last.server_assignor else None
        ),
        topic_partitions=_by_topic_id(owned, names, target) if owned != last.owned else None,
    )
    return request, now_sent


def leave_request(
    config: ConsumerGroupConfig, member_id: str, epoch: int
) -> ConsumerGroupHeartbeatRequest:
    """The leaving heartbeat: ``epoch`` -1 leaves for good, -2 keeps a static member's
    assignment for its restart."""
    return ConsumerGroupHeartbeatRequest(
        group_id=config.group_id,
        member_id=member_id,
        member_epoch=epoch,
        instance_id=config.group_instance_id,
    )


def _by_topic_id(
    partitions: frozenset[Partition],
    names: Mapping[uuid.UUID, str],
    target: Mapping[uuid.UUID, frozenset[int]] | None,
) -> tuple[TopicPartitions, ...]:
    # A name may have had two ids (a topic deleted and created again): the target's wins.
    target = target or {}
    ids: dict[str, uuid.UUID] = {}
    for topic_id, name in names.items():
        if name not in ids or topic_id in target:
            ids[name] = topic_id
    return tuple(
        TopicPartitions(topic_id=ids[topic], partitions=tuple(indexes))
        for topic, indexes in partitions_by_topic(partitions).items()
    )
