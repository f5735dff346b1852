"""The [schema_registry] section: where the writers' schemas of Avro and JSON Schema values
are, declared as ``sections.py`` says."""

from __future__ import annotations

from typing import Literal

from pydantic import Field
from pydantic.dataclasses import dataclass

# From the package, not ``units.py`` (see sections.py).
from ingest.config.units import SECTION, Duration, Str


@dataclass(frozen=True, config=SECTION)
class SchemaRegistrySection:
    """A Confluent-compatible Schema Registry (formats "avro", "protobuf", "json_schema")."""

    urls: list[Str] = Field(min_length=1)
    """Its base URLs, tried in turn, e.g. ["http://registry:8081"] (Apicurio:
    ".../apis/ccompat/v7")."""
    basic_auth_user: Str | None = None
    """User for HTTP basic auth."""
    basic_auth_password_env: Str | None = None
    """Name of the environment variable holding the basic-auth password."""
    bearer_token_env: Str | None = None
    """Name of the environment variable holding a bearer token (instead of basic auth)."""
    ca_file: Str | None = None
    """PEM file of the CAs of an https registry (default: system)."""
    cert_file: Str | None = None
    """PEM client certificate (mTLS)."""
    key_file: Str | None = None
    """PEM private key of cert_file."""
    request_timeout: Duration = Duration(10)
    """How long one request may take."""
    retry_timeout: Duration = Duration(60)
    """How long a registry that does not answer (or answers 5xx) is retried, with backoff, before
    on_error applies."""
    on_error: Literal["fail", "dead_letter"] = "fail"
    """A schema the registry does not give (down past retry_timeout, or an unknown id): "fail" the
    batch (it is retried; nothing is committed), or "dead_letter" its records with the reason."""
    subject_name_strategy: Literal["topic", "record", "topic_record"] = "topic"
    """Where the table's columns come from when table.value.schema is unset: the latest schema of
    "<topic>-value" ("topic"), "<record_name>" ("record") or "<topic>-<record_name>"
    ("topic_record")."""
    record_name: Str | None = None
    """The record's full name, for the "record" strategies. Protobuf: also the message of the
    writer's file whose fields are the columns (default: the file's first); a value of another
    message is a dead letter."""
