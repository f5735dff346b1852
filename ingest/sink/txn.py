"""The Delta ``txn`` app id of one source partition of one table, fed by one group.

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
"""

from __future__ import annotations

import hashlib
import json

from ingest.sink.storage import normalize_uri

__all__ = ["app_id"]


def app_id(table_uri: str, group: str, topic: str, partition: int) -> str:
    identity = json.dumps([normalize_uri(table_uri), group, topic, int(partition)])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:24]
    return f"ingest:{topic}:{int(partition)}:{digest}"
