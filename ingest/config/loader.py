"""Reading a TOML config: the document validated against ``IngestConfig`` (pydantic),
then the secrets read from the environment and the checks that span keys.

Every error is a ``ConfigError`` naming the file and the dotted key; ``config_error`` is
the one place pydantic's errors become ours.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import tomllib
import typing
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from ingest.client.client_config import Secret
from ingest.config.sections import NOT_IN_FILE, IngestConfig, MaintenanceSection
from ingest.config.units import DELTA_URI, HOST_PORT, SPARK_MASTER_URL, TABLE_NAME, Size
from ingest.ddl import check_ddl
from ingest.errors import ConfigError
from ingest.registry import REGISTRY_FORMATS


def load_config(
    path: str | os.PathLike[str], *, env: Mapping[str, str] | None = None
) -> IngestConfig:
    """Reads and validates a TOML config; every error names the file and the key."""
    shown = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read the config: {exc.strerror or exc}", path=shown) from exc
    return parse_config(text, path=shown, env=os.environ if env is None else env)


def parse_config(text: str, *, path: str = "<memory>", env: Mapping[str, str]) -> IngestConfig:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}", path=path) from exc
    for name in sorted(NOT_IN_FILE & set(document)):
        raise ConfigError(f"unknown key (known here: {_known(())})", path=path, key=name)
    try:
        config = _FILE.validate_python({**document, "path": path})
    except ValidationError as exc:
        raise config_error(exc, path) from None
    secrets = _resolve_secrets(config, env, path)
    config = dataclasses.replace(config, secrets=secrets)
    _warn_weak_security(config, path)
    for key, message in _problems(config):
        raise ConfigError(message, path=path, key=key)
    return config


_FILE = TypeAdapter(IngestConfig)


def config_error(exc: ValidationError, path: str) -> ConfigError:
    """pydantic's first error as ours: the file, the dotted key and today's message.

    The first unknown key wins (the keys of a table are checked before its values), then
    pydantic's order (the fields in their declared order, depth first)."""
    errors = exc.errors()
    unknown = [e for e in errors if e["type"] in _UNKNOWN]
    error = (unknown or errors)[0]
    loc = tuple(error["loc"])
    if loc[-1:] == ("[key]",):  # a table's key, not its value
        loc = loc[:-1]
    key = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in loc)
    return ConfigError(_message(error, loc), path=path, key=key.lstrip(".") or None)


_UNKNOWN = ("unexpected_keyword_argument", "extra_forbidden")
# A string that does not match its pattern (units.py), by pattern; {} is the value.
_MISMATCH = {
    HOST_PORT: "expected host:port, got {!r}",
    SPARK_MASTER_URL: "expected a Spark master URL (local, local[N], local[*], local[N,F], "
    "local-cluster[N,C,M], spark://host:port, yarn, k8s://...), got {!r}",
    DELTA_URI: "must be a Delta table's URI (no backquote)",
    TABLE_NAME: "expected a table name, [catalog.][database.]table in letters, digits and _ "
    "({{topic}} allowed in the table's own part), got {!r}",
}
# A list that may not be empty: what it needs at least one of.
_AT_LEAST_ONE = {"bootstrap_servers": "host:port", "urls": "URL"}
# pydantic's error types as ours: {input} is the value, the other names its context's.
_MESSAGES = {
    "missing": "missing required key",
    **dict.fromkeys(
        ("dataclass_type", "dataclass_exact_type", "dict_type", "model_type"), "expected a table"
    ),
    "list_type": "expected a list",
    "bool_type": "expected true or false, got {input!r}",
    "int_type": "expected an integer, got {input!r}",
    "int_from_float": "expected an integer, got {input!r}",
    "string_type": "expected a string, got {input!r}",
    "greater_than": "must be above {gt}",
    "greater_than_equal": "must be at least {ge}",
    "value_error": "{error}",  # parse_size, parse_duration, a view name, a regex
}


def _message(error: ErrorDetails, loc: tuple[str | int, ...]) -> str:
    kind, value = error["type"], error["input"]
    context = {
        k: v.spell() if isinstance(v, Size) else v for k, v in (error.get("ctx") or {}).items()
    }
    if kind in _UNKNOWN:
        return f"unknown key (known here: {_known(loc[:-1])})"
    if kind == "literal_error":
        # pydantic spells the choices "'a', 'b' or 'c'"; every choice is a quoted string.
        choices = ", ".join(repr(c) for c in re.findall(r"'([^']*)'", context["expected"]))
        return f"expected one of {choices}, got {value!r}"
    if kind == "string_pattern_mismatch":
        return _MISMATCH[context["pattern"]].format(value)
    if kind == "too_short":
        return f"needs at least one {_AT_LEAST_ONE.get(str(loc[-1]), 'entry')}"
    template = _MESSAGES.get(kind)
    return str(error["msg"]) if template is None else template.format(input=value, **context)


