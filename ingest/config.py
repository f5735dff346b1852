"""The TOML configuration of ``ingest run | replay | status``, validated on load.

Every section is a frozen dataclass; the loader walks the TOML tables against
them, so an unknown key, a wrong type or a bad value is refused with the file
and the dotted key, e.g. ``conf/x.toml: trigger.max_bytes: expected a size like
"256MiB"``. Sizes ("256MiB", "1.5GB", 1048576) and durations ("500ms", "30s",
"5m", 2.5) have their own parsers. Secrets are never written in the file: a
secret key takes the name of an environment variable (``password_env``), read
when the config loads and kept in a masked ``Secret``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from ingest.client.config import ClientConfig, SaslConfig, Secret, TlsConfig
from ingest.ddl import check_ddl
from ingest.errors import ConfigError


class Size(int):
    """A byte count; TOML may give an integer or a string such as "256MiB"."""


class Duration(float):
    """Seconds; TOML may give a number or a string such as "500ms", "30s", "5m"."""


_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3, "tib": 1024**4,
    "k": 1024, "m": 1024**2, "g": 1024**3,
}  # fmt: skip
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "": 1.0}
# Spark's master URLs (Spark 4: no Mesos). Anything else fails at load, not in the JVM.
_HOST_PORT = r"[A-Za-z0-9_.\-]+:\d{1,5}"
SPARK_MASTER = re.compile(
    r"local(\[(\*|[1-9]\d*)(,\s*[1-9]\d*)?\])?"
    r"|local-cluster\[[1-9]\d*,\s*[1-9]\d*,\s*[1-9]\d*\]"
    rf"|spark://{_HOST_PORT}(,{_HOST_PORT})*"
    r"|yarn"
    r"|k8s://(https?://)?[A-Za-z0-9_.\-\[\]:]+(:\d{1,5})?(/.*)?"
)
_NUMBER_UNIT = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: object) -> Size:
    if isinstance(value, bool):
        raise ValueError('expected a size like "256MiB"')
    if isinstance(value, int) and value >= 0:
        return Size(value)
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _SIZE_UNITS:
            return Size(int(float(match.group(1)) * _SIZE_UNITS[match.group(2).lower()]))
    raise ValueError('expected a size like "256MiB"')


def parse_duration(value: object) -> Duration:
    if isinstance(value, bool):
        raise ValueError('expected a duration like "30s" or "500ms"')
    if isinstance(value, int | float) and value >= 0:
        return Duration(float(value))
    if isinstance(value, str):
        match = _NUMBER_UNIT.match(value)
        if match and match.group(2).lower() in _DURATION_UNITS:
            return Duration(float(match.group(1)) * _DURATION_UNITS[match.group(2).lower()])
    raise ValueError('expected a duration like "30s" or "500ms"')


# -- sections -----------------------------------------------------------------------------


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
    tls: TlsSection | None = None
    sasl: SaslSection | None = None


@dataclass(frozen=True)
class SourceSection:
    topics: list[str]
    group_id: str
    group_instance_id: str | None = None
    assignors: list[Literal["cooperative-sticky", "range", "roundrobin"]] = field(
        default_factory=lambda: ["cooperative-sticky", "range"]
    )
    session_timeout: Duration = Duration(45)
    heartbeat_interval: Duration = Duration(3)
    rebalance_timeout: Duration = Duration(300)
    auto_offset_reset: Literal["earliest", "latest", "fail"] = "earliest"
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    offsets_topic_partitions: int = 50
    leave_group_on_shutdown: bool | None = None  # None: leave unless static


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


@dataclass(frozen=True)
class TableSection:
    uri: str
    mode: Literal["append", "upsert"] = "append"
    merge_keys: list[str] = field(default_factory=list)
    partition_by: list[str] = field(default_factory=list)
    transform: str | None = None  # SQL over the view `batch`
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


@dataclass(frozen=True)
class MetricsSection:
    listen: str | None = None  # "127.0.0.1:9464" serves Prometheus text


@dataclass(frozen=True)
class LoggingSection:
    format: Literal["kv", "json"] = "kv"
    level: Literal["debug", "info", "warning", "error"] = "info"


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
    path: str = "<memory>"
    # Secrets resolved from the environment at load time, by dotted key.
    secrets: Mapping[str, Secret] = field(default_factory=dict, repr=False)

    def client_config(self) -> ClientConfig:
        kafka = self.kafka
        tls = None
        if kafka.security_protocol in ("SSL", "SASL_SSL"):
            section = kafka.tls or TlsSection()
            tls = TlsConfig(
                ca_file=section.ca_file,
                cert_file=section.cert_file,
                key_file=section.key_file,
                key_password=self.secrets.get("kafka.tls.key_password_env"),
                check_hostname=section.check_hostname,
            )
        sasl = None
        if kafka.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
            assert kafka.sasl is not None  # checked on load
            sasl = SaslConfig(
                mechanism=kafka.sasl.mechanism,
                username=kafka.sasl.username,
                password=self.secrets["kafka.sasl.password_env"],
            )
        return ClientConfig(
            bootstrap_servers=tuple(kafka.bootstrap_servers),
            client_id=kafka.client_id,
            connect_timeout=float(kafka.connect_timeout),
            request_timeout=float(kafka.request_timeout),
            retry_timeout=float(kafka.retry_timeout),
            tls=tls,
            sasl=sasl,
        )

    def table_storage_options(self) -> dict[str, str]:
        options = dict(self.table.storage_options)
        for option in self.table.storage_options_env:
            options[option] = self.secrets[f"table.storage_options_env.{option}"].reveal()
        return options

    def dead_letter_uri(self) -> str:
        return self.dead_letter.uri or self.table.uri.rstrip("/") + "_dead_letters"


# -- the loader ---------------------------------------------------------------------------


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
    values = _build(IngestConfig, document, key="", path=path, skip={"path", "secrets"})
    config = IngestConfig(**values, path=path)
    secrets = _resolve_secrets(config, env, path)
    config = dataclasses.replace(config, secrets=secrets)
    _check_consistency(config)
    return config


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(
    cls: type, table: object, *, key: str, path: str, skip: set[str] | None = None
) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError("expected a table", path=path, key=key or None)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in (skip or set())}
    unknown = sorted(set(table) - set(fields))
    if unknown:
        where = f"{key}.{unknown[0]}" if key else unknown[0]
        known = ", ".join(sorted(fields))
        raise ConfigError(f"unknown key (known here: {known})", path=path, key=where)
    hints = _hints(cls)
    out: dict[str, Any] = {}
    for name, spec in fields.items():
        dotted = f"{key}.{name}" if key else name
        if name not in table:
            if spec.default is dataclasses.MISSING and spec.default_factory is dataclasses.MISSING:
                raise ConfigError("missing required key", path=path, key=dotted)
            continue
        out[name] = _convert(hints[name], table[name], key=dotted, path=path)
    return out


def _convert(hint: Any, value: object, *, key: str, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:
            return _convert(options[0], value, key=key, path=path)
    if origin is Literal:
        if value not in args:
            choices = ", ".join(repr(a) for a in args)
            raise ConfigError(f"expected one of {choices}, got {value!r}", path=path, key=key)
        return value
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError("expected a list", path=path, key=key)
        return [
            _convert(args[0], item, key=f"{key}[{i}]", path=path) for i, item in enumerate(value)
        ]
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError("expected a table", path=path, key=key)
        return {k: _convert(args[1], v, key=f"{key}.{k}", path=path) for k, v in value.items()}
    if hint is Size or hint is Duration:
        parse = parse_size if hint is Size else parse_duration
        try:
            return parse(value)
        except ValueError as exc:
            raise ConfigError(str(exc), path=path, key=key) from None
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint(**_build(hint, value, key=key, path=path))
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"expected true or false, got {value!r}", path=path, key=key)
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"expected an integer, got {value!r}", path=path, key=key)
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"expected a string, got {value!r}", path=path, key=key)
        return value
    raise ConfigError(f"unsupported config type {hint!r}", path=path, key=key)


def _resolve_secrets(config: IngestConfig, env: Mapping[str, str], path: str) -> dict[str, Secret]:
    wanted: dict[str, str] = {}
    if config.kafka.sasl is not None:
        wanted["kafka.sasl.password_env"] = config.kafka.sasl.password_env
    if config.kafka.tls is not None and config.kafka.tls.key_password_env:
        wanted["kafka.tls.key_password_env"] = config.kafka.tls.key_password_env
    for option, variable in config.table.storage_options_env.items():
        wanted[f"table.storage_options_env.{option}"] = variable
    secrets = {}
    for key, variable in wanted.items():
        if variable not in env:
            raise ConfigError(f"environment variable {variable} is not set", path=path, key=key)
        secrets[key] = Secret(env[variable])
    return secrets


def _check_consistency(config: IngestConfig) -> None:
    path = config.path
    if not config.kafka.bootstrap_servers:
        raise ConfigError("needs at least one host:port", path=path, key="kafka.bootstrap_servers")
    for i, server in enumerate(config.kafka.bootstrap_servers):
        host, _, port = server.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ConfigError(
                f"expected host:port, got {server!r}",
                path=path,
                key=f"kafka.bootstrap_servers[{i}]",
            )
    if config.kafka.security_protocol.startswith("SASL") and config.kafka.sasl is None:
        raise ConfigError(
            f"{config.kafka.security_protocol} needs a [kafka.sasl] table",
            path=path,
            key="kafka.sasl",
        )
    if not config.source.topics:
        raise ConfigError("needs at least one topic", path=path, key="source.topics")
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
    if config.table.value.schema:
        try:
            check_ddl(config.table.value.schema)
        except ConfigError as exc:
            raise ConfigError(str(exc), path=path, key="table.value.schema") from None
    if not SPARK_MASTER.fullmatch(config.spark.master):
        raise ConfigError(
            f"expected a Spark master URL (local, local[N], local[*], local[N,F], "
            f"local-cluster[N,C,M], spark://host:port, yarn, k8s://...), "
            f"got {config.spark.master!r}",
            path=path,
            key="spark.master",
        )
    if config.worker.resume_unacked_bytes >= config.worker.max_unacked_bytes:
        raise ConfigError(
            "must be below worker.max_unacked_bytes", path=path, key="worker.resume_unacked_bytes"
        )
    if config.handoff.mode == "files" and not config.handoff.root:
        raise ConfigError(
            'mode "files" needs a root directory or URI', path=path, key="handoff.root"
        )


def render_config(config: IngestConfig) -> str:
    """The effective config as TOML, secrets masked (for ``--print-config``)."""
    lines: list[str] = []
    for section in dataclasses.fields(config):
        if section.name in ("path", "secrets"):
            continue
        _render_table(section.name, getattr(config, section.name), config.secrets, lines)
    return "\n".join(lines) + "\n"


def _render_table(name: str, value: Any, secrets: Mapping[str, Secret], lines: list[str]) -> None:
    scalars: list[str] = []
    nested: list[tuple[str, Any]] = []
    for spec in dataclasses.fields(value):
        item = getattr(value, spec.name)
        dotted = f"{name}.{spec.name}"
        if dataclasses.is_dataclass(item):
            nested.append((dotted, item))
        elif item is None:
            continue
        elif spec.name.endswith("_env") and isinstance(item, str):
            shown = "***" if dotted in secrets else "(unset)"
            scalars.append(f"{spec.name} = {toml_value(item)}  # value: {shown}")
        elif isinstance(item, dict) and spec.name == "storage_options_env":
            scalars.append(f"{spec.name} = {toml_value(item)}  # values: ***")
        else:
            scalars.append(f"{spec.name} = {toml_value(item)}")
    lines.append(f"[{name}]")
    lines.extend(scalars)
    lines.append("")
    for dotted, item in nested:
        _render_table(dotted, item, secrets, lines)


def toml_value(value: Any) -> str:
    """One value as TOML (sizes and durations in their config spelling)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Size):
        return f'"{_format_size(int(value))}"'
    if isinstance(value, Duration):
        return f'"{float(value):g}s"'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f'"{k}" = {toml_value(v)}' for k, v in value.items()) + " }"
    return repr(value)


def _format_size(value: int) -> str:
    for unit, factor in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= factor and value % factor == 0:
            return f"{value // factor}{unit}"
    return str(value)


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
