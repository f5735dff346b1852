"""Client configuration: addresses, timeouts, TLS and SASL, and the Secret wrapper.

Every field is validated on construction and a bad value raises ``ConfigError``
naming the key. Passwords are held in ``Secret``, whose repr, str and format
never show the value, so a config can be logged or put in an exception freely.
"""

from __future__ import annotations

import hmac
import ssl
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from ingest.errors import ConfigError
from ingest.redaction import MASK

__all__ = [
    "SASL_MECHANISMS",
    "ClientConfig",
    "ListOffsetsAnswers",
    "SaslConfig",
    "SaslMechanismName",
    "Secret",
    "TlsConfig",
    "parse_address",
    "parse_bootstrap",
]


class Secret:
    """A password or key passphrase that does not show itself.

    ``reveal()`` is the one way to read the value; use it only at the point of
    use (an HMAC key, an SSL call), never to build a message.
    """

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        if not isinstance(value, str):
            raise ConfigError("a Secret holds a str", key="secret")
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return f"Secret({MASK!r})"

    def __str__(self) -> str:
        return MASK

    def __format__(self, spec: str) -> str:
        return MASK

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))

    def __bool__(self) -> bool:
        return bool(self._value)


def _secret(value: Secret | str | None, key: str) -> Secret | None:
    if value is None or isinstance(value, Secret):
        return value
    if isinstance(value, str):
        return Secret(value)
    raise ConfigError(f"expected a Secret or str, got {type(value).__name__}", key=key)


def parse_address(text: str, *, key: str = "bootstrap_servers") -> tuple[str, int]:
    """``host:port`` (``[v6addr]:port`` for IPv6) into (host, port)."""
    text = text.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"{text!r} is not host:port", key=key)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536:
        raise ConfigError(f"{text!r}: port {port} is out of range", key=key)
    return host, port


def parse_bootstrap(servers: str | Sequence[str]) -> tuple[tuple[str, int], ...]:
    """A comma-separated string or a sequence of ``host:port`` into addresses."""
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    addresses = tuple(parse_address(item) for item in items if item.strip())
    if not addresses:
        raise ConfigError("at least one bootstrap server is needed", key="bootstrap_servers")
    return addresses


@dataclass(frozen=True, kw_only=True, slots=True)
class TlsConfig:
    """TLS towards the brokers.

    ``ca_file`` None trusts the system's default CAs. Hostname checking is on
    unless ``check_hostname=False`` is given explicitly; the certificate chain
    is always verified.
    """

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    key_password: Secret | None = None
    check_hostname: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "key_password", _secret(self.key_password, "tls.key_password"))
        if self.key_file is not None and self.cert_file is None:
            raise ConfigError("a client key needs its certificate (cert_file)", key="tls.key_file")
        if not isinstance(self.check_hostname, bool):
            raise ConfigError("must be true or false", key="tls.check_hostname")

    def context(self) -> ssl.SSLContext:
        """A client SSLContext: chain verified, hostname checked unless disabled explicitly."""
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        context.check_hostname = self.check_hostname
        context.verify_mode = ssl.CERT_REQUIRED
        if self.cert_file is not None:
            password = self.key_password.reveal() if self.key_password is not None else None
            try:
                context.load_cert_chain(self.cert_file, self.key_file, password=password)
            except (OSError, ssl.SSLError) as exc:
                # The ssl error text names files, never the passphrase.
                raise ConfigError(f"cannot load the client certificate: {exc}", key="tls") from None
        return context


ListOffsetsAnswers = Literal["auto", "trust", "check"]
SaslMechanismName = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
SASL_MECHANISMS: tuple[str, ...] = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclass(frozen=True, kw_only=True, slots=True)
class SaslConfig:
    """SASL credentials; a str password is wrapped in ``Secret`` on construction."""

    mechanism: SaslMechanismName
    username: str
    password: Secret
    # Kafka brokers store SCRAM credentials with at least 4096 iterations; a server
    # asking for fewer is refused, since it would weaken the proof we send.
    scram_min_iterations: int = 4096

    def __post_init__(self) -> None:
        if self.mechanism not in SASL_MECHANISMS:
            raise ConfigError(
                f"{self.mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}",
                key="sasl.mechanism",
            )
        if not self.username:
            raise ConfigError("must not be empty", key="sasl.username")
        object.__setattr__(self, "password", _secret(self.password, "sasl.password"))


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("ingest")
    except Exception:
        return "0.0.0"


@dataclass(frozen=True, kw_only=True, slots=True)
class ClientConfig:
    """Everything the client layer needs. Times are seconds."""

    # "host:port,host:port" or a sequence of "host:port"; tried in order.
    bootstrap_servers: str | tuple[str, ...] = "127.0.0.1:9092"
    client_id: str = "ingest"
    client_software_name: str = "ingest"
    client_software_version: str = field(default_factory=_package_version)
    connect_timeout: float = 10.0
    request_timeout: float = 30.0
    # A larger announced frame closes the connection before anything is allocated.
    max_frame_size: int = 128 * 1024 * 1024
    reconnect_backoff: float = 0.05
    reconnect_backoff_max: float = 5.0
    retry_backoff: float = 0.1
    retry_backoff_max: float = 1.0
    backoff_jitter: float = 0.2
    # How long a cluster-level operation keeps retrying retriable errors.
    retry_timeout: float = 30.0
    metadata_max_age: float = 300.0
    allow_auto_topic_creation: bool = False
    # Whether ListOffsets answers are taken at their word ("trust") or checked against a
    # Fetch and the records ("check"); "auto" trusts a broker that offers
    # OffsetForLeaderEpoch, as Apache Kafka does (docs/kafka-compat.md).
    list_offsets: ListOffsetsAnswers = "auto"
    tls: TlsConfig | None = None
    sasl: SaslConfig | None = None

    @property
    def bootstrap_addresses(self) -> tuple[tuple[str, int], ...]:
        return parse_bootstrap(self.bootstrap_servers)

    def __post_init__(self) -> None:
        if isinstance(self.bootstrap_servers, list):
            object.__setattr__(self, "bootstrap_servers", tuple(self.bootstrap_servers))
        parse_bootstrap(self.bootstrap_servers)
        for key in (
            "connect_timeout",
            "request_timeout",
            "reconnect_backoff",
            "reconnect_backoff_max",
            "retry_backoff",
            "retry_backoff_max",
            "metadata_max_age",
        ):
            value = getattr(self, key)
            if not isinstance(value, int | float) or value <= 0:
                raise ConfigError(f"must be a positive number of seconds, got {value!r}", key=key)
        if not isinstance(self.retry_timeout, int | float) or self.retry_timeout < 0:
            raise ConfigError("must be >= 0 seconds", key="retry_timeout")
        if not isinstance(self.client_id, str):
            raise ConfigError("must be a string", key="client_id")
        if not 0 <= self.backoff_jitter < 1:
            raise ConfigError("must be in [0, 1)", key="backoff_jitter")
        if self.list_offsets not in ("auto", "trust", "check"):
            raise ConfigError(
                f"must be auto, trust or check, got {self.list_offsets!r}", key="list_offsets"
            )
        if not isinstance(self.max_frame_size, int) or self.max_frame_size < 64:
            raise ConfigError("must be an int of at least 64 bytes", key="max_frame_size")