def _known(loc: tuple[str | int, ...]) -> str:
    """The keys of the table at ``loc`` (a path of field names from ``IngestConfig``)."""
    section: Any = IngestConfig
    for name in (part for part in loc if not isinstance(part, int)):  # [[route]]'s index
        hint = typing.get_type_hints(section)[name]
        section = next(a for a in typing.get_args(hint) or (hint,) if dataclasses.is_dataclass(a))
    names = {f.name for f in dataclasses.fields(section)}
    return ", ".join(sorted(names - NOT_IN_FILE if section is IngestConfig else names))


def _resolve_secrets(config: IngestConfig, env: Mapping[str, str], path: str) -> dict[str, Secret]:
    wanted: dict[str, str] = {}
    if config.kafka.sasl is not None:
        wanted["kafka.sasl.password_env"] = config.kafka.sasl.password_env
    if config.kafka.tls is not None and config.kafka.tls.key_password_env:
        wanted["kafka.tls.key_password_env"] = config.kafka.tls.key_password_env
    for option, variable in config.table.storage_options_env.items():
        wanted[f"table.storage_options_env.{option}"] = variable
    registry = config.schema_registry
    if registry is not None and registry.basic_auth_password_env:
        wanted["schema_registry.basic_auth_password_env"] = registry.basic_auth_password_env
    if registry is not None and registry.bearer_token_env:
        wanted["schema_registry.bearer_token_env"] = registry.bearer_token_env
    secrets = {}
    for key, variable in wanted.items():
        if variable not in env:
            raise ConfigError(f"environment variable {variable} is not set", path=path, key=key)
        secrets[key] = Secret(env[variable])
    return secrets


def _warn_weak_security(config: IngestConfig, path: str) -> None:
    """Loud warnings for settings that are allowed but weaken the connection's security."""
    kafka = config.kafka
    warn = logging.getLogger("ingest.config").warning
    if kafka.tls is not None and not kafka.tls.check_hostname:
        warn(
            "%s: kafka.tls.check_hostname = false: any certificate the CA signed is taken "
            "for any broker, so whoever holds one can stand in for the cluster",
            path,
        )
    sasl = kafka.sasl
    if (
        kafka.security_protocol == "SASL_PLAINTEXT"
        and sasl is not None
        and sasl.mechanism == "PLAIN"
    ):
        warn(
            "%s: SASL PLAIN over SASL_PLAINTEXT sends the password in clear to the "
            "brokers; use SASL_SSL, or a SCRAM mechanism",
            path,
        )


def _problems(config: IngestConfig) -> Iterator[tuple[str, str]]:
    """The checks across keys, in order: each problem as (dotted key, message)."""
    protocol = config.kafka.security_protocol
    if protocol.startswith("SASL") and config.kafka.sasl is None:
        yield "kafka.sasl", f"{protocol} needs a [kafka.sasl] table"
    if not protocol.startswith("SASL") and config.kafka.sasl is not None:
        yield (
            "kafka.sasl",
            f"is set but security_protocol {protocol} uses no SASL (SASL_PLAINTEXT or SASL_SSL would)",
        )
    if not protocol.endswith("SSL") and config.kafka.tls is not None:
        yield (
            "kafka.tls",
            f"is set but security_protocol {protocol} uses no TLS (SSL or SASL_SSL would)",
        )
    yield from _names(config)
    yield from _topics(config)
    yield from _routes(config)
    if config.source.heartbeat_interval >= config.source.session_timeout:
        yield "source.heartbeat_interval", "must be shorter than source.session_timeout"
    table = config.table
    if table.mode == "upsert" and not table.merge_keys:
        yield "table.merge_keys", 'mode "upsert" needs merge_keys'
    if table.value.format == "json" and not table.value.schema:
        yield "table.value.schema", 'format "json" needs a schema (Spark DDL)'
    yield from _changes(config)
    yield from _registered(config)
    if table.value.schema:
        try:
            check_ddl(table.value.schema)
        except ConfigError as exc:
            yield "table.value.schema", str(exc)
    if table.transform_tables and table.transform is None:
        yield (
            "table.transform_tables",
            "names tables for a transform, but table.transform is not set",
        )
    if config.worker.resume_unacked_bytes >= config.worker.max_unacked_bytes:
        yield "worker.resume_unacked_bytes", "must be below worker.max_unacked_bytes"
    if config.handoff.mode == "files" and not config.handoff.root:
        yield "handoff.root", 'mode "files" needs a root directory or URI'
    yield from _maintenance(config)
    yield from _uris(config)
    yield from _properties(config)


