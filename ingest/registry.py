"""A client of a Confluent-compatible Schema Registry: schemas by id, a subject's latest.

Only the reads a consumer needs, over HTTP(S) with the standard library:
``GET /schemas/ids/{id}`` (the writer's schema of a record, cached for the life of the
process: an id never changes meaning), ``GET /subjects/{subject}/versions/latest`` (the
table's columns when the config gives none) and ``GET /subjects/{subject}/versions/{n}``
(a schema's references: the files a Protobuf schema imports, the documents a JSON
Schema's ``$ref`` names; cached too, a version
never changes either). Each may ask for a ``format`` (Confluent's registry gives a
Protobuf schema as ``.proto`` text unless asked for ``format=serialized``). Basic auth
or a bearer token, a CA file and a client certificate; several URLs are tried in turn.

A registry that does not answer, or answers 5xx or 429, is retried with backoff
(``client.backoff``) until ``retry_timeout``; then ``RegistryError`` with
``retriable=True``. A 404 (an unknown schema id or subject) or a refused credential
is not retried: ``RegistryError`` with ``retriable=False`` and the registry's own
error code. The caller decides what a failure costs (a dead letter, or the batch).
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ingest.client.backoff import Backoff
from ingest.client.client_config import Secret
from ingest.errors import RegistryError

__all__ = [
    "REGISTRY_FORMATS",
    "RegisteredSchema",
    "RegistryClient",
    "RegistrySettings",
    "client_for",
    "subject_for",
]


# The value formats whose writers' schemas a registry holds (ingest/formats/framed.py).
REGISTRY_FORMATS = ("avro", "protobuf", "json_schema")
# The most one answer may be: anyone who can register a schema is untrusted, and the
# registry's answer is read whole into memory. An error answer's body is read for its
# message only.
MAX_ANSWER_BYTES = 16 * 1024 * 1024
MAX_ERROR_BYTES = 64 * 1024


@dataclass(frozen=True)
class RegistrySettings:
    """Where the registry is and how to reach it (picklable: tasks get a copy)."""

    urls: tuple[str, ...]
    basic_auth_user: str | None = None
    basic_auth_password: Secret | None = None
    bearer_token: Secret | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    request_timeout: float = 10.0
    retry_timeout: float = 60.0

    def __post_init__(self) -> None:
        if not self.urls:
            raise ValueError("a registry needs at least one URL")


@dataclass(frozen=True)
class RegisteredSchema:
    """A schema as the registry holds it."""

    schema_id: int
    schema_type: str  # AVRO, PROTOBUF or JSON
    text: str
    subject: str | None = None
    version: int | None = None
    references: tuple[dict[str, Any], ...] = field(default=())


class RegistryClient:
    """Reads schemas from one registry; thread-safe, with a cache by id."""

    def __init__(
        self,
        settings: RegistrySettings,
        *,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self._by_id: dict[tuple[int, str | None], RegisteredSchema] = {}
        self._by_version: dict[tuple[str, int, str | None], RegisteredSchema] = {}
        self._lock = threading.Lock()
        self._sleep = sleep
        self._clock = clock
        self._context = _ssl_context(settings)

    def schema(self, schema_id: int, *, fmt: str | None = None) -> RegisteredSchema:
        """The schema registered under ``schema_id`` (from the cache after the first);
        ``fmt``: the registry's ``format`` query parameter (e.g. "serialized")."""
        with self._lock:
            found = self._by_id.get((schema_id, fmt))
        if found is not None:
            return found
        answer = self._get(
            f"/schemas/ids/{schema_id}{_format_query(fmt)}", what=f"schema id {schema_id}"
        )
        schema = RegisteredSchema(
            schema_id=schema_id,
            schema_type=str(answer.get("schemaType") or "AVRO"),
            text=str(answer["schema"]),
            references=tuple(answer.get("references") or ()),
        )
        with self._lock:
            self._by_id[(schema_id, fmt)] = schema
        return schema

    def latest(self, subject: str) -> RegisteredSchema:
        """The latest version registered under ``subject`` (never cached)."""
        schema = self._version(subject, "latest", None)
        with self._lock:
            self._by_id.setdefault((schema.schema_id, None), schema)
        return schema

    def version(self, subject: str, version: int, *, fmt: str | None = None) -> RegisteredSchema:
        """Version ``version`` of ``subject`` (cached: a registered version never changes),
        as a schema's references name the schemas it uses."""
        key = (subject, version, fmt)
        with self._lock:
            found = self._by_version.get(key)
        if found is not None:
            return found
        schema = self._version(subject, str(version), fmt)
        with self._lock:
            self._by_version[key] = schema
        return schema

    def _version(self, subject: str, version: str, fmt: str | None) -> RegisteredSchema:
        quoted = urllib.parse.quote(subject, safe="")
        answer = self._get(
            f"/subjects/{quoted}/versions/{version}{_format_query(fmt)}",
            what=f"subject {subject!r} version {version}",
        )
        return RegisteredSchema(
            schema_id=int(answer["id"]),
            schema_type=str(answer.get("schemaType") or "AVRO"),
            text=str(answer["schema"]),
            subject=subject,
            version=int(answer["version"]),
            references=tuple(answer.get("references") or ()),
        )

    # -- HTTP ------------------------------------------------------------------------------

    def _get(self, path: str, *, what: str) -> dict[str, Any]:
        settings = self.settings
        deadline = self._clock() + settings.retry_timeout
        backoff = Backoff(0.1, 5.0, clock=self._clock)
        last = ""
        while True:
            for url in settings.urls:
                try:
                    return self._get_once(url.rstrip("/") + path)
                except RegistryError as exc:
                    if not exc.retriable:
                        raise RegistryError(
                            f"{what}: {exc}", status=exc.status, code=exc.code, retriable=False
                        ) from None
                    last = str(exc)
            wait = backoff.failed()
            if self._clock() + wait > deadline:
                raise RegistryError(
                    f"{what}: the schema registry did not answer within "
                    f"{settings.retry_timeout:g}s ({last})",
                    retriable=True,
                )
            self._sleep(wait)

    def _get_once(self, url: str) -> dict[str, Any]:
        request = urllib.request.Request(url, headers=_ACCEPT)
        # Credentials are never copied onto a redirect: urllib copies ordinary headers to
        # any redirect's target, another host included.
        for name, value in self._credentials().items():
            request.add_unredirected_header(name, value)
        try:
            with urllib.request.urlopen(
                request, timeout=self.settings.request_timeout, context=self._context
            ) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            status, detail = exc.code, _error_detail(exc)
            code = detail.get("error_code")
            message = f"{url}: HTTP {status}: {detail.get('message') or exc.reason}"
            raise RegistryError(
                message,
                status=status,
                code=int(code) if isinstance(code, int) else None,
                retriable=status >= 500 or status == 429,
            ) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryError(f"{url}: {reason}", retriable=True) from None
        if len(body) > MAX_ANSWER_BYTES:
            raise RegistryError(
                f"{url}: the answer is over {MAX_ANSWER_BYTES} bytes; refused", retriable=False
            )
        try:
            answer = json.loads(body)
        except ValueError as exc:
            raise RegistryError(f"{url}: not JSON: {exc}", retriable=False) from None
        if not isinstance(answer, dict):
            raise RegistryError(f"{url}: expected a JSON object", retriable=False)
        return answer

    def _credentials(self) -> dict[str, str]:
        settings = self.settings
        headers: dict[str, str] = {}
        if settings.bearer_token is not None:
            headers["Authorization"] = f"Bearer {settings.bearer_token.reveal()}"
        elif settings.basic_auth_user is not None:
            password = settings.basic_auth_password
            pair = f"{settings.basic_auth_user}:{password.reveal() if password else ''}"
            headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        return headers


