"""Which free-form option names hold secrets: one list for every place that prints or
hands on options (``--print-config``, reprs of storage options, Spark settings kept off
the command line). Imports nothing from the package."""

from __future__ import annotations

__all__ = ["MASK", "masked", "secret_looking"]

MASK = "***"

# Matched against the name lower-cased, with '-' and '.' read as '_': S3 keys and session
# tokens, passwords, OAuth tokens and client secrets, Azure account keys, TLS private keys.
_HINTS = (
    "secret",
    "password",
    "passwd",
    "token",
    "credential",
    "private_key",
    "account_key",
    "accountkey",
    "client_key",
)


def secret_looking(key: str) -> bool:
    """Whether an option named ``key`` probably holds a secret. An access key id does not:
    it names the key, and an operator needs to see which one is used."""
    folded = key.lower().replace("-", "_").replace(".", "_")
    return any(hint in folded for hint in _HINTS)


def masked(options: dict[str, object]) -> dict[str, object]:
    """``options`` with every secret-looking value replaced by ``MASK``."""
    return {key: MASK if secret_looking(str(key)) else value for key, value in options.items()}
