"""Spark's Python daemon, with the tasks' imports done once, before it forks workers.

Spark runs ``python -m <spark.python.daemon.module>``, and the daemon forks a worker
per task slot. pyspark's own daemon leaves every import to the forked workers, and a
pip-installed pyspark puts ``pyspark.zip`` first on their path; the zip holds no
compiled bytecode, so every worker compiled pyspark from source and then imported
pyarrow, pandas and our decoder (about 1 CPU s per worker, profiled with py-spy).

This daemon puts the zip behind the installed pyspark when both are the same
version, imports what a task needs, then runs pyspark's manager, so each fork starts
with everything loaded. The threads those imports start (OpenBLAS, jemalloc's
background thread) are fork-safe: both libraries reset themselves in the child.
"""

from __future__ import annotations

import os
import sys
import zipfile

VERSION_FILE = os.path.join("pyspark", "version.py")


def prefer_installed_pyspark(path: list[str]) -> bool:
    """Moves ``pyspark.zip`` entries of ``path`` to its end when an installed pyspark
    of the same version is on it. True when it did."""
    zips = [entry for entry in path if entry.endswith("pyspark.zip")]
    installed = next(
        (
            os.path.join(entry, VERSION_FILE)
            for entry in path
            if entry and entry not in zips and os.path.isfile(os.path.join(entry, VERSION_FILE))
        ),
        None,
    )
    if not zips or installed is None:
        return False
    try:
        with zipfile.ZipFile(zips[0]) as archive:
            zipped = archive.read("pyspark/version.py")
        with open(installed, "rb") as file:
            same = file.read() == zipped
    except (OSError, KeyError, zipfile.BadZipFile):
        return False
    if not same:
        return False
    for entry in zips:
        path.remove(entry)
        path.append(entry)
    return True


def preload() -> None:
    """What every files task imports (ingest.engines.spark.python_worker.segment_source.files_task and below)."""
    import numpy  # noqa: F401
    import orjson  # noqa: F401
    import pyarrow
    import pyarrow.compute
    import pyarrow.json
    import pyarrow.parquet  # noqa: F401
    import pyspark.worker  # noqa: F401

    import ingest.engines.spark.job
    import ingest.engines.spark.python_worker.segment_source  # noqa: F401


def main() -> None:
    prefer_installed_pyspark(sys.path)
    preload()
    from pyspark.daemon import manager

    manager()


if __name__ == "__main__":
    main()
