"""The Delta ``txn`` app id of one source partition of one table, fed by one group,
and the arithmetic of txn versions.

Derivation (stable across releases; changing it would break exactly-once for
every existing table)::

    app_id = "ingest:" + topic + ":" + partition + ":"
             + sha256(json.dumps([normalize_uri(table_uri), group, topic, partition]))[:24]

The readable prefix names the partition in ``DESCRIBE HISTORY``; the digest
binds the table and the group (any string, so it cannot be spelled into the id
unambiguously). The URI is normalized (``storage.normalize_uri``: absolute
local paths, no trailing slash, ``s3a`` = ``s3``) so that spellings of one table
agree. The dead-letter table carries the same app ids (derived from the MAIN
table's URI): its txn versions say which offsets' dead letters it already holds.

A txn version is the last offset of its partition a table holds; None means no
txn yet (nothing held). One more app id, ``REWRITE_GUARD``, is no partition's:
its txn makes commits that remove files conflict with each other (``delta.py``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from ingest.sink.storage import normalize_uri

__all__ = ["REWRITE_GUARD", "advances", "app_id", "newer_txns", "or_minus_one"]

# The app id of the txn every commit that removes a snapshot's files carries (see
# ``delta.guard_transaction``); no partition's app id can be spelled so.
REWRITE_GUARD = "ingest:rewrite-guard"


def app_id(table_uri: str, group: str, topic: str, partition: int) -> str:
    identity = json.dumps([normalize_uri(table_uri), group, topic, int(partition)])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return f"ingest:{topic}:{int(partition)}:{digest}"


def or_minus_one(version: int | None) -> int:
    """The last offset a txn version covers: -1 when there is no txn."""
    return -1 if version is None else version


def advances(version: int, current: int | None) -> bool:
    """Whether txn ``version`` moves past ``current`` (None: no txn yet)."""
    return current is None or version > current


def newer_txns(txns: Mapping[str, int], current: Mapping[str, int | None]) -> dict[str, int]:
    """The txns (app id -> version) that move past ``current``: a commit never moves
    a version back."""
    return {app: version for app, version in txns.items() if advances(version, current.get(app))}
