"""Reading a TOML config: the document validated against ``IngestConfig`` (pydantic),
then the secrets read from the environment and the checks that span keys.

Every error is a ``ConfigError`` naming the file and the dotted key; ``config_error`` is
the one place pydantic's errors become ours.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter, ValidationError
from pydantic_core import ErrorDetails

from ingest.client.config import Secret
from ingest.config.sections import NOT_IN_FILE, IngestConfig, MaintenanceSection
from ingest.config.units import DELTA_URI, HOST_PORT, SPARK_MASTER_URL, Size
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
    _check_consistency(config)
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
}
# A list that may not be empty: what it needs at least one of.
_AT_LEAST_ONE = {"bootstrap_servers": "host:port", "urls": "URL"}


def _message(error: ErrorDetails, loc: tuple[str | int, ...]) -> str:
    kind, value = error["type"], error["input"]
    context = error.get("ctx") or {}
    if kind in _UNKNOWN:
        return f"unknown key (known here: {_known(loc[:-1])})"
    if kind == "missing":
        return "missing required key"
    if kind in ("dataclass_type", "dataclass_exact_type", "dict_type", "model_type"):
        return "expected a table"
    if kind == "list_type":
        return "expected a list"
    if kind == "literal_error":
        # pydantic spells the choices "'a', 'b' or 'c'"; every choice is a quoted string.
        choices = ", ".join(repr(c) for c in re.findall(r"'([^']*)'", context["expected"]))
        return f"expected one of {choices}, got {value!r}"
    if kind == "bool_type":
        return f"expected true or false, got {value!r}"
    if kind in ("int_type", "int_from_float"):
        return f"expected an integer, got {value!r}"
    if kind == "string_type":
        return f"expected a string, got {value!r}"
    if kind == "string_pattern_mismatch":
        return _MISMATCH[context["pattern"]].format(value)
    if kind == "too_short":
        return f"needs at least one {_AT_LEAST_ONE.get(str(loc[-1]), 'entry')}"
    if kind in ("greater_than", "greater_than_equal"):
        bound = context.get("gt", context.get("ge"))
        shown = bound.spell() if isinstance(bound, Size) else bound
        return f"must be {'above' if kind == 'greater_than' else 'at least'} {shown}"
    if kind == "value_error":  # parse_size, parse_duration, the view names
        return str(context["error"])
    return str(error["msg"])


def _known(loc: tuple[str | int, ...]) -> str:
    """The keys of the table at ``loc`` (a path of field names from ``IngestConfig``)."""
    section: Any = IngestConfig
    for name in loc:
        hint = typing.get_type_hints(section)[str(name)]
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


def _check_changes(config: IngestConfig) -> None:
    """``table.tombstones`` and ``table.value.envelope`` against the mode (the same rules
    as ``ingest.sink.config.check_changes``, which this layer cannot import)."""
    path, table = config.path, config.table
    if table.mode == "append" and table.tombstones == "delete":
        raise ConfigError(
            'needs mode "upsert": an append table has no row of a key to delete '
            '(use "keep", "ignore" or "dead_letter")',
            path=path,
            key="table.tombstones",
        )
    if table.mode == "upsert" and table.tombstones == "keep":
        raise ConfigError(
            'applies to append mode: in upsert mode a tombstone is "delete", "ignore" '
            'or "dead_letter"',
            path=path,
            key="table.tombstones",
        )
    if table.value.envelope == "debezium" and table.value.format != "json":
        raise ConfigError(
            'needs format "json" (the schema describes the rows in before/after)',
            path=path,
            key="table.value.envelope",
        )
    if table.value.envelope == "debezium" and table.mode != "upsert":
        raise ConfigError(
            'needs mode "upsert": change events update and delete rows by key',
            path=path,
            key="table.value.envelope",
        )


def _check_consistency(config: IngestConfig) -> None:
    path = config.path
    if config.kafka.security_protocol.startswith("SASL") and config.kafka.sasl is None:
        raise ConfigError(
            f"{config.kafka.security_protocol} needs a [kafka.sasl] table",
            path=path,
            key="kafka.sasl",
        )
    _check_topics(config)
    _check_routes(config)
    if config.source.heartbeat_interval >= config.source.session_timeout:
        raise ConfigError(
            "must be shorter than source.session_timeout",
            path=path,
            key="source.heartbeat_interval",
        )
    if config.table.mode == "upsert" and not config.table.merge_keys:
        raise ConfigError('mode "upsert" needs merge_keys', path=path, key="table.merge_keys")
    if config.table.value.format == "json" and not config.table.value.schema:
        raise ConfigError(
            'format "json" needs a schema (Spark DDL)', path=path, key="table.value.schema"
        )
    _check_changes(config)
    _check_registered(config)
    if config.table.value.schema:
        try:
            check_ddl(config.table.value.schema)
        except ConfigError as exc:
            raise ConfigError(str(exc), path=path, key="table.value.schema") from None
    if config.table.transform_tables and config.table.transform is None:
        raise ConfigError(
            "names tables for a transform, but table.transform is not set",
            path=path,
            key="table.transform_tables",
        )
    if config.worker.resume_unacked_bytes >= config.worker.max_unacked_bytes:
        raise ConfigError(
            "must be below worker.max_unacked_bytes", path=path, key="worker.resume_unacked_bytes"
        )
    if config.handoff.mode == "files" and not config.handoff.root:
        raise ConfigError(
            'mode "files" needs a root directory or URI', path=path, key="handoff.root"
        )
    _check_maintenance(config)
    _check_uris(config)
    _check_properties(config)


# A scheme followed by one slash ("s3:/lake/t"): what Path() makes of "s3://lake/t"
# ("file:/x" is a valid file URI; a drive letter "C:/x" is a path).
_ONE_SLASH = re.compile(r"(?!file:)([A-Za-z][A-Za-z0-9+.-]+):/(?!/)")


def _check_uris(config: IngestConfig) -> None:
    """Refuses a URI whose scheme has one slash after it: taken as a local relative path,
    it would write a directory named like the scheme."""
    uris = [("table.uri", config.table.uri), ("dead_letter.uri", config.dead_letter.uri)]
    uris.append(("handoff.root", config.handoff.root))
    uris += [(f"route[{i}].uri", r.uri) for i, r in enumerate(config.route)]
    uris += [(f"table.transform_tables.{k}", v) for k, v in config.table.transform_tables.items()]
    for key, uri in uris:
        found = _ONE_SLASH.match(uri or "")
        if found:
            scheme = found.group(1)
            raise ConfigError(
                f"{uri!r} has one slash after {scheme}: (write {scheme}://...); as it is, it "
                "would be a local path",
                path=config.path,
                key=key,
            )


# The property whose expiry of txn entries breaks exactly-once for quiet partitions
# (``ingest.sink.maintenance.TXN_RETENTION_PROPERTY`` refuses a table that has it).
_TXN_RETENTION = "delta.setTransactionRetentionDuration"


def _check_properties(config: IngestConfig) -> None:
    owners = [("table.properties", config.table.properties)]
    owners += [(f"route[{i}].properties", r.properties or {}) for i, r in enumerate(config.route)]
    for key, properties in owners:
        if _TXN_RETENTION in properties:
            raise ConfigError(
                f"{_TXN_RETENTION} would let the txn entries of quiet partitions expire, and "
                "exactly-once with them: leave it unset",
                path=config.path,
                key=key,
            )


def _check_topics(config: IngestConfig) -> None:
    path, source = config.path, config.source
    if bool(source.topics) == bool(source.topic_pattern):
        raise ConfigError(
            "set topics (a list of at least one) or topic_pattern, not both",
            path=path,
            key="source.topics" if not source.topic_pattern else "source.topic_pattern",
        )
    if source.topic_pattern is None:
        return
    try:
        re.compile(source.topic_pattern)
    except re.error as exc:
        raise ConfigError(
            f"not a regular expression: {exc}", path=path, key="source.topic_pattern"
        ) from None
    value = config.table.value
    registry = config.schema_registry
    by_topic = registry is not None and registry.subject_name_strategy != "record"
    own_tables = "{topic}" in config.table.uri and not config.route
    if value.format in REGISTRY_FORMATS and not value.schema and by_topic and not own_tables:
        raise ConfigError(
            "with topic_pattern the columns cannot come from each topic's subject into one "
            'table: set table.value.schema, subject_name_strategy "record", or a table per '
            'topic (table.uri with "{topic}")',
            path=path,
            key="source.topic_pattern",
        )
    if config.table.key.format in REGISTRY_FORMATS and by_topic:
        raise ConfigError(
            "with topic_pattern the key column cannot come from each topic's key subject: "
            'set subject_name_strategy "record" and table.key.record_name',
            path=path,
            key="source.topic_pattern",
        )


def _check_routes(config: IngestConfig) -> None:
    for index, route in enumerate(config.route):
        key = f"route[{index}]"
        try:
            re.compile(route.topics)
        except re.error as exc:
            raise ConfigError(
                f"not a regular expression: {exc}", path=config.path, key=f"{key}.topics"
            ) from None
        by = [name for name in ("header", "field") if getattr(route, name) is not None]
        if len(by) > 1:
            raise ConfigError(
                "a route goes by a header or by a value field, not both",
                path=config.path,
                key=f"{key}.field",
            )
        if by and route.matches is None:
            raise ConfigError(
                f"a route by {by[0]} needs the regular expression its value matches",
                path=config.path,
                key=f"{key}.matches",
            )
        if route.matches is not None:
            if not by:
                raise ConfigError(
                    "applies to a route by header or field (set one of them)",
                    path=config.path,
                    key=f"{key}.matches",
                )
            try:
                re.compile(route.matches)
            except re.error as exc:
                raise ConfigError(
                    f"not a regular expression: {exc}", path=config.path, key=f"{key}.matches"
                ) from None
        value = route.value
        if value is not None and value.format in REGISTRY_FORMATS and not value.schema:
            raise ConfigError(
                f'format "{value.format}" in a route needs its columns: value.schema',
                path=config.path,
                key=f"{key}.value.schema",
            )
        if route.key is not None and route.key.format in REGISTRY_FORMATS:
            raise ConfigError(
                "a route cannot set a registry format for its keys (set it in [table.key])",
                path=config.path,
                key=f"{key}.key.format",
            )


def _check_registered(config: IngestConfig) -> None:
    path, registry = config.path, config.schema_registry
    forms = [
        f for f in (config.table.value.format, config.table.key.format) if f in REGISTRY_FORMATS
    ]
    if not forms:
        return
    form = forms[0]
    if registry is None:
        raise ConfigError(
            f'format "{form}" needs a [schema_registry] table', path=path, key="schema_registry"
        )
    key = config.table.key
    by_record = registry.subject_name_strategy != "topic"
    if config.table.value.format in REGISTRY_FORMATS and by_record and not registry.record_name:
        raise ConfigError(
            f'subject_name_strategy "{registry.subject_name_strategy}" needs the record name',
            path=path,
            key="schema_registry.record_name",
        )
    if key.format in REGISTRY_FORMATS and by_record and not key.record_name:
        raise ConfigError(
            f'subject_name_strategy "{registry.subject_name_strategy}" needs the key\'s '
            "record name",
            path=path,
            key="table.key.record_name",
        )
    if registry.bearer_token_env and registry.basic_auth_user:
        raise ConfigError(
            "basic auth or a bearer token, not both",
            path=path,
            key="schema_registry.bearer_token_env",
        )


def _check_maintenance(config: IngestConfig) -> None:
    path, upkeep = config.path, config.maintenance
    floor_hours = MaintenanceSection.VACUUM_FLOOR_HOURS
    if upkeep.vacuum_retention < floor_hours * 3600:
        raise ConfigError(
            f"{float(upkeep.vacuum_retention) / 3600:g}h is below the floor of {floor_hours}h: "
            f"VACUUM deletes removed files a running query, a time-travel read or a lagging "
            f"streaming reader may still need, and (vacuum_full) files a batch in flight "
            f"wrote but has not committed yet; Delta's own check is 168h",
            path=path,
            key="maintenance.vacuum_retention",
        )
    floor_seconds = MaintenanceSection.LOG_RETENTION_FLOOR_SECONDS
    if upkeep.log_retention < floor_seconds:
        raise ConfigError(
            f"{float(upkeep.log_retention):g}s is below the floor of {floor_seconds // 3600}h: "
            f"a commit's conflict check reads the commits since its snapshot, and "
            f"time travel and `ingest status` read older ones",
            path=path,
            key="maintenance.log_retention",
        )
    if upkeep.vacuum and upkeep.vacuum_full:
        table = config.table.uri.rstrip("/")
        if config.dead_letter_uri().startswith(table + "/"):
            raise ConfigError(
                f"a full VACUUM of {table} would delete the dead-letter table inside it "
                f"({config.dead_letter_uri()}): move it out, or set maintenance.vacuum_full "
                f"= false",
                path=path,
                key="dead_letter.uri",
            )