_ACCEPT = {"Accept": "application/vnd.schemaregistry.v1+json, application/json"}


def _format_query(fmt: str | None) -> str:
    return "" if fmt is None else "?" + urllib.parse.urlencode({"format": fmt})


def _ssl_context(settings: RegistrySettings) -> ssl.SSLContext | None:
    if not any(u.startswith("https:") for u in settings.urls):
        return None
    context = ssl.create_default_context(cafile=settings.ca_file)
    if settings.cert_file:
        context.load_cert_chain(settings.cert_file, settings.key_file)
    return context


def _error_detail(error: urllib.error.HTTPError) -> dict[str, Any]:
    try:
        detail = json.loads(error.read(MAX_ERROR_BYTES) or b"{}")
    except (ValueError, OSError):
        return {}
    return detail if isinstance(detail, dict) else {}


_CLIENTS: dict[RegistrySettings, RegistryClient] = {}
_CLIENTS_LOCK = threading.Lock()


def client_for(settings: RegistrySettings) -> RegistryClient:
    """One client (and so one cache) per registry per process: a task process decodes
    many batches, and each schema id is fetched once."""
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(settings)
        if client is None:
            client = _CLIENTS[settings] = RegistryClient(settings)
        return client


def subject_for(strategy: str, topic: str, record_name: str | None, *, key: bool = False) -> str:
    """The subject under which a topic's value (or key) schemas are registered."""
    suffix = "key" if key else "value"
    if strategy == "topic":
        return f"{topic}-{suffix}"
    if not record_name:
        raise ValueError(f"subject_name_strategy {strategy!r} needs a record name")
    return record_name if strategy == "record" else f"{topic}-{record_name}"
