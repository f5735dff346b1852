"""Config -> settings: every conversion of the validated ``IngestConfig`` into the
settings of one layer (group, handoff, worker, fetch, sink) lives here, so each layer takes
its own typed settings and never reads the config."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from ingest.client import ClientConfig
from ingest.client.client_config import SaslConfig, TlsConfig
from ingest.config import IngestConfig, TlsSection
from ingest.errors import ConfigError, RegistryError
from ingest.group import (
    ConsumerGroupConfig,
    CooperativeStickyAssignor,
    GroupConfig,
    RangeAssignor,
    RebalanceProtocol,
    RoundRobinAssignor,
)
from ingest.group.assignors import Assignor
from ingest.handoff import HandoffConfig, HandoffLocation
from ingest.handoff.space import SpacePlan, Wanted
from ingest.protocol.partition import Partition
from ingest.registry import (
    REGISTRY_FORMATS,
    RegisteredSchema,
    RegistrySettings,
    client_for,
    subject_for,
)
from ingest.sink.maintenance.maintain import MaintenanceSettings
from ingest.sink.storage import s3_filesystem_options
from ingest.sink.table_config import TOPIC_PLACEHOLDER, Condition, Router, TableConfig
from ingest.worker import EndPosition, FetchSettings, StartPosition, WorkerSettings

__all__ = [
    "client_config",
    "consumer_group_config",
    "fetch_settings",
    "group_config",
    "handoff_config",
    "maintenance_settings",
    "member_config",
    "s3_options",
    "table_config",
    "wanted_space",
    "worker_settings",
]


def client_config(config: IngestConfig) -> ClientConfig:
    """The broker client's settings: bootstrap, timeouts, TLS and SASL (secrets resolved)."""
    kafka = config.kafka
    tls = None
    if kafka.security_protocol in ("SSL", "SASL_SSL"):
        section = kafka.tls or TlsSection()
        tls = TlsConfig(
            ca_file=section.ca_file,
            cert_file=section.cert_file,
            key_file=section.key_file,
            key_password=config.secrets.get("kafka.tls.key_password_env"),
            check_hostname=section.check_hostname,
        )
    sasl = None
    if kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        assert kafka.sasl is not None  # checked on load
        sasl = SaslConfig(
            mechanism=kafka.sasl.mechanism,
            username=kafka.sasl.username,
            password=config.secrets["kafka.sasl.password_env"],
        )
    return ClientConfig(
        bootstrap_servers=tuple(kafka.bootstrap_servers),
        client_id=kafka.client_id,
        connect_timeout=float(kafka.connect_timeout),
        request_timeout=float(kafka.request_timeout),
        retry_timeout=float(kafka.retry_timeout),
        list_offsets=kafka.list_offsets,
        tls=tls,
        sasl=sasl,
    )


_ASSIGNORS: dict[str, type[Assignor]] = {
    "cooperative-sticky": CooperativeStickyAssignor,
    "range": RangeAssignor,
    "roundrobin": RoundRobinAssignor,
}


def wanted_space(config: IngestConfig) -> Wanted:
    """The configured handoff sizes, which the space plan may only lower."""
    return Wanted(
        segment_max_bytes=int(config.handoff.segment_max_bytes),
        max_buffered_bytes=max(2, int(config.handoff.max_buffered_bytes)),
        max_unacked_bytes=int(config.worker.max_unacked_bytes),
        resume_unacked_bytes=int(config.worker.resume_unacked_bytes),
    )


def handoff_config(config: IngestConfig) -> HandoffConfig:
    section = config.handoff
    options: dict[str, Any] = {}
    if section.root and section.root.startswith("s3://"):
        options = s3_options(config.table_storage_options())
    return HandoffConfig(
        mode=section.mode,
        root=section.root,
        storage_options=options,
        segment_max_bytes=int(section.segment_max_bytes),
        segment_max_age=float(section.segment_max_age),
        full_timeout=float(section.full_timeout),
    )


