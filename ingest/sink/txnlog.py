"""Reading the Delta log itself: when each txn was last written.

delta-rs answers a txn's version (``DeltaTable.transaction_version``) but not
when it was written, which ``ingest status`` shows per partition. ``txn_times``
walks the commit files back from the newest and, for app ids no commit names,
reads the newest checkpoint.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ingest.sink.storage import TableLocation

__all__ = ["txn_times"]

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
