"""SCRAM (RFC 5802, RFC 7677) client as a sans-I/O state machine, plus PLAIN (RFC 4616).

No sockets here: a mechanism turns the server's bytes into the next bytes to
send. The I/O glue that carries them in SaslAuthenticate requests lives in
``ingest.client.connection``.

Passwords are used as UTF-8 without SASLprep, as Kafka's own clients and
brokers do (``ScramFormatter``), so non-ASCII passwords agree with Kafka's stored
credentials. Errors never include the password, the salted password or a proof.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from typing import Protocol

from ingest.client.client_config import SaslConfig, Secret
from ingest.errors import BrokerError
from ingest.protocol.error_codes import ErrorCode

__all__ = [
    "PlainMechanism",
    "SaslMechanism",
    "ScramClient",
    "mechanism_for",
    "sasl_failure",
]

_HASHES = {"SCRAM-SHA-1": "sha1", "SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
# base64("n,,"): no channel binding, no authorization identity.
_GS2_HEADER = b"n,,"


# The most iterations a SCRAM credential may have in Apache Kafka (ScramMechanism's
# maxIterations): a server asking for more is refused before any hashing.
MAX_ITERATIONS = 16384


def sasl_failure(message: str, *, context: str = "") -> BrokerError:
    """SASL_AUTHENTICATION_FAILED raised by the client side (not sent by the broker)."""
    code = ErrorCode.SASL_AUTHENTICATION_FAILED
    return BrokerError(int(code), code.name, False, context=context, message=message)


class SaslMechanism(Protocol):
    """One SASL exchange: ``start()`` gives the first message, ``step()`` each next one.

    ``step`` returns None when the client has nothing more to send; ``complete``
    is True once the exchange has succeeded from the client's point of view.
    """

    name: str

    def start(self) -> bytes: ...

    def step(self, challenge: bytes) -> bytes | None: ...

    @property
    def complete(self) -> bool: ...


class PlainMechanism:
    """PLAIN: one message ``authzid NUL authcid NUL password``; the server only accepts or not."""

    name = "PLAIN"

    def __init__(self, username: str, password: Secret, *, context: str = "") -> None:
        if "\x00" in username:
            raise ValueError("a PLAIN username cannot contain NUL")
        self._context = context
        self._username = username
        self._password = password
        self._sent = False
        self._complete = False

    def start(self) -> bytes:
        self._sent = True
        return b"\x00" + self._username.encode() + b"\x00" + self._password.reveal().encode()

    def step(self, challenge: bytes) -> bytes | None:
        if not self._sent:
            raise sasl_failure(
                "PLAIN got a challenge before its message was sent", context=self._context
            )
        self._complete = True
        return None

    @property
    def complete(self) -> bool:
        return self._complete

    def __repr__(self) -> str:
        return f"PlainMechanism(username={self._username!r})"


def _escape_name(name: str) -> str:
    # RFC 5802 5.1: "=" and "," are escaped in saslname.
    return name.replace("=", "=3D").replace(",", "=2C")


def _parse_attributes(message: bytes, what: str) -> dict[str, str] | str:
    """The attributes of a server message, or the reason it cannot be parsed."""
    try:
        text = message.decode("utf-8")
    except UnicodeDecodeError:
        return f"{what} is not UTF-8"
    attributes: dict[str, str] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or len(key) != 1:
            return f"{what} is malformed at {part[:20]!r}"
        attributes.setdefault(key, value)
    return attributes


class ScramClient:
    """The client side of one SCRAM exchange (client-first, client-final, verify).

    ``hash_name`` is a hashlib name ("sha256", "sha512"; "sha1" for the RFC 5802
    vectors). ``nonce`` is drawn from ``secrets`` unless given (tests give one).
    """

    def __init__(
        self,
        username: str,
        password: Secret,
        *,
        mechanism: str = "SCRAM-SHA-256",
        nonce: str | None = None,
        min_iterations: int = 4096,
        max_iterations: int = MAX_ITERATIONS,
        context: str = "",
    ) -> None:
        if mechanism not in _HASHES:
            raise ValueError(f"unknown SCRAM mechanism {mechanism!r}")
        self.name = mechanism
        self._hash = _HASHES[mechanism]
        self._username = username
        self._password = password
        self._nonce = nonce if nonce is not None else secrets.token_urlsafe(24)
        if not self._nonce or "," in self._nonce:
            raise ValueError("a SCRAM nonce must be non-empty printable text without ','")
        self._min_iterations = min_iterations
        self._max_iterations = max_iterations
        self._context = context
        self._state = "initial"
        self._client_first_bare = ""
        self._server_signature = b""

    # -- the exchange ---------------------------------------------------------------

    def start(self) -> bytes:
        if self._state != "initial":
            raise self._fail(f"start() called in state {self._state}")
        self._client_first_bare = f"n={_escape_name(self._username)},r={self._nonce}"
        self._state = "sent-first"
        return _GS2_HEADER + self._client_first_bare.encode()

    def step(self, challenge: bytes) -> bytes | None:
        if self._state == "sent-first":
            return self._client_final(challenge)
        if self._state == "sent-final":
            self._verify_server_final(challenge)
            return None
        raise self._fail(f"got a server message in state {self._state}")

    @property
    def complete(self) -> bool:
        return self._state == "complete"

    # -- steps ------------------------------------------------------------------------

    def _fail(self, reason: str) -> BrokerError:
        self._state = "failed"
        return sasl_failure(f"{self.name}: {reason}", context=self._context)

    def _client_final(self, server_first: bytes) -> bytes:
        attributes = _parse_attributes(server_first, "server-first-message")
        if isinstance(attributes, str):
            raise self._fail(attributes)
        if "e" in attributes:
            raise self._fail(f"the server refused our first message: {attributes['e']}")
        if "m" in attributes:
            raise self._fail("the server requires a SCRAM extension we do not support")
        nonce = attributes.get("r", "")
        if not nonce.startswith(self._nonce) or len(nonce) == len(self._nonce):
            raise self._fail("the server nonce does not extend ours")
        try:
            salt = base64.b64decode(attributes["s"], validate=True)
            iterations = int(attributes["i"])
        except (KeyError, ValueError):
            raise self._fail(
                "the server-first-message lacks a valid salt or iteration count"
            ) from None
        if iterations > self._max_iterations:
            # An untrusted server could ask for any count: 2^31-1 costs about 22 minutes
            # of CPU, and a count past a C long overflows pbkdf2_hmac.
            raise self._fail(
                f"the server asks for {iterations} iterations, above the maximum "
                f"{self._max_iterations} (Apache Kafka's own limit)"
            )
        if iterations < self._min_iterations:
            raise self._fail(
                f"the server asks for {iterations} iterations, below the minimum "
                f"{self._min_iterations}"
            )
        salted = hashlib.pbkdf2_hmac(
            self._hash, self._password.reveal().encode("utf-8"), salt, iterations
        )
        client_key = self._hmac(salted, b"Client Key")
        stored_key = hashlib.new(self._hash, client_key).digest()
        without_proof = f"c={base64.b64encode(_GS2_HEADER).decode()},r={nonce}"
        auth_message = b",".join(
            (self._client_first_bare.encode("utf-8"), server_first, without_proof.encode())
        )
        signature = self._hmac(stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
        server_key = self._hmac(salted, b"Server Key")
        self._server_signature = self._hmac(server_key, auth_message)
        self._state = "sent-final"
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def _verify_server_final(self, server_final: bytes) -> None:
        attributes = _parse_attributes(server_final, "server-final-message")
        if isinstance(attributes, str):
            raise self._fail(attributes)
        if "e" in attributes:
            raise self._fail(f"the server rejected our proof: {attributes['e']}")
        try:
            verifier = base64.b64decode(attributes["v"], validate=True)
        except (KeyError, ValueError):
            raise self._fail("the server-final-message has no valid verifier") from None
        if not hmac.compare_digest(verifier, self._server_signature):
            raise self._fail("the server signature does not match: the server does not know us")
        self._state = "complete"

    def _hmac(self, key: bytes, message: bytes) -> bytes:
        return hmac.new(key, message, self._hash).digest()

    def __repr__(self) -> str:
        return f"ScramClient({self.name}, username={self._username!r}, state={self._state})"


def mechanism_for(config: SaslConfig, *, context: str = "") -> SaslMechanism:
    """A fresh mechanism for one authentication with ``config``; errors carry ``context``."""
    if config.mechanism == "PLAIN":
        return PlainMechanism(config.username, config.password, context=context)
    return ScramClient(
        config.username,
        config.password,
        mechanism=config.mechanism,
        min_iterations=config.scram_min_iterations,
        context=context,
    )
