"""The sections of the Kafka side: [kafka] (with [kafka.tls], [kafka.sasl]), [source] and
[fetch], declared as ``sections.py`` says."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

# From the package, not ``units.py``: pyproject's ``extend-immutable-calls`` names
# ``ingest.config.Size`` and ``ingest.config.Duration`` (safe as dataclass defaults).
from ingest.config.units import SECTION, Bool, Duration, HostPort, Int, Regex, Size, Str

Assignor = Literal["cooperative-sticky", "range", "roundrobin"]


@dataclass(frozen=True, config=SECTION)
class TlsSection:
    """TLS to the brokers (security_protocol SSL or SASL_SSL)."""

    ca_file: Str | None = None
    """PEM file of the CAs that sign the brokers' certificates (default: the system's trust
    store)."""
    cert_file: Str | None = None
    """PEM client certificate, for brokers that require mutual TLS."""
    key_file: Str | None = None
    """PEM private key of cert_file."""
    key_password_env: Str | None = None
    """Name of the environment variable holding key_file's passphrase (read at load; never the
    passphrase itself)."""
    check_hostname: Bool = True
    """Check that the broker's certificate names its host."""


@dataclass(frozen=True, config=SECTION)
class SaslSection:
    """SASL authentication (security_protocol SASL_PLAINTEXT or SASL_SSL)."""

    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    """The SASL mechanism."""
    username: Str
    """The SASL user name."""
    password_env: Str
    """Name of the environment variable holding the password (read at load; never the password
    itself)."""


@dataclass(frozen=True, config=SECTION)
class KafkaSection:
    """The Kafka cluster: how to reach it and how long to wait for it."""

    bootstrap_servers: list[HostPort] = Field(min_length=1)
    """Brokers to bootstrap from, as "host:port" (at least one)."""
    client_id: Str = "ingest"
    """client.id sent to the brokers."""
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    """Kafka's security.protocol; SSL needs [kafka.tls] for anything but the defaults, SASL_* needs
    [kafka.sasl]."""
    connect_timeout: Duration = Duration(10)
    """How long a TCP (and TLS) connect may take."""
    request_timeout: Duration = Duration(30)
    """How long one request may wait for its response."""
    retry_timeout: Duration = Duration(30)
    """How long a cluster operation (metadata, coordinator lookup) keeps retrying; also how long
    `ingest run` waits for a bootstrap server at start."""
    list_offsets: Literal["auto", "trust", "check"] = "auto"
    """ListOffsets answers taken at their word ("trust") or checked against a Fetch and the records
    ("check", for brokers that answer them wrongly, such as Tansu 0.6.0). "auto" trusts a broker
    that offers OffsetForLeaderEpoch, as Apache Kafka does."""
    tls: TlsSection | None = None
    """TLS settings ([kafka.tls])."""
    sasl: SaslSection | None = None
    """SASL settings ([kafka.sasl]); required by SASL_* protocols."""


@dataclass(frozen=True, config=SECTION)
class SourceSection:
    """The topics to read and the consumer group that owns their offsets."""

    group_id: Str
    """The consumer group; its committed offsets are ours."""
    topics: list[Str] = Field(default_factory=list)
    """Topics to land in the table; or topic_pattern."""
    topic_pattern: Regex | None = None
    """A regular expression (Python syntax, matching the whole name) instead of topics: every topic
    it matches lands, internal ones excepted. The topic list is read again every metadata_refresh: a
    new matching topic joins the subscription (a rebalance) without a restart, a deleted one's
    partitions are released. With --until-end, the topics matching at the start."""
    group_instance_id: Str | None = None
    """Static membership (KIP-345): a restart within session_timeout keeps the assignment without a
    rebalance."""
    assignors: list[Assignor] = Field(
        default_factory=lambda: list[Assignor](["cooperative-sticky"])
    )
    """Client-side assignors (classic protocol), by preference. The rebalance protocol is
    cooperative only when every assignor listed supports it (Kafka's rule): the default keeps the
    workers of kept partitions running through a rebalance. A group shared with librdkafka's
    defaults (range, roundrobin) needs ["cooperative-sticky", "range"], which makes every rebalance
    eager (docs/deploy.md)."""
    session_timeout: Duration = Duration(45)
    """How long the coordinator waits for a heartbeat before it removes the member (classic
    protocol); with the consumer protocol, how long the member keeps its partitions without
    a heartbeat answer (at least two of the coordinator's heartbeat intervals)."""
    heartbeat_interval: Duration = Duration(3)
    """How often the member heartbeats; shorter than session_timeout."""
    rebalance_timeout: Duration = Duration(300)
    """How long a rebalance waits for the members to rejoin."""
    auto_offset_reset: Literal["earliest", "latest", "fail"] = "earliest"
    """Where a partition without a committed offset (or with one out of range) starts; "fail" stops
    the run instead."""
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    """read_committed skips aborted transactions and stops at the last stable offset."""
    offsets_topic_partitions: Int = 50
    """The cluster's offsets.topic.num.partitions: which __consumer_offsets partition holds the
    group (`ingest status`)."""
    leave_group_on_shutdown: Bool | None = None
    """Send LeaveGroup on shutdown (a fast rebalance); unset: leave unless group_instance_id is
    set."""
    metadata_refresh: Duration = Duration(300)
    """How often the group's leader looks again at its topics' partition counts, and each member at
    the topics topic_pattern matches: partitions and topics added are assigned within this (Kafka's
    metadata.max.age.ms)."""
    group_protocol: Literal["classic", "consumer"] = "classic"
    """\"classic" (JoinGroup/SyncGroup, the client-side assignors) or "consumer" (KIP-848, Kafka
    4.0+: ConsumerGroupHeartbeat, the coordinator assigns with server_assignor; the session timeout
    and heartbeat interval are then the group's, set on the broker)."""
    server_assignor: Literal["uniform", "range"] | None = None
    """The coordinator's assignor (group_protocol "consumer"); unset: the group's default."""


@dataclass(frozen=True, config=SECTION)
class FetchSection:
    """Fetch requests to the brokers."""

    max_wait: Duration = Duration(0.5)
    """How long a broker may hold a Fetch waiting for min_bytes."""
    min_bytes: Size = Size(64 * 1024)
    """The bytes a broker waits for (at most max_wait) before answering a Fetch of a run without an
    end, so that an answer carries many records, not one: 20 partitions at 1,500 records/s in all
    took 47% of a core in their workers with 1 byte, 5% with 64KiB (docs/benchmarks.md). Runs with
    an end (--until-end, replay) ask for 1 byte: they stop at the end rather than wait."""
    max_bytes: Size = Size(50 * 1024**2)
    """Most bytes one Fetch response may carry."""
    partition_max_bytes: Size = Size(8 * 1024**2)
    """Most bytes one partition may contribute to a Fetch response."""
    max_decode_bytes: Size = Field(default=Size(64 * 1024**2), ge=Size(1024**2), le=Size(1024**3))
    """Most bytes a worker decompresses from one Fetch response, whatever the compression ratio
    (anyone who may write to a topic can send a 2 KB batch of 60 MiB of zeros): the batches past
    it wait for the next Fetch. The first batch is always taken (one batch decompresses to 64 MiB
    at most, else it is a corrupt batch)."""
    max_record_bytes: Size = Field(default=Size(64 * 1024**2), ge=Size(1024), le=Size(1024**3))
    """Most bytes one record's key and value may hold together: a larger record becomes a
    dead letter naming its size (its bytes are not kept), and the partition goes on."""
    check_crc: Bool = False
    """Check each record batch's CRC32C as it is read."""