def _names(config: IngestConfig) -> Iterator[tuple[str, str]]:
    """``table.name`` and each route's ``name`` against their ``uri``, the engine and
    routes."""
    table = config.table
    if table.uri is None and table.name is None:
        yield "table.uri", "set the Delta table's uri, or its name in Spark's catalog (table.name)"
    named = [("table", table.name, table.uri)]
    named += [(f"route[{i}]", r.name, r.uri) for i, r in enumerate(config.route)]
    for where, name, uri in named:
        if name is None:
            continue
        if uri is not None and ("{topic}" in name) != ("{topic}" in uri):
            yield (
                f"{where}.name",
                f"{{topic}} in {where}.name needs it in {where}.uri too, and the reverse",
            )
    if config.names_tables() and config.spark.engine == "local":
        yield (
            "spark.engine",
            "a table by name (table.name, or a route's name) is resolved and created through "
            'Spark\'s catalog: set engine "auto" or "spark"',
        )
    if table.name is None:
        return
    for index, route in enumerate(config.route):
        if route.uri is None and route.name is None:
            yield (
                f"route[{index}].uri",
                "with table.name a route names its own table: set its uri or its name",
            )


def _changes(config: IngestConfig) -> Iterator[tuple[str, str]]:
    """``table.tombstones`` and ``table.value.envelope`` against the mode (the same rules
    as ``ingest.sink.table_config.check_changes``, which this layer cannot import)."""
    table = config.table
    if table.mode == "append" and table.tombstones == "delete":
        yield (
            "table.tombstones",
            'needs mode "upsert": an append table has no row of a key to delete '
            '(use "keep", "ignore" or "dead_letter")',
        )
    if table.mode == "upsert" and table.tombstones == "keep":
        yield (
            "table.tombstones",
            'applies to append mode: in upsert mode a tombstone is "delete", "ignore" '
            'or "dead_letter"',
        )
    if table.value.envelope == "debezium" and table.value.format != "json":
        yield (
            "table.value.envelope",
            'needs format "json" (the schema describes the rows in before/after)',
        )
    if table.value.envelope == "debezium" and table.mode != "upsert":
        yield (
            "table.value.envelope",
            'needs mode "upsert": change events update and delete rows by key',
        )


# A scheme followed by one slash ("s3:/lake/t"): what Path() makes of "s3://lake/t"
# ("file:/x" is a valid file URI; a drive letter "C:/x" is a path).
_ONE_SLASH = re.compile(r"(?!file:)([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")


def _uris(config: IngestConfig) -> Iterator[tuple[str, str]]:
    """Refuses a URI whose scheme has one slash after it: taken as a local relative path,
    it would write a directory named like the scheme."""
    uris = [("table.uri", config.table.uri), ("dead_letter.uri", config.dead_letter.uri)]
    uris.append(("handoff.root", config.handoff.root))
    uris += [(f"route[{i}].uri", r.uri) for i, r in enumerate(config.route)]
    uris += [(f"table.transform_tables.{k}", v) for k, v in config.table.transform_tables.items()]
    for key, uri in uris:
        if found := _ONE_SLASH.match(uri or ""):
            scheme = found.group(1)
            yield (
                key,
                f"{uri!r} has one slash after {scheme}: (write {scheme}://...); as it is, it "
                "would be a local path",
            )


# The property whose expiry of txn entries breaks exactly-once for quiet partitions
# (``ingest.sink.maintenance.maintain.TXN_RETENTION_PROPERTY`` refuses a table that has it).
_TXN_RETENTION = "delta.setTransactionRetentionDuration"


def _properties(config: IngestConfig) -> Iterator[tuple[str, str]]:
    owners = [("table.properties", config.table.properties)]
    owners += [(f"route[{i}].properties", r.properties or {}) for i, r in enumerate(config.route)]
    for key, properties in owners:
        if _TXN_RETENTION in properties:
            yield (
                key,
                f"{_TXN_RETENTION} would let the txn entries of quiet partitions expire, and "
                "exactly-once with them: leave it unset",
            )


