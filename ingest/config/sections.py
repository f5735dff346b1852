"""The config's sections: one frozen pydantic dataclass per TOML table, and ``IngestConfig``.

The one declaration of the config: each field's annotation is what a TOML value is
validated against (``loader.py`` turns pydantic's errors into ours), its default is the
product's default, and the docstring under it is the key's description (pydantic's
``use_attribute_docstrings``, read from this source), its documentation: the JSON Schema of
``ingest config-schema`` and ``docs/configuration.md`` are generated from it.
``IngestConfig`` also turns the sections into what the layers below take (the table's
storage options, the dead-letter URI).

The sections of the Kafka side ([kafka], [kafka.tls], [kafka.sasl], [source], [fetch])
are in ``kafka.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass
from pydantic.json_schema import SkipJsonSchema

from ingest.client.client_config import Secret
from ingest.config.kafka import FetchSection, KafkaSection, SourceSection
from ingest.config.registry_section import SchemaRegistrySection

# From the package, not ``units.py``: pyproject's ``extend-immutable-calls`` names
# ``ingest.config.Size`` and ``ingest.config.Duration`` (safe as dataclass defaults).
from ingest.config.units import (
    SECTION,
    Bool,
    DeltaUri,
    Duration,
    Int,
    Regex,
    Size,
    SparkMaster,
    Str,
    TableName,
    ViewName,
)
from ingest.errors import ConfigError


@dataclass(frozen=True, config=SECTION)
class WorkerSection:
    """The per-partition workers: backpressure and restarts."""

    max_unacked_bytes: Size = Size(256 * 1024**2)
    """A worker stops fetching once its segment bytes not yet landed reach this (fit to the
    handoff's free space, docs/deploy.md)."""
    resume_unacked_bytes: Size = Size(128 * 1024**2)
    """...and fetches again once they are down to this (below max_unacked_bytes)."""
    restart_backoff: Duration = Duration(1)
    """The wait before a crashed worker restarts, doubled at each crash at the same offset
    (capped)."""
    max_restarts_at_same_offset: Int = 5
    """Restarts of a worker at the same offset; one more crash there fails the partition."""
    retry_for: Duration = Duration(120)
    """How long a worker that fails on unreachable storage or network (the handoff's object
    store, the brokers) is restarted at the same offset beyond max_restarts_at_same_offset,
    from its first such failure; backoff capped at 10 s."""


@dataclass(frozen=True, config=SECTION)
class HandoffSection:
    """Where fetched records wait for their batch: segments in shared memory or files."""

    mode: Literal["shm", "files"] = "shm"
    """\"shm": segments in /dev/shm (one host); "files": under root (a directory or URI the Spark
    executors can read)."""
    root: Str | None = None
    """The directory or URI of the segments (mode "files")."""
    segment_max_bytes: Size = Size(64 * 1024**2)
    """A segment is sealed at this size..."""
    segment_max_age: Duration = Duration(5)
    """...or at this age, whichever comes first."""
    max_buffered_bytes: Size = Size(1024**3)
    """Cap on sealed segment bytes not yet landed; fetching pauses above it (fit to the handoff's
    free space, docs/deploy.md)."""
    full_timeout: Duration = Duration(300)
    """How long a full handoff filesystem may stay full before the run fails."""


@dataclass(frozen=True, config=SECTION)
class TriggerSection:
    """When a batch lands: the first of its size, record count or age."""

    max_bytes: Size = Size(1024**3)
    """A batch's segment bytes: big enough for a backlog to land in few batches (5M records: 1 GiB
    batches 9.2-9.9 s, 256 MiB 10.2-11.4 s, same broker and data)."""
    max_records: Int = 5_000_000
    """A batch's records at most."""
    upsert_max_records: Int = 1_000_000
    """...and at most this many when any table of the run is in mode "upsert" (its append tables'
    batches too): delta-rs's MERGE holds a batch's changes (each key's last) in memory, so this
    bounds the MERGE's source, not the run's memory. A batch can pass it by one segment. 50M
    changes over 5M keys peaked at 6.2 GiB RSS in 1 GiB batches, 3.2 GiB in batches of 1M,
    30% slower (docs/benchmarks.md)."""
    max_age: Duration = Duration(30)
    """A batch lands about when its oldest pending record is this old: it starts that much
    earlier by the time the last batches took to land (at most half of max_age)."""
    shutdown_timeout: Duration = Duration(60)
    """On SIGTERM/SIGINT: how long the in-flight and final batches get before giving up."""
    retry_for: Duration = Duration(120)
    """How long a batch that fails on unreachable storage or network (an object store, a schema
    registry) is retried, from its first failure, before the run stops (exit 1); backoff 2 s
    doubling to 30 s. Other failures get three attempts. 0: three attempts for every failure."""


@dataclass(frozen=True, config=SECTION)
class ValueSection:
    """How record values become columns."""

    format: Literal["binary", "string", "json", "avro", "protobuf", "json_schema"] = "binary"
    """\"binary": the value column as bytes; "string": UTF-8 text; "json": parsed into columns by
    schema; "avro", "protobuf", "json_schema": Confluent-framed Avro, Protobuf or JSON with a JSON
    Schema (docs/avro.md, docs/protobuf.md, docs/json_schema.md), its writers' schemas from
    [schema_registry], its fields as columns."""
    on_incompatible: Literal["dead_letter", "fail"] = "dead_letter"
    """A writer's schema (the registry's formats) that does not fit the table: a type that is not
    the column's or a lossless promotion of it, a required column missing, a nested field added.
    "dead_letter": its records, with the schema id and the reason; "fail": stop the run (exit 2).
    New top-level fields always add columns."""
    schema: Str | None = None
    """The values' Spark DDL (format "json"; the registry's formats: the columns, default the
    subject's latest schema), e.g. "id BIGINT, name STRING"."""
    envelope: Literal["none", "debezium"] = "none"
    """\"debezium": each value is a Debezium change event ({"before", "after", "op"}, maybe inside
    {"schema", "payload"}); the schema describes before/after. Upsert mode only."""


@dataclass(frozen=True, config=SECTION)
class KeySection:
    """How record keys become the ``key`` column."""

    format: Literal["binary", "string", "avro", "protobuf", "json_schema"] = "binary"
    """\"binary": the key as bytes; "string": UTF-8 text (a key that is not is a dead letter);
    "avro", "protobuf", "json_schema": Confluent-framed, its writers' schemas from [schema_registry]
    (subject <topic>-key): the key column is the writer's type (a record's, message's or object's
    struct, or an Avro primitive)."""
    record_name: Str | None = None
    """The key record's full name, for the record subject name strategies (Protobuf: the message
    whose fields the key has, default the file's first)."""


@dataclass(frozen=True, config=SECTION)
class TableSection:
    """The Delta table the topics land in."""

    uri: Str | None = None
    """The Delta table's path or URI (file, s3://, ...). With {topic} in it (e.g.
    "s3://lake/raw/{topic}"), each topic lands in a table of its own, created on demand; a batch
    commits each of its tables in turn, and offsets move only once all of them are durable.
    With name: where a new table goes (an external table); unset, the catalog's place for it."""
    name: TableName | None = None
    """The table's name in Spark's catalog (e.g. "db.events" or "raw.{topic}"; set uri, name
    or both): resolved through the Spark session's catalog ([spark] conf) at the start of
    each command; a new table is created and registered by Delta Spark at its first batch,
    its dead letters as <name>_dead_letters (docs/delta-compat.md#tables-by-name)."""
    mode: Literal["append", "upsert"] = "append"
    """\"append": every record a row; "upsert": MERGE by merge_keys."""
    merge_keys: list[Str] = Field(default_factory=list)
    """The key columns of mode "upsert"."""
    tombstones: Literal["delete", "ignore", "dead_letter", "keep"] | None = None
    """A record with a null value: "delete" its key's row (upsert's default), "ignore" it,
    "dead_letter" it, or "keep" it as a row (append's default). Unset: the mode's default."""
    partition_by: list[Str] = Field(default_factory=list)
    """The table's partition columns."""
    date_column: Str | None = None
    """A DATE column of this name holding each record's Kafka timestamp's UTC day, e.g. "day",
    to partition by (partition_by = ["day"]): Delta Spark's DELETE, UPDATE and MERGE of a past
    day then never conflict with ingest's appends (docs/delta-compat.md)."""
    properties: dict[Str, Str] = Field(default_factory=dict)
    """Delta table properties of a table ingest creates, e.g. { "delta.logRetentionDuration" =
    "interval 30 days" }, beside delta.checkpointInterval = 10 unless set here; a table that
    exists keeps its own (delta.setTransactionRetentionDuration is refused)."""
    transform: Str | None = None
    """Spark SQL over the view `batch`, run on each batch."""
    transform_tables: dict[ViewName, DeltaUri] = Field(default_factory=dict)
    """Delta tables the transform may name: view name -> table URI (read at each batch)."""
    storage_options: dict[Str, Str] = Field(default_factory=dict)
    """delta-rs/object-store options of the table."""
    storage_options_env: dict[Str, Str] = Field(default_factory=dict)
    """Secret storage options: option -> name of the environment variable holding its value (read at
    load)."""
    value: ValueSection = Field(default_factory=ValueSection)
    """How values become columns ([table.value])."""
    key: KeySection = Field(default_factory=KeySection)
    """How keys become the key column ([table.key])."""


@dataclass(frozen=True, config=SECTION)
class DeadLetterSection:
    """Where records that cannot land go."""

    uri: Str | None = None
    """The dead-letter Delta table (default: <table uri>_dead_letters)."""


@dataclass(frozen=True, config=SECTION)
class SparkSection:
    """The Spark session that lands batches."""

    master: SparkMaster = "local[*]"
    """Spark's master URL: local, local[N], local[*], local[N,F], local-cluster[N,C,M],
    spark://host:port, yarn or k8s://..."""
    app_name: Str = "ingest"
    """spark.app.name."""
    conf: dict[Str, Str] = Field(default_factory=dict)
    """Extra Spark properties (spark.* -> value)."""
    class_data_sharing: Bool = True
    """A class-data-sharing archive of the driver JVM's classes, kept in the user's cache (~115 MB):
    the first run records it, later runs start their JVM in about half the time."""
    engine: Literal["auto", "spark", "local"] = "auto"
    """Where batches without a transform run on a local master: "auto" and "local" in a pool of
    local processes without a JVM (ingest/engines/local/task_pool.py); "spark" on Spark."""
    executorless_timeout: Duration = Field(default=Duration(60), gt=0)
    """On a standalone master (spark://): how long a batch may go without any executor before
    it is cancelled and the run exits 1 (a master restarted without recovery forgets the
    application, and the driver would wait for it forever)."""


@dataclass(frozen=True, config=SECTION)
class MetricsSection:
    """Prometheus metrics."""

    listen: Str | None = None
    """\"host:port" to serve Prometheus text on /metrics, e.g. "127.0.0.1:9464"; unset: no server."""
    status: Bool = True
    """Serve /status beside /metrics: the run's partitions as JSON, with member ids, worker PIDs
    and error texts (docs/operations.md); false: /metrics only."""


@dataclass(frozen=True, config=SECTION)
class LoggingSection:
    """Log records on stderr."""

    format: Literal["kv", "json"] = "kv"
    """\"kv": key=value lines; "json": one JSON object a line."""
    level: Literal["debug", "info", "warning", "error"] = "info"
    """The lowest level logged."""


@dataclass(frozen=True, config=SECTION)
class MaintenanceSection:
    """Table maintenance (``ingest/sink/maintenance/maintain.py``): in ``ingest run`` every ``interval``,
    between batches, on its own thread; ``ingest maintain`` runs one pass on demand. A table
    only Delta Spark writes (row tracking, clustering...) is compacted by Delta Spark's OPTIMIZE
    and vacuumed by its VACUUM, by the table's own retention (docs/delta-compat.md); its
    checkpoints and log are its commits' own (checkpoint_every and log_retention do not apply)."""

    enabled: Bool = True
    """Whether `ingest run` keeps the tables (`ingest maintain` always runs)."""
    interval: Duration = Field(default=Duration(600), gt=0)
    """Time between passes."""
    compact: Bool = True
    """Compact small files."""
    target_file_size: Size = Field(default=Size(128 * 1024**2), ge=Size(1024**2))
    """Files below half of this are compacted, into files of up to about this size (at least
    1MiB)."""
    checkpoint_every: Int = Field(default=10, ge=1)
    """A checkpoint once the table moved this many versions past its last one (Delta's 10)."""
    log_retention: Duration = Duration(30 * 86400)
    """Commit files older than this go (Delta's default; at least 1h)."""
    vacuum: Bool = True
    """VACUUM removed data files."""
    vacuum_retention: Duration = Duration(168 * 3600)
    """Removed data files older than this are deleted (Delta's 168h; at least 24h)."""
    vacuum_full: Bool = True
    """Also files no commit names (orphans of a killed run), older than the retention."""

    # The floors (ingest.sink.maintenance.maintain says why; tests/test_config.py checks they agree).
    VACUUM_FLOOR_HOURS: ClassVar[int] = 24
    LOG_RETENTION_FLOOR_SECONDS: ClassVar[int] = 3600


# The fields of IngestConfig that are not keys of the file.
NOT_IN_FILE = frozenset({"path", "secrets"})


@dataclass(frozen=True, config=SECTION)
class RouteSection:
    """One [[route]]: the topics a regular expression matches land in a table of their
    own; the keys it leaves unset are [table]'s. The first route that matches a topic
    takes it; with routes, a topic none matches is dead letters (its reason names it)."""

    topics: Regex
    """A regular expression a topic's whole name matches, e.g. "orders-.*"."""
    header: Str | None = None
    """Route each record by this header's value (UTF-8; a record without it matches no such route):
    the route takes the records whose value `matches` matches."""
    field: Str | None = None
    """Route each record by this top-level field of its value read as JSON (a string as it is, a
    number or boolean as its JSON text; absent, null or not JSON matches no such route): the route
    takes the records whose field `matches` matches."""
    matches: Regex | None = None
    """With header or field: a regular expression the whole value matches, e.g. "order(ed|_paid)".
    The records of a topic the route does not take go to the next route that matches."""
    uri: DeltaUri | None = None
    """Its Delta table ({topic} allowed); default table.uri. With name: where a new table goes
    (an external table); unset, the catalog's place for it."""
    name: TableName | None = None
    """Its table's name in Spark's catalog (e.g. "db.orders" or "raw.{topic}"), resolved and
    created as table.name's (docs/delta-compat.md#tables-by-name); its dead letters are
    <name>_dead_letters unless [dead_letter].uri is set."""
    mode: Literal["append", "upsert"] | None = None
    """table.mode."""
    merge_keys: list[Str] | None = None
    """table.merge_keys."""
    tombstones: Literal["delete", "ignore", "dead_letter", "keep"] | None = None
    """table.tombstones."""
    partition_by: list[Str] | None = None
    """table.partition_by."""
    properties: dict[Str, Str] | None = None
    """table.properties."""
    value: ValueSection | None = None
    """[table.value]."""
    key: KeySection | None = None
    """[table.key]."""


@dataclass(frozen=True, config=SECTION | ConfigDict(arbitrary_types_allowed=True))
class IngestConfig:
    """The configuration of `ingest run | replay | status | maintain`: one TOML file."""

    kafka: KafkaSection
    """The Kafka cluster ([kafka])."""
    source: SourceSection
    """The topics and the group ([source])."""
    table: TableSection
    """The Delta table ([table])."""
    fetch: FetchSection = Field(default_factory=FetchSection)
    """[fetch]."""
    worker: WorkerSection = Field(default_factory=WorkerSection)
    """[worker]."""
    handoff: HandoffSection = Field(default_factory=HandoffSection)
    """[handoff]."""
    trigger: TriggerSection = Field(default_factory=TriggerSection)
    """[trigger]."""
    dead_letter: DeadLetterSection = Field(default_factory=DeadLetterSection)
    """[dead_letter]."""
    spark: SparkSection = Field(default_factory=SparkSection)
    """[spark]."""
    schema_registry: SchemaRegistrySection | None = None
    """[schema_registry] (formats avro, protobuf, json_schema)."""
    metrics: MetricsSection = Field(default_factory=MetricsSection)
    """[metrics]."""
    logging: LoggingSection = Field(default_factory=LoggingSection)
    """[logging]."""
    maintenance: MaintenanceSection = Field(default_factory=MaintenanceSection)
    """[maintenance]."""
    route: list[RouteSection] = Field(default_factory=list)
    """[[route]]: topics to tables by regular expression, each with its own format, mode and
    partitioning (default: every topic to [table])."""
    # Not keys of the file (NOT_IN_FILE): where it was read, and the secrets resolved from
    # the environment at load time, by dotted key.
    path: SkipJsonSchema[str] = "<memory>"
    secrets: SkipJsonSchema[Mapping[str, Secret]] = Field(default_factory=dict, repr=False)

    def table_storage_options(self) -> dict[str, str]:
        options = dict(self.table.storage_options)
        for option in self.table.storage_options_env:
            options[option] = self.secrets[f"table.storage_options_env.{option}"].reveal()
        return options

    def names_tables(self) -> bool:
        """Whether a table is named in Spark's catalog (``table.name`` or a route's
        ``name``): the Spark engine resolves and creates it."""
        return self.table.name is not None or any(r.name is not None for r in self.route)

    def table_uri(self) -> str:
        """The table's URI: ``table.uri``, or the catalog's location of ``table.name``
        once resolved (``ingest/engines/spark/catalog.py``)."""
        if self.table.uri is None:
            raise ConfigError(
                f"table {self.table.name!r} is not resolved through the catalog yet",
                key="table.name",
            )
        return self.table.uri

    def dead_letter_uri(self) -> str:
        return self.dead_letter.uri or self.table_uri().rstrip("/") + "_dead_letters"


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
