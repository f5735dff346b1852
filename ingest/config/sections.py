"""The config's sections: one frozen dataclass per TOML table, and ``IngestConfig``.

Each field's annotation is what the loader (``loader.py``) checks a TOML value against,
and its default is the product's default. ``IngestConfig`` also turns the sections into
what the layers below take (``client_config``, the table's storage options).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from ingest.client.config import Secret

# From the package, not ``units.py``: pyproject's ``extend-immutable-calls`` names
# ``ingest.config.Size`` and ``ingest.config.Duration`` (safe as dataclass defaults).
from ingest.config import Duration, Size
from ingest.errors import ConfigError


@dataclass(frozen=True)
class TlsSection:
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password_env: str | None = None
    check_hostname: bool = True


@dataclass(frozen=True)
class SaslSection:
    mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
    username: str
    password_env: str


@dataclass(frozen=True)
class KafkaSection:
    bootstrap_servers: list[str]
    client_id: str = "ingest"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    connect_timeout: Duration = Duration(10)
    request_timeout: Duration = Duration(30)
    # How long a cluster operation (metadata, coordinator lookup) keeps retrying.
    retry_timeout: Duration = Duration(30)
    # ListOffsets answers taken at their word ("trust") or checked against a Fetch and the
    # records ("check", for brokers that answer them wrongly, such as Tansu 0.6.0). "auto"
    # trusts a broker that offers OffsetForLeaderEpoch, as Apache Kafka does.
    list_offsets: Literal["auto", "trust", "check"] = "auto"
    tls: TlsSection | None = None
    sasl: SaslSection | None = None


@dataclass(frozen=True)
class SourceSection:
    topics: list[str]
    group_id: str
    group_instance_id: str | None = None
    # The rebalance protocol is cooperative only when every assignor listed supports it
    # (Kafka's rule): the default keeps the workers of kept partitions running through a
    # rebalance. A group shared with librdkafka's defaults (range, roundrobin) needs
    # ["cooperative-sticky", "range"], which makes every rebalance eager (docs/deploy.md).
    assignors: list[Literal["cooperative-sticky", "range", "roundrobin"]] = field(
        default_factory=lambda: ["cooperative-sticky"]
    )
    session_timeout: Duration = Duration(45)
    heartbeat_interval: Duration = Duration(3)
    rebalance_timeout: Duration = Duration(300)
    auto_offset_reset: Literal["earliest", "latest", "fail"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    offsets_topic_partitions: int = 50
    leave_group_on_shutdown: bool | None = None  # None: leave unless static
    # How often the group's leader looks again at its topics' partition counts: partitions
    # added to a topic are assigned within this (Kafka's metadata.max.age.ms).
    metadata_refresh: Duration = Duration(300)
    # "classic" (JoinGroup/SyncGroup, client-side assignors above) or "consumer" (KIP-848,
    # Kafka 4.0+: ConsumerGroupHeartbeat, the coordinator assigns with server_assignor; the
    # session timeout and heartbeat interval are then the group's, set on the broker).
    group_protocol: Literal["classic", "consumer"] = "classic"
    server_assignor: Literal["uniform", "range"] | None = None  # None: the group's default


@dataclass(frozen=True)
class FetchSection:
    max_wait: Duration = Duration(0.5)
    min_bytes: Size = Size(1)
    max_bytes: Size = Size(50 * 1024**2)
    partition_max_bytes: Size = Size(8 * 1024**2)
    check_crc: bool = False


@dataclass(frozen=True)
class WorkerSection:
    max_unacked_bytes: Size = Size(256 * 1024**2)
    resume_unacked_bytes: Size = Size(128 * 1024**2)
    restart_backoff: Duration = Duration(1)
    max_restarts_at_same_offset: int = 5


@dataclass(frozen=True)
class HandoffSection:
    mode: Literal["shm", "files"] = "shm"
    root: str | None = None
    segment_max_bytes: Size = Size(64 * 1024**2)
    segment_max_age: Duration = Duration(5)
    max_buffered_bytes: Size = Size(1024**3)
    # How long a full handoff filesystem may stay full before the run fails.
    full_timeout: Duration = Duration(300)


@dataclass(frozen=True)
class TriggerSection:
    # A batch's segment bytes: big enough for a backlog to land in few batches (5M
    # records: 1 GiB batches 9.2-9.9 s, 256 MiB 10.2-11.4 s, same broker and data).
    max_bytes: Size = Size(1024**3)
    max_records: int = 5_000_000
    max_age: Duration = Duration(30)
    # On SIGTERM/SIGINT: how long the in-flight and final batches get before giving up.
    shutdown_timeout: Duration = Duration(60)


@dataclass(frozen=True)
class ValueSection:
    format: Literal["binary", "string", "json"] = "binary"
    schema: str | None = None  # Spark DDL, for json
    # "debezium": each value is a Debezium change event ({"before", "after", "op"}, maybe
    # inside {"schema", "payload"}); the schema describes before/after. Upsert mode only.
    envelope: Literal["none", "debezium"] = "none"


@dataclass(frozen=True)
class TableSection:
    uri: str
    mode: Literal["append", "upsert"] = "append"
    merge_keys: list[str] = field(default_factory=list)
    # A record with a null value: "delete" its key's row (upsert's default), "ignore" it,
    # "dead_letter" it, or "keep" it as a row (append's default). None: the mode's default.
    tombstones: Literal["delete", "ignore", "dead_letter", "keep"] | None = None
    partition_by: list[str] = field(default_factory=list)
    transform: str | None = None  # SQL over the view `batch`
    # Delta tables the transform may name: view name -> table URI (read at each batch).
    transform_tables: dict[str, str] = field(default_factory=dict)
    storage_options: dict[str, str] = field(default_factory=dict)
    storage_options_env: dict[str, str] = field(default_factory=dict)  # option -> env var
    value: ValueSection = field(default_factory=ValueSection)


@dataclass(frozen=True)
class DeadLetterSection:
    uri: str | None = None  # default: <table uri>_dead_letters


@dataclass(frozen=True)
class SparkSection:
    master: str = "local[*]"
    app_name: str = "ingest"
    conf: dict[str, str] = field(default_factory=dict)
    # A class-data-sharing archive of the driver JVM's classes, kept in the user's cache
    # (~115 MB): the first run records it, later runs start their JVM in about half the time.
    class_data_sharing: bool = True
    # Where batches without a transform run on a local master: "auto" and "local" in a
    # pool of local processes without a JVM (spark_jobs/local.py); "spark" on Spark.
    engine: Literal["auto", "spark", "local"] = "auto"


@dataclass(frozen=True)
class MetricsSection:
    listen: str | None = None  # "127.0.0.1:9464" serves Prometheus text


@dataclass(frozen=True)
class LoggingSection:
    format: Literal["kv", "json"] = "kv"
    level: Literal["debug", "info", "warning", "error"] = "info"


@dataclass(frozen=True)
class MaintenanceSection:
    """Table upkeep (``ingest/sink/maintenance.py``): in ``ingest run`` every ``interval``,
    between batches, on its own thread; ``ingest maintain`` runs one pass on demand."""

    # Whether `ingest run` keeps the tables (`ingest maintain` always runs).
    enabled: bool = True
    interval: Duration = Duration(600)
    compact: bool = True
    # Files below this are compacted, into files of about this size.
    target_file_size: Size = Size(128 * 1024**2)
    # A checkpoint once the table moved this many versions past its last one (Delta's 10).
    checkpoint_every: int = 10
    # Commit files older than this go (Delta's default; at least 1h).
    log_retention: Duration = Duration(30 * 86400)
    vacuum: bool = True
    # Removed data files older than this are deleted (Delta's 168h; at least 24h).
    vacuum_retention: Duration = Duration(168 * 3600)
    # Also files no commit names (orphans of a killed run), older than the retention.
    vacuum_full: bool = True

    # The floors (ingest.sink.maintenance says why; tests/test_config.py checks they agree).
    VACUUM_FLOOR_HOURS = 24
    LOG_RETENTION_FLOOR_SECONDS = 3600


@dataclass(frozen=True)
class IngestConfig:
    kafka: KafkaSection
    source: SourceSection
    table: TableSection
    fetch: FetchSection = field(default_factory=FetchSection)
    worker: WorkerSection = field(default_factory=WorkerSection)
    handoff: HandoffSection = field(default_factory=HandoffSection)
    trigger: TriggerSection = field(default_factory=TriggerSection)
    dead_letter: DeadLetterSection = field(default_factory=DeadLetterSection)
    spark: SparkSection = field(default_factory=SparkSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
    logging: LoggingSection = field(default_factory=LoggingSection)
    maintenance: MaintenanceSection = field(default_factory=MaintenanceSection)
    path: str = "<memory>"
    # Secrets resolved from the environment at load time, by dotted key.
    secrets: Mapping[str, Secret] = field(default_factory=dict, repr=False)

    def table_storage_options(self) -> dict[str, str]:
        options = dict(self.table.storage_options)
        for option in self.table.storage_options_env:
            options[option] = self.secrets[f"table.storage_options_env.{option}"].reveal()
        return options

    def dead_letter_uri(self) -> str:
        return self.dead_letter.uri or self.table.uri.rstrip("/") + "_dead_letters"


def offsets_topic_partition(group_id: str, partitions: int = 50) -> int:
    """The ``__consumer_offsets`` partition that holds ``group_id``: Java's
    ``abs(groupId.hashCode()) % partitions`` (``offsets.topic.num.partitions``)."""
    if partitions <= 0:
        raise ConfigError("must be positive", key="source.offsets_topic_partitions")
    hash_code = 0
    # Java hashes UTF-16 code units.
    data = group_id.encode("utf-16-be")
    for i in range(0, len(data), 2):
        hash_code = (31 * hash_code + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    signed = hash_code - (1 << 32) if hash_code & 0x80000000 else hash_code
    # Java's Math.abs(Integer.MIN_VALUE) stays negative; Kafka's Utils.abs maps it to 0.
    magnitude = 0 if signed == -(1 << 31) else abs(signed)
    return magnitude % partitions