def _topics(config: IngestConfig) -> Iterator[tuple[str, str]]:
    source, value, registry = config.source, config.table.value, config.schema_registry
    if bool(source.topics) == bool(source.topic_pattern):
        yield (
            "source.topics" if not source.topic_pattern else "source.topic_pattern",
            "set topics (a list of at least one) or topic_pattern, not both",
        )
    if source.topic_pattern is None:
        return
    by_topic = registry is not None and registry.subject_name_strategy != "record"
    own_tables = "{topic}" in (config.table.uri or config.table.name or "") and not config.route
    if value.format in REGISTRY_FORMATS and not value.schema and by_topic and not own_tables:
        yield (
            "source.topic_pattern",
            "with topic_pattern the columns cannot come from each topic's subject into one "
            'table: set table.value.schema, subject_name_strategy "record", or a table per '
            'topic (table.uri with "{topic}")',
        )
    if config.table.key.format in REGISTRY_FORMATS and by_topic:
        yield (
            "source.topic_pattern",
            "with topic_pattern the key column cannot come from each topic's key subject: "
            'set subject_name_strategy "record" and table.key.record_name',
        )


def _routes(config: IngestConfig) -> Iterator[tuple[str, str]]:
    for index, route in enumerate(config.route):
        key = f"route[{index}]"
        by = [name for name in ("header", "field") if getattr(route, name) is not None]
        if len(by) > 1:
            yield f"{key}.field", "a route goes by a header or by a value field, not both"
        if by and route.matches is None:
            yield (
                f"{key}.matches",
                f"a route by {by[0]} needs the regular expression its value matches",
            )
        if route.matches is not None and not by:
            yield f"{key}.matches", "applies to a route by header or field (set one of them)"
        value = route.value
        if value is not None and value.format in REGISTRY_FORMATS and not value.schema:
            yield (
                f"{key}.value.schema",
                f'format "{value.format}" in a route needs its columns: value.schema',
            )
        if route.key is not None and route.key.format in REGISTRY_FORMATS:
            yield (
                f"{key}.key.format",
                "a route cannot set a registry format for its keys (set it in [table.key])",
            )


def _registered(config: IngestConfig) -> Iterator[tuple[str, str]]:
    registry, key = config.schema_registry, config.table.key
    forms = [f for f in (config.table.value.format, key.format) if f in REGISTRY_FORMATS]
    if not forms:
        return
    if registry is None:
        yield "schema_registry", f'format "{forms[0]}" needs a [schema_registry] table'
        return
    strategy = registry.subject_name_strategy
    by_record = strategy != "topic"
    if config.table.value.format in REGISTRY_FORMATS and by_record and not registry.record_name:
        yield (
            "schema_registry.record_name",
            f'subject_name_strategy "{strategy}" needs the record name',
        )
    if key.format in REGISTRY_FORMATS and by_record and not key.record_name:
        yield (
            "table.key.record_name",
            f'subject_name_strategy "{strategy}" needs the key\'s record name',
        )
    if registry.bearer_token_env and registry.basic_auth_user:
        yield "schema_registry.bearer_token_env", "basic auth or a bearer token, not both"


def _maintenance(config: IngestConfig) -> Iterator[tuple[str, str]]:
    maintenance = config.maintenance
    floor_hours = MaintenanceSection.VACUUM_FLOOR_HOURS
    if maintenance.vacuum_retention < floor_hours * 3600:
        yield (
            "maintenance.vacuum_retention",
            f"{float(maintenance.vacuum_retention) / 3600:g}h is below the floor of {floor_hours}h: "
            f"VACUUM deletes removed files a running query, a time-travel read or a lagging "
            f"streaming reader may still need, and (vacuum_full) files a batch in flight "
            f"wrote but has not committed yet; Delta's own check is 168h",
        )
    floor_seconds = MaintenanceSection.LOG_RETENTION_FLOOR_SECONDS
    if maintenance.log_retention < floor_seconds:
        yield (
            "maintenance.log_retention",
            f"{float(maintenance.log_retention):g}s is below the floor of {floor_seconds // 3600}h: "
            f"a commit's conflict check reads the commits since its snapshot, and "
            f"time travel and `ingest status` read older ones",
        )
    if config.table.uri is None:
        return  # a table by name: its dead letters are a table beside it, never inside
    table = config.table.uri.rstrip("/")
    if (
        maintenance.vacuum
        and maintenance.vacuum_full
        and config.dead_letter_uri().startswith(table + "/")
    ):
        yield (
            "dead_letter.uri",
            f"a full VACUUM of {table} would delete the dead-letter table inside it "
            f"({config.dead_letter_uri()}): move it out, or set maintenance.vacuum_full "
            f"= false",
        )