def s3_options(delta_options: Mapping[str, str]) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` arguments from delta-rs storage options (segments on S3
    use the table's endpoint and credentials)."""
    return dict(s3_filesystem_options(delta_options))


def group_config(config: IngestConfig) -> GroupConfig:
    source = config.source
    return GroupConfig(
        group_id=source.group_id,
        group_instance_id=source.group_instance_id,
        session_timeout_ms=int(float(source.session_timeout) * 1000),
        heartbeat_interval_ms=int(float(source.heartbeat_interval) * 1000),
        rebalance_timeout_ms=int(float(source.rebalance_timeout) * 1000),
        assignors=tuple(_ASSIGNORS[name]() for name in source.assignors),
        leave_on_close=source.leave_group_on_shutdown,
        metadata_refresh_ms=int(float(source.metadata_refresh) * 1000),
    )


def consumer_group_config(config: IngestConfig) -> ConsumerGroupConfig:
    """The member's settings in a consumer-protocol group (``source.group_protocol =
    "consumer"``, KIP-848). ``session_timeout`` is only how long the member keeps its
    partitions without a heartbeat answer: the group's own is the broker's."""
    source = config.source
    return ConsumerGroupConfig(
        group_id=source.group_id,
        group_instance_id=source.group_instance_id,
        server_assignor=source.server_assignor,
        rebalance_timeout_ms=int(float(source.rebalance_timeout) * 1000),
        session_timeout_ms=int(float(source.session_timeout) * 1000),
        heartbeat_interval_ms=int(float(source.heartbeat_interval) * 1000),
        leave_on_close=source.leave_group_on_shutdown is not False,
    )


def member_config(config: IngestConfig) -> GroupConfig | ConsumerGroupConfig:
    """The group member's settings for the protocol ``source.group_protocol`` names."""
    if config.source.group_protocol == "consumer":
        return consumer_group_config(config)
    return group_config(config)


def rebalance_protocol_note(config: IngestConfig) -> str:
    """Which rebalance protocol ``source.assignors`` puts in force, and why: cooperative
    only when every assignor listed supports it (Kafka's rule, ``GroupConfig``)."""
    if config.source.group_protocol == "consumer":
        assignor = config.source.server_assignor or "the group's default"
        return (
            "group protocol: consumer (KIP-848): the coordinator assigns (server assignor: "
            f"{assignor}) and every rebalance is incremental: it stops only the workers of "
            "partitions that change owner; source.assignors is not used"
        )
    group = group_config(config)
    if group.rebalance_protocol is RebalanceProtocol.COOPERATIVE:
        return (
            "rebalance protocol: cooperative (every assignor in source.assignors supports it): "
            "a rebalance stops only the workers of partitions that change owner"
        )
    eager = [
        a.name
        for a in group.assignors
        if RebalanceProtocol.COOPERATIVE not in a.supported_protocols
    ]
    return (
        f"rebalance protocol: eager, because source.assignors lists {', '.join(eager)}: every "
        "rebalance stops every worker; list only cooperative-sticky for cooperative"
    )


def fetch_settings(config: IngestConfig) -> FetchSettings:
    fetch = config.fetch
    return FetchSettings(
        max_wait_ms=int(float(fetch.max_wait) * 1000),
        min_bytes=int(fetch.min_bytes),
        max_bytes=int(fetch.max_bytes),
        partition_max_bytes=int(fetch.partition_max_bytes),
        max_decode_bytes=int(fetch.max_decode_bytes),
        max_record_bytes=int(fetch.max_record_bytes),
        isolation_level=config.source.isolation_level,
        auto_offset_reset=config.source.auto_offset_reset,
        check_crc=fetch.check_crc,
    )


def table_config(
    config: IngestConfig,
    *,
    value_registered: RegisteredSchema | None = None,
    key_registered: RegisteredSchema | None = None,
) -> TableConfig:
    """The table as the sink sees it. ``value_registered``: the subject's latest schema,
    giving the columns when no DDL does (``latest_value_schema``, read from the registry
    by the engine only: maintenance and ``ingest status`` need no registry); ``key_registered``
    the same for keys (``latest_key_schema``)."""
    table = config.table
    registered = table.value.format in REGISTRY_FORMATS or table.key.format in REGISTRY_FORMATS
    registry = registry_settings(config) if registered else None
    on_error = config.schema_registry.on_error if config.schema_registry else "fail"
    named = table.name is not None and config.dead_letter.uri is None
    return TableConfig(
        uri=config.table_uri(),
        name=table.name,
        dead_letter_name=f"{table.name}_dead_letters" if named else None,
        group=config.source.group_id,
        storage_options=config.table_storage_options(),
        mode=table.mode,
        merge_keys=tuple(table.merge_keys),
        value_format=table.value.format,
        value_schema=table.value.schema,
        value_envelope=table.value.envelope,
        registry=registry,
        on_registry_error=on_error,
        on_incompatible=table.value.on_incompatible,
        value_registered=value_registered,
        value_strategy=_subject_per_topic(config),
        key_format=table.key.format,
        key_registered=key_registered,
        key_record_name=table.key.record_name,
        record_name=config.schema_registry.record_name if config.schema_registry else None,
        tombstones=table.tombstones,
        transform=table.transform,
        transform_tables=dict(table.transform_tables),
        partition_by=tuple(table.partition_by),
        date_column=table.date_column,
        properties=dict(table.properties),
        dead_letter_uri=config.dead_letter_uri(),
    )


def _subject_per_topic(config: IngestConfig) -> str | None:
    """The subject strategy when each ``{topic}`` table takes its columns from its own
    topic's subject (a registry format without a DDL, the topic strategies, no routes)."""
    section, value = config.schema_registry, config.table.value
    if (
        section is None
        or value.format not in REGISTRY_FORMATS
        or value.schema
        or section.subject_name_strategy == "record"
        or TOPIC_PLACEHOLDER not in config.table_uri()
        or config.route
    ):
        return None
    return section.subject_name_strategy


def table_router(
    config: IngestConfig,
    *,
    value_registered: RegisteredSchema | None = None,
    key_registered: RegisteredSchema | None = None,
) -> Router:
    """Which table each topic lands in: [table], or with [[route]]s the first route that
    matches it (the keys a route leaves unset are [table]'s; its dead letters go to
    [dead_letter].uri when set, else beside its own table)."""
    default = table_config(config, value_registered=value_registered, key_registered=key_registered)
    routes = []
    for index, route in enumerate(config.route):
        value = route.value or config.table.value
        key = route.key or config.table.key
        if route.name is not None and route.uri is None:
            raise ConfigError(
                f"route {route.name!r} is not resolved through the catalog yet",
                path=config.path,
                key=f"route[{index}].name",
            )
        uri = route.uri or config.table_uri()
        registered = value.format in REGISTRY_FORMATS or key.format in REGISTRY_FORMATS
        try:
            table = _route_table(default, config, index, uri, registered, value, key)
        except ConfigError as exc:
            raise ConfigError(
                f"[[route]] {index} ({route.topics!r}): {exc}", path=config.path, key="route"
            ) from None
        condition = (
            None
            if route.matches is None
            else Condition(header=route.header, field=route.field, matches=route.matches)
        )
        routes.append((route.topics, table, condition))
    return Router(default, tuple(routes))


def _route_table(
    default: TableConfig,
    config: IngestConfig,
    index: int,
    uri: str,
    registered: bool,
    value: Any,
    key: Any,
) -> TableConfig:
    route = config.route[index]
    # A route's table is its uri, or its name's (with table.name, routes must give one);
    # a named route's dead letters are named too, beside it.
    named = route.name is not None and config.dead_letter.uri is None
    return replace(
        default,
        uri=uri,
        name=route.name,
        dead_letter_name=f"{route.name}_dead_letters" if named else None,
        dead_letter_uri=config.dead_letter.uri or (None if route.uri else default.dead_letter_uri),
        mode=route.mode or config.table.mode,
        merge_keys=tuple(
            route.merge_keys if route.merge_keys is not None else config.table.merge_keys
        ),
        tombstones=route.tombstones or config.table.tombstones,
        partition_by=tuple(
            route.partition_by if route.partition_by is not None else config.table.partition_by
        ),
        properties=dict(
            route.properties if route.properties is not None else config.table.properties
        ),
        value_format=value.format,
        value_schema=value.schema,
        value_envelope=value.envelope,
        on_incompatible=value.on_incompatible,
        value_registered=default.value_registered if route.value is None else None,
        key_format=key.format,
        key_record_name=key.record_name,
        key_registered=default.key_registered if route.key is None else None,
        registry=registry_settings(config) if registered else None,
        route=index,
    )


def registry_settings(config: IngestConfig) -> RegistrySettings | None:
    registry = config.schema_registry
    if registry is None:
        return None
    secrets = config.secrets
    return RegistrySettings(
        urls=tuple(registry.urls),
        basic_auth_user=registry.basic_auth_user,
        basic_auth_password=secrets.get("schema_registry.basic_auth_password_env"),
        bearer_token=secrets.get("schema_registry.bearer_token_env"),
        ca_file=registry.ca_file,
        cert_file=registry.cert_file,
        key_file=registry.key_file,
        request_timeout=float(registry.request_timeout),
        retry_timeout=float(registry.retry_timeout),
    )


def latest_value_schema(config: IngestConfig) -> RegisteredSchema | None:
    """The columns' schema when ``table.value.schema`` does not give them: the latest
    schema of each topic's subject, which must agree (None when not needed, or when each
    ``{topic}`` table reads its own subject's at its first batch)."""
    value = config.table.value
    if value.format not in REGISTRY_FORMATS or value.schema or _subject_per_topic(config):
        return None
    return _latest(config, key=False)


def latest_key_schema(config: IngestConfig) -> RegisteredSchema | None:
    """The key column's schema: the latest of each topic's key subject (None when keys
    are not in a registry's format)."""
    if config.table.key.format not in REGISTRY_FORMATS:
        return None
    return _latest(config, key=True)


def _latest(config: IngestConfig, *, key: bool) -> RegisteredSchema | None:
    section = config.schema_registry
    registry = registry_settings(config)
    if registry is None:
        return None
    assert section is not None
    what, setting = (
        ("the key column", "table.key.format")
        if key
        else (
            "no columns: table.value.schema is unset and",
            "table.value.schema",
        )
    )
    record_name = config.table.key.record_name if key else section.record_name
    client = client_for(registry)
    latest = {}
    # A topic_pattern is refused on load unless the subject names no topic ("record").
    for topic in config.source.topics or [""]:
        subject = subject_for(section.subject_name_strategy, topic, record_name, key=key)
        try:
            latest[subject] = client.latest(subject)
        except RegistryError as exc:
            raise ConfigError(
                f"{what}: the registry did not give the latest schema of {subject!r}: {exc}",
                path=config.path,
                key=setting,
            ) from None
    texts = {schema.text for schema in latest.values()}
    if len(texts) > 1 or not latest:
        raise ConfigError(
            f"{what}: the subjects {sorted(latest)} have different latest schemas",
            path=config.path,
            key=setting,
        )
    return next(iter(latest.values()))


def maintenance_settings(config: IngestConfig) -> MaintenanceSettings:
    maintenance = config.maintenance
    return MaintenanceSettings(
        compact=maintenance.compact,
        target_file_size=int(maintenance.target_file_size),
        checkpoint_every=maintenance.checkpoint_every,
        log_retention_seconds=float(maintenance.log_retention),
        vacuum=maintenance.vacuum,
        vacuum_retention_hours=float(maintenance.vacuum_retention) / 3600,
        vacuum_full=maintenance.vacuum_full,
    )


def worker_settings(
    config: IngestConfig,
    client: ClientConfig,
    fetch: FetchSettings,
    handoff: HandoffLocation,
    partition: Partition,
    start: StartPosition,
    end: EndPosition | None,
    plan: SpacePlan | None = None,
) -> WorkerSettings:
    """One partition's worker: where it starts and ends, where its segments go, and the
    sizes the handoff's space ``plan`` allows (the configured ones without a plan)."""
    return WorkerSettings(
        client=client,
        topic=partition.topic,
        partition=partition.partition,
        handoff=handoff,
        start=start,
        end=end,
        fetch=fetch,
        max_unacked_bytes=(
            plan.max_unacked_bytes if plan else int(config.worker.max_unacked_bytes)
        ),
        resume_unacked_bytes=(
            plan.resume_unacked_bytes if plan else int(config.worker.resume_unacked_bytes)
        ),
        segment_max_bytes=plan.segment_max_bytes if plan else None,
        log_level=config.logging.level.upper(),
        log_format=config.logging.format,
    )
