"""ingest.engines.spark.python_worker.daemon: Spark's Python daemon with the tasks' imports done before it forks."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pytest

from ingest.engines.spark.python_worker.daemon import prefer_installed_pyspark


def installed(root: Path, version: str) -> str:
    package = root / "pyspark"
    package.mkdir(parents=True)
    (package / "version.py").write_text(f'__version__ = "{version}"\n')
    return str(root)


def zipped(path: Path, version: str) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("pyspark/version.py", f'__version__ = "{version}"\n')
    return str(path)


def test_the_zip_goes_behind_an_installed_pyspark_of_the_same_version(tmp_path: Path) -> None:
    zip_entry = zipped(tmp_path / "pyspark.zip", "4.3.0")
    site = installed(tmp_path / "site", "4.3.0")
    path = ["", zip_entry, "/py4j.zip", site]
    assert prefer_installed_pyspark(path)
    assert path == ["", "/py4j.zip", site, zip_entry]


def test_a_different_installed_version_leaves_the_path_alone(tmp_path: Path) -> None:
    zip_entry = zipped(tmp_path / "pyspark.zip", "4.3.0")
    site = installed(tmp_path / "site", "4.2.1")
    path = [zip_entry, site]
    assert not prefer_installed_pyspark(path)
    assert path == [zip_entry, site]


@pytest.mark.parametrize("case", ["no zip", "no installed pyspark", "unreadable zip"])
def test_nothing_to_prefer_leaves_the_path_alone(tmp_path: Path, case: str) -> None:
    site = installed(tmp_path / "site", "4.3.0")
    if case == "no zip":
        path = [site]
    elif case == "no installed pyspark":
        path = [zipped(tmp_path / "pyspark.zip", "4.3.0"), str(tmp_path)]
    else:
        broken = tmp_path / "pyspark.zip"
        broken.write_bytes(b"not a zip")
        path = [str(broken), site]
    before = list(path)
    assert not prefer_installed_pyspark(path)
    assert path == before


def test_spark_tasks_run_in_forks_of_our_daemon_with_the_installed_pyspark(spark: Any) -> None:
    def probe(_: Any) -> Any:
        import pyspark

        yield (
            sys.argv[0],
            pyspark.__file__,
            "ingest.engines.spark.job" in sys.modules,
            os.getpid(),
        )

    seen = spark.sparkContext.parallelize(range(2), 2).mapPartitions(probe).collect()
    for program, pyspark_file, preloaded, _pid in seen:
        assert program.endswith(os.path.join("python_worker", "daemon.py")), program
        assert ".zip" not in pyspark_file, pyspark_file
        assert preloaded
