"""Pieces of the cluster tests: the run's config, and when each segment left the handoff
against when the Delta commit that holds it was written."""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pyarrow import fs as pafs

from tests.runtime.support import Cli, write_config

SEGMENT_SUFFIX = ".arrows"
# The session's topic (conftest.py), and how long one run may take.
PARTITIONS = 4
PER_PARTITION = 50_000
RUN_TIMEOUT = 240


def cluster_config(
    path: Path,
    *,
    bootstrap: str,
    topic: str,
    group: str,
    table: str,
    master: str,
    handoff_root: str,
    sections: Mapping[str, Mapping[str, Any]] | None = None,
) -> Path:
    """The runtime tests' config with ``spark.master`` a cluster's and the handoff in
    files mode under ``handoff_root``; small segments and batches, so a run has several."""
    values: dict[str, dict[str, Any]] = {
        "spark": {"master": master},
        "handoff": {"mode": "files", "root": handoff_root, "segment_max_bytes": "1MiB"},
        "trigger": {"max_bytes": "6MiB"},
    }
    for section, entries in (sections or {}).items():
        values.setdefault(section, {}).update(entries)
    # The table's URI as given: a Path would fold s3:// into s3:/.
    values.setdefault("table", {})["uri"] = table
    return write_config(
        path, bootstrap=bootstrap, topic=topic, group=group, table=path, sections=values
    )


def _segment_key(path: str) -> tuple[int, int] | None:
    """(partition, first offset) of a segment path ``.../<partition>/<first>-<token>.arrows``."""
    directory, _, name = path.rpartition("/")
    if not name.endswith(SEGMENT_SUFFIX) or name.startswith("."):
        return None
    return int(directory.rpartition("/")[2]), int(name.split("-", 1)[0])


def local_segments(root: Path) -> Callable[[], set[tuple[int, int]]]:
    def scan() -> set[tuple[int, int]]:
        found = set()
        for directory, _, files in os.walk(root):
            for name in files:
                key = _segment_key(f"{directory}/{name}")
                if key is not None:
                    found.add(key)
        return found

    return scan


def s3_segments(filesystem: pafs.FileSystem, path: str) -> Callable[[], set[tuple[int, int]]]:
    def scan() -> set[tuple[int, int]]:
        selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
        keys = (_segment_key(info.path) for info in filesystem.get_file_info(selector))
        return {key for key in keys if key is not None}

    return scan


class SegmentWatch:
    """Lists a handoff on a thread (``scan``): for each segment (``<topic>/<partition>/
    <first offset>-<token>.arrows`` under the run's namespace), when it was first seen and
    first seen gone (wall clock)."""

    def __init__(self, scan: Callable[[], set[tuple[int, int]]], interval: float = 0.01) -> None:
        self.scan = scan
        self.interval = interval
        self.seen: dict[tuple[int, int], float] = {}  # (partition, first offset) -> time
        self.gone: dict[tuple[int, int], float] = {}
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="segment-watch", daemon=True)

    def __enter__(self) -> SegmentWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self._poll()  # the state after the run

    def _poll(self) -> None:
        now = time.time()
        try:
            present = self.scan()
        except OSError as exc:
            self.errors.append(str(exc))
            return
        for key in present:
            self.seen.setdefault(key, now)
        for key in self.seen.keys() - present:
            self.gone.setdefault(key, now)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._poll()
            self._stop.wait(self.interval)

    def ranges(self, ends: Mapping[int, int]) -> dict[tuple[int, int], int]:
        """Each seen segment's next offset: the next segment's first, or the partition's
        end for the last (segments tile a partition's offsets)."""
        out: dict[tuple[int, int], int] = {}
        for partition in {p for p, _ in self.seen}:
            firsts = sorted(f for p, f in self.seen if p == partition)
            for first, following in zip(firsts, [*firsts[1:], ends[partition]], strict=True):
                out[(partition, first)] = following
        return out


def txn_commit_times(table: Path) -> list[tuple[float, dict[int, int]]]:
    """Each Delta commit of a local table, in version order: its file's mtime and its txn
    actions as partition -> version (app ids are ``ingest:<topic>:<partition>:<digest>``)."""
    commits: list[tuple[float, dict[int, int]]] = []
    for entry in sorted((table / "_delta_log").glob("*.json")):
        txns: dict[int, int] = {}
        for line in entry.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                partition = int(action["txn"]["appId"].rsplit(":", 2)[1])
                txns[partition] = int(action["txn"]["version"])
        commits.append((entry.stat().st_mtime, txns))
    return commits


def released_before_durable(watch: SegmentWatch, table: Path, ends: Mapping[int, int]) -> list[str]:
    """Segments seen gone before the first Delta commit whose txn covers their last
    offset was written (or never covered at all): each one a line."""
    commits = txn_commit_times(table)
    problems: list[str] = []
    for (partition, first), following in sorted(watch.ranges(ends).items()):
        gone = watch.gone.get((partition, first))
        if gone is None:
            problems.append(f"segment {partition}/{first} was never released")
            continue
        durable = next((t for t, txns in commits if txns.get(partition, -1) >= following - 1), None)
        if durable is None:
            problems.append(f"segment {partition}/{first}..{following} is in no commit's txn")
        elif gone < durable:
            problems.append(
                f"segment {partition}/{first}..{following} gone {durable - gone:.3f}s before "
                "the commit holding it"
            )
    return problems


def run_until_end(path: Path, log: Path) -> tuple[float, str]:
    """``ingest run --until-end`` as a user runs it; seconds and its log."""
    began = time.monotonic()
    cli = Cli(["run", "-c", str(path), "--until-end"], log)
    try:
        code = cli.wait(RUN_TIMEOUT)
    finally:
        cli.kill()
    took = time.monotonic() - began
    text = cli.text()
    assert code == 0, text[-6000:]
    return took, text
