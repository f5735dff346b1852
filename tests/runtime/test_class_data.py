"""The Spark JVM's class-data-sharing archive: recorded by a first run, mapped by later ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ingest.config import SparkSection
from ingest.engines.spark.spark_session import (
    LIGHT_JIT,
    STALE_RECORDING_SECONDS,
    UNUSED_ARCHIVE_DAYS,
    ClassDataArchive,
)

ROOT = Path(__file__).resolve().parents[2]


def test_off_or_unquotable_means_no_archive(tmp_path: Path) -> None:
    assert ClassDataArchive.for_section(SparkSection(class_data_sharing=False), tmp_path) is None
    assert ClassDataArchive.for_section(SparkSection(), tmp_path / "a b") is None
    assert ClassDataArchive.for_section(SparkSection(), tmp_path) is not None


def test_the_archive_name_changes_with_the_session_conf(tmp_path: Path) -> None:
    plain = ClassDataArchive.for_section(SparkSection(), tmp_path)
    again = ClassDataArchive.for_section(SparkSection(master="local[1]"), tmp_path)
    jars = ClassDataArchive.for_section(SparkSection(conf={"spark.jars": "/x.jar"}), tmp_path)
    assert plain is not None and again is not None and jars is not None
    assert plain.path == again.path  # the master does not change the classes
    assert plain.path != jars.path


def test_records_when_missing_and_maps_when_present(tmp_path: Path) -> None:
    archive = ClassDataArchive(tmp_path / "jvm" / "spark-x.jsa")
    option = archive.java_options()
    assert archive.recording == tmp_path / "jvm" / f"spark-x.jsa.{os.getpid()}.tmp"
    assert option == f"-XX:ArchiveClassesAtExit={archive.recording}"
    archive.path.write_bytes(b"archive")
    assert ClassDataArchive(archive.path).java_options() == f"-XX:SharedArchiveFile={archive.path}"


def test_leftovers_of_dead_runs_are_removed_and_live_ones_kept(tmp_path: Path) -> None:
    path = tmp_path / "spark-x.jsa"
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        text=True,
        capture_output=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    old = time.time() - STALE_RECORDING_SECONDS - 60
    stale = tmp_path / f"spark-x.jsa.{dead_pid}.tmp"
    recent = tmp_path / f"spark-x.jsa.{dead_pid + 1}.tmp"
    live = tmp_path / f"spark-x.jsa.{os.getpid()}.tmp"
    for leftover in (stale, recent, live):
        leftover.write_bytes(b"partial")
    for leftover in (stale, live):
        os.utime(leftover, (old, old))
    ClassDataArchive(path).java_options()
    assert not stale.exists()
    assert recent.exists() and live.exists()


def test_archives_unused_for_a_month_go_when_another_is_recorded(tmp_path: Path) -> None:
    month_ago = time.time() - (UNUSED_ARCHIVE_DAYS + 1) * 86400
    unused, recent = tmp_path / "spark-unused.jsa", tmp_path / "spark-recent.jsa"
    for archive in (unused, recent):
        archive.write_bytes(b"archive")
    os.utime(unused, (month_ago, month_ago))
    # Mapping an archive marks it used.
    in_use = ClassDataArchive(recent)
    os.utime(recent, (month_ago, month_ago))
    assert in_use.java_options() == f"-XX:SharedArchiveFile={recent}"
    assert recent.stat().st_mtime > month_ago + 86400
    # Recording a new one prunes the unused.
    assert (
        ClassDataArchive(tmp_path / "spark-new.jsa")
        .java_options()
        .startswith("-XX:ArchiveClassesAtExit=")
    )
    assert not unused.exists() and recent.exists()


PROBE = """
import json, sys
from pyspark import SparkContext
from ingest.config import SparkSection
from ingest.engines.spark.spark_session import SparkEngine

provider = SparkEngine(SparkSection(master="local[1]", class_data_sharing=sys.argv[1] == "on"))
session = provider.get()
jvm = SparkContext._gateway.proc.pid
with open(f"/proc/{jvm}/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if line.rstrip().endswith(".jsa")})
bean = session._jvm.java.lang.management.ManagementFactory.getRuntimeMXBean()
arguments = [str(a) for a in bean.getInputArguments()]
provider.stop()
print(json.dumps({"arguments": arguments, "mapped": mapped}))
"""


def probe(cache: Path, sharing: str) -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, sharing],
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.timeout(600)
def test_a_first_session_records_the_archive_and_the_next_one_maps_it(tmp_path: Path) -> None:
    directory = tmp_path / "ingest" / "jvm"
    first = probe(tmp_path, "on")
    recording = [a for a in first["arguments"] if a.startswith("-XX:ArchiveClassesAtExit=")]
    assert len(recording) == 1, first["arguments"]
    assert LIGHT_JIT in first["arguments"]  # no transform: rows never enter the JVM
    archives = list(directory.glob("*.jsa"))
    assert len(archives) == 1 and archives[0].stat().st_size > 1 << 20
    assert not list(directory.glob("*.tmp"))  # renamed once the JVM had exited

    second = probe(tmp_path, "on")
    assert f"-XX:SharedArchiveFile={archives[0]}" in second["arguments"]
    assert str(archives[0]) in second["mapped"]  # the JVM really uses it
    # Off: no archive (test_off_or_unquotable_means_no_archive; a third JVM here cost 20 s).


JOINER = """
import sys
from pyspark import SparkContext
from ingest.config import SparkSection
from ingest.engines.spark.spark_session import SparkEngine
from ingest.testing.spark import local_spark_session

first = local_spark_session(master="local[1]")  # a session this process already runs
jvm = SparkContext._gateway.proc
engine = SparkEngine(SparkSection(master="local[1]", class_data_sharing=True))
assert engine.get().sparkContext is first.sparkContext
engine.stop()
print("after-stop", jvm.poll(), first.range(3).count(), flush=True)
first.stop()
# No session runs now, though its JVM does: an engine's new session there is its own.
later = SparkEngine(SparkSection(master="local[1]", class_data_sharing=True))
assert later.get().range(2).count() == 2
later.stop()
print("later-stopped", SparkContext._active_spark_context is None, jvm.poll(), flush=True)
"""


@pytest.mark.timeout(300)
def test_an_engine_that_joins_a_running_session_leaves_it_to_its_starter(tmp_path: Path) -> None:
    """An engine started in a process that already runs a session (a test's shared one, an
    embedding program's) batches on it, and its stop neither stops that session nor makes
    its JVM exit to record a class-data archive (an engine did both: the suite's shared
    session was dead from then on). Once that session is stopped, a later engine's session
    (on the same JVM) is its own, and its stop stops it."""
    done = subprocess.run(
        [sys.executable, "-c", JOINER],
        cwd=ROOT,
        env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)},  # no archive yet: one to record
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "after-stop None 3" in done.stdout.splitlines(), done.stdout
    assert "later-stopped True None" in done.stdout.splitlines(), done.stdout
    assert not list(tmp_path.glob("ingest/jvm/*"))  # nothing recorded, nothing begun
