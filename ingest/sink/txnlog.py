"""Reading the Delta log itself: when each txn was last written, and each table's last
snapshot kept for the next batch (``Snapshots``).

delta-rs answers a txn's version (``DeltaTable.transaction_version``) but not
when it was written, which ``ingest status`` shows per partition. ``txn_times``
walks the commit files back from the newest and, for app ids no commit names,
reads the newest checkpoint.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence

import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from ingest.sink.storage import TableLocation

__all__ = ["SNAPSHOTS", "Snapshots", "txn_times"]

# How far back ``txn_times`` reads commit files before it gives up on an app id
# (checkpoints, written every 100 commits by default, cut the walk short).
_TXN_WALK_LIMIT = 500


def txn_times(location: TableLocation, app_ids: Sequence[str]) -> dict[str, int | None]:
    """When each app id's txn version was last written (ms since the epoch), read
    from the Delta log: its ``lastUpdated``, else the timestamp of the commit that
    holds it. None: no such txn (or older than the walk reaches)."""
    found: dict[str, int | None] = dict.fromkeys(app_ids)
    wanted = set(app_ids)
    filesystem, root = location.filesystem()
    log_dir = f"{root.rstrip('/')}/_delta_log"
    try:
        listing = filesystem.get_file_info(pafs.FileSelector(log_dir))
    except (FileNotFoundError, OSError):
        return found
    commits = sorted(
        (int(info.base_name[:20]), info.path)
        for info in listing
        if info.base_name.endswith(".json") and info.base_name[:20].isdigit()
    )
    checkpoints = sorted(
        (int(info.base_name[:20]), info.path)
        for info in listing
        if ".checkpoint" in info.base_name and info.base_name.endswith(".parquet")
    )
    newest_checkpoint = checkpoints[-1][0] if checkpoints else -1
    for version, path in reversed(commits[-_TXN_WALK_LIMIT:]):
        if not wanted or version <= newest_checkpoint:
            break
        with filesystem.open_input_stream(path) as stream:
            lines = stream.read().decode().splitlines()
        stamp: int | None = None
        seen: dict[str, int | None] = {}
        for line in lines:
            if '"commitInfo"' in line:
                stamp = json.loads(line)["commitInfo"].get("timestamp")
            elif '"txn"' in line:
                txn = json.loads(line)["txn"]
                if txn.get("appId") in wanted:
                    seen[txn["appId"]] = txn.get("lastUpdated")
        for app, updated in seen.items():
            found[app] = updated if updated is not None else stamp
            wanted.discard(app)
    if wanted and checkpoints:
        parts = [p for v, p in checkpoints if v == newest_checkpoint]
        for part in parts:
            with filesystem.open_input_file(part) as handle:
                column = pq.read_table(handle, columns=["txn"]).column("txn")
            for txn in column.to_pylist():
                if txn and txn.get("appId") in wanted:
                    found[txn["appId"]] = txn.get("lastUpdated")
    return found


class Snapshots:
    """The last snapshot of each table this process landed a batch in, lent to one
    ``DeltaTarget`` at a time (a ``DeltaTable`` is not shared between threads), so that
    the next batch's load reads the commits made since instead of the table's last
    checkpoint and every commit after it (which grows with the table's history: a
    checkpoint keeps a week of removed files).

    A snapshot is lent back only if the commit file of its version is still the one it
    read (same size): a table deleted and created again at its URI is loaded afresh.
    At most ``MAX_IDLE`` are kept (a run over many tables loads the others afresh)."""

    MAX_IDLE = 16

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[str, tuple[tuple[str, str], ...]], tuple[DeltaTable, int]] = {}

    @staticmethod
    def _key(location: TableLocation) -> tuple[str, tuple[tuple[str, str], ...]]:
        return location.uri, tuple(sorted(location.storage_options.items()))

    def take(self, location: TableLocation) -> DeltaTable | None:
        with self._lock:
            kept = self._idle.pop(self._key(location), None)
        if kept is None:
            return None
        table, size = kept
        return table if _commit_file_size(location, table.version()) == size else None

    def give(self, location: TableLocation, table: DeltaTable) -> None:
        size = _commit_file_size(location, table.version())
        if size is None:
            return
        with self._lock:
            self._idle[self._key(location)] = (table, size)
            while len(self._idle) > self.MAX_IDLE:  # the longest idle goes
                del self._idle[next(iter(self._idle))]


def _commit_file_size(location: TableLocation, version: int) -> int | None:
    return location.sizes([f"_delta_log/{version:020d}.json"]).get(
        f"_delta_log/{version:020d}.json"
    )


SNAPSHOTS = Snapshots()
