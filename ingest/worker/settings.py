"""What a partition worker is told: fetch settings, where to start, where to end, its caps."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ingest.client.client_config import ClientConfig
from ingest.errors import ConfigError
from ingest.handoff.location import HandoffLocation

__all__ = [
    "EndPosition",
    "FetchSettings",
    "StartPosition",
    "WorkerSettings",
]

IsolationLevel = Literal["read_uncommitted", "read_committed"]
OffsetResetPolicy = Literal["earliest", "latest", "fail"]
StartKind = Literal["offset", "earliest", "latest", "timestamp"]
EndKind = Literal["offset", "latest", "timestamp"]

_INT32_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a worker starts: a committed offset, the earliest or latest offset, or a
    timestamp (the first record whose timestamp is at or after it).

    An offset restored from a commit carries the committed ``leader_epoch`` (the epoch
    of the last record before it; -1: unknown), which the worker validates with
    OffsetForLeaderEpoch before its first Fetch (``truncation.py``)."""

    kind: StartKind
    value: int | None = None
    leader_epoch: int = -1

    def __post_init__(self) -> None:
        if self.kind not in ("offset", "earliest", "latest", "timestamp"):
            raise ConfigError(f"unknown start {self.kind!r}", key="start")
        needs_value = self.kind in ("offset", "timestamp")
        if needs_value != (self.value is not None):
            raise ConfigError(f"start {self.kind!r} {'needs' if needs_value else 'takes no'} value")
        if self.value is not None and self.value < 0:
            raise ConfigError(f"start {self.kind} must be >= 0, got {self.value}", key="start")
        if self.leader_epoch >= 0 and self.kind != "offset":
            raise ConfigError(f"a {self.kind} start has no leader epoch", key="start")

    @classmethod
    def offset(cls, offset: int, leader_epoch: int = -1) -> StartPosition:
        return cls("offset", offset, leader_epoch)

    @classmethod
    def earliest(cls) -> StartPosition:
        return cls("earliest")

    @classmethod
    def latest(cls) -> StartPosition:
        return cls("latest")

    @classmethod
    def timestamp(cls, timestamp_ms: int) -> StartPosition:
        return cls("timestamp", timestamp_ms)


@dataclass(frozen=True, slots=True)
class EndPosition:
    """Where a bounded run ends (exclusive).

    ``offset``: before that offset (the run waits for records up to it).
    ``latest``: at the end of the partition when the run starts.
    ``timestamp``: before the first record whose timestamp is at or after it,
    and at the latest at the end of the partition when the run starts.
    """

    kind: EndKind
    value: int | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("offset", "latest", "timestamp"):
            raise ConfigError(f"unknown end {self.kind!r}", key="end")
        needs_value = self.kind != "latest"
        if needs_value != (self.value is not None):
            raise ConfigError(f"end {self.kind!r} {'needs' if needs_value else 'takes no'} value")
        if self.value is not None and self.value < 0:
            raise ConfigError(f"end {self.kind} must be >= 0, got {self.value}", key="end")

    @classmethod
    def offset(cls, offset: int) -> EndPosition:
        return cls("offset", offset)

    @classmethod
    def latest(cls) -> EndPosition:
        return cls("latest")

    @classmethod
    def timestamp(cls, timestamp_ms: int) -> EndPosition:
        return cls("timestamp", timestamp_ms)


@dataclass(frozen=True, kw_only=True, slots=True)
class FetchSettings:
    """Fetch request settings (Kafka's consumer defaults, except a larger partition size:
    a worker fetches one partition, so one partition's share is the whole request; and
    ``min_bytes``, 64 KiB rather than 1 byte, so that a busy partition's answer carries
    many records: a worker with an end asks for 1 byte, ``Fetcher._send``)."""

    max_wait_ms: int = 500
    min_bytes: int = 64 * 1024
    max_bytes: int = 50 * 1024 * 1024
    partition_max_bytes: int = 8 * 1024 * 1024
    isolation_level: IsolationLevel = "read_committed"
    auto_offset_reset: OffsetResetPolicy = "earliest"
    check_crc: bool = False
    incremental_sessions: bool = True
    # Automatic growth for a batch larger than the fetch size stops here.
    max_fetch_bytes_limit: int = 64 * 1024 * 1024
    # Most bytes one answer is decompressed to (``decode_records``'s ``max_decode_bytes``).
    max_decode_bytes: int = 64 * 1024 * 1024
    # Most bytes of one record's key and value; a larger one is reported as a dead letter.
    max_record_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        for key in ("max_wait_ms", "min_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or not 0 <= value <= _INT32_MAX:
                raise ConfigError(f"must be an int in [0, 2^31), got {value!r}", key=f"fetch.{key}")
        for key in (
            "max_bytes",
            "partition_max_bytes",
            "max_fetch_bytes_limit",
            "max_decode_bytes",
            "max_record_bytes",
        ):
            value = getattr(self, key)
            if not isinstance(value, int) or not 1 <= value <= _INT32_MAX:
                raise ConfigError(f"must be an int in [1, 2^31), got {value!r}", key=f"fetch.{key}")
        if self.isolation_level not in ("read_uncommitted", "read_committed"):
            raise ConfigError(
                f"must be read_uncommitted or read_committed, got {self.isolation_level!r}",
                key="fetch.isolation_level",
            )
        if self.auto_offset_reset not in ("earliest", "latest", "fail"):
            raise ConfigError(
                f"must be earliest, latest or fail, got {self.auto_offset_reset!r}",
                key="fetch.auto_offset_reset",
            )

    @property
    def read_committed(self) -> bool:
        return self.isolation_level == "read_committed"

    @property
    def isolation_code(self) -> int:
        return 1 if self.read_committed else 0


@dataclass(frozen=True, kw_only=True, slots=True)
class WorkerSettings:
    """Everything a worker process needs; picklable, sent to it at spawn.

    Backpressure: fetching stops once the bytes of segments the parent has not
    released (the open one included) reach ``max_unacked_bytes``, and resumes
    when releases bring them down to ``resume_unacked_bytes``. The cap is soft
    by at most one fetch response.
    """

    client: ClientConfig
    topic: str
    partition: int
    handoff: HandoffLocation
    start: StartPosition
    end: EndPosition | None = None
    fetch: FetchSettings = field(default_factory=FetchSettings)
    max_unacked_bytes: int = 256 * 1024 * 1024
    resume_unacked_bytes: int = 128 * 1024 * 1024
    # The handoff's space plan may seal segments below handoff.segment_max_bytes.
    segment_max_bytes: int | None = None
    # Freed decode output the records kernel keeps for reuse (None: its default, 64 MiB);
    # part of a worker's resident memory, traded against page faults.
    decode_buffer_cache_bytes: int | None = None
    log_level: str = "INFO"
    log_format: Literal["kv", "json"] = "kv"  # as the supervisor's: one stream, one format

    def __post_init__(self) -> None:
        if self.log_format not in ("kv", "json"):
            raise ConfigError(f"must be kv or json, got {self.log_format!r}", key="log_format")
        if self.partition < 0:
            raise ConfigError(f"must be >= 0, got {self.partition}", key="partition")
        if not 0 < self.resume_unacked_bytes <= self.max_unacked_bytes:
            raise ConfigError(
                "need 0 < resume_unacked_bytes <= max_unacked_bytes, got "
                f"{self.resume_unacked_bytes} and {self.max_unacked_bytes}",
                key="resume_unacked_bytes",
            )
