"""The supervisor's Spark session, started in the background on first need.

A local session takes 7-10 s to start (the JVM); the supervisor starts it on a
thread as soon as it knows a batch will come, so the start overlaps joining
the group and fetching, then runs an empty job through the segment source so
the first batch finds the Python workers up. A run with nothing to land never
starts a JVM.

Class-data sharing (``[spark] class_data_sharing``, on by default): the JVM's
start is mostly loading and verifying Spark's classes. The first run records
them (``-XX:ArchiveClassesAtExit``) into a temporary file that becomes the
archive only once its JVM has exited cleanly at the end of the run; later runs
map the archive (``-XX:SharedArchiveFile``) and start in about half the time
(measured: 2.8 s instead of 4.9 s idle). The archive's name hashes what makes it
valid (pyspark's version, the java binary, the session's conf); the JVM checks
it again and ignores an archive that does not match.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from deltalake import DeltaTable, Schema

from ingest.config import IngestConfig, SparkSection
from ingest.engines.spark.catalog import CatalogTables, resolve
from ingest.engines.spark.delta_commit import DeltaSparkCommitter
from ingest.engines.spark.executorwatch import ExecutorWatch
from ingest.engines.spark.jvmlog import JvmOutputRelay
from ingest.engines.spark.optimize import SparkTableMaintenance
from ingest.errors import SinkError, SparkClusterLost, SparkStartError
from ingest.processes import pid_alive, start_thread
from ingest.redaction import secret_looking
from ingest.sink.batch import Batch, BatchResult
from ingest.sink.deadletter import DEAD_LETTER_SCHEMA
from ingest.sink.delta import CREATED_TABLE_PROPERTIES
from ingest.sink.metadata.evolution import nullable_schema
from ingest.spark_env import session_settings

__all__ = ["ClassDataArchive", "SparkEngine", "drain_jvm_output", "start_session"]

log = logging.getLogger("ingest.supervisor.spark")


# How long a recording JVM gets to write its archive and exit.
ARCHIVE_DUMP_TIMEOUT = 120.0
# A temporary archive older than this whose run is gone was left by a killed run.
STALE_RECORDING_SECONDS = 600.0
# An archive no run has mapped for this long is removed when another is recorded.
UNUSED_ARCHIVE_DAYS = 30
# How long an exit waits for the JVM's last lines to reach the log.
JVM_OUTPUT_WAIT = 1.0


class ClassDataArchive:
    """The driver JVM's class-data-sharing archive: used when present, else recorded."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.recording: Path | None = None

    @classmethod
    def for_section(
        cls, section: SparkSection, root: Path | None = None, classpath: str = ""
    ) -> ClassDataArchive | None:
        """The archive for ``section``'s sessions, None when off or not applicable."""
        if not section.class_data_sharing:
            return None
        directory = root if root is not None else _cache_root() / "jvm"
        if any(c.isspace() or c in "\"'" for c in str(directory)):
            return None  # extraJavaOptions is split on whitespace
        return cls(directory / f"spark-{_archive_key(section, classpath)}.jsa")

    def java_options(self) -> str:
        """The option for the next JVM: map the archive, or record one."""
        if self.path.is_file():
            with contextlib.suppress(OSError):
                os.utime(self.path)  # in use: not pruned
            return f"-XX:SharedArchiveFile={self.path}"
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.debug("no class-data archive: %s", exc)
            return ""
        self._remove_stale_recordings()
        self._remove_unused_archives()
        self.recording = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        return f"-XX:ArchiveClassesAtExit={self.recording}"

    def finish(self) -> None:
        """After the session's stop: a recording JVM is made to exit now (it exits when
        its stdin closes), and its archive, complete once it has exited, is kept."""
        if self.recording is None:
            return
        recording, self.recording = self.recording, None
        from pyspark import SparkContext

        process = getattr(SparkContext._gateway, "proc", None)
        if process is None or process.stdin is None:
            return
        began = time.monotonic()
        with contextlib.suppress(OSError):
            process.stdin.close()
        try:
            code = process.wait(ARCHIVE_DUMP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            code = None
        # The gateway is gone: a later session in this process must start a new one.
        SparkContext._gateway = None
        SparkContext._jvm = None
        if _relay is not None:
            _relay.join(JVM_OUTPUT_WAIT)
        if code == 0 and recording.is_file() and recording.stat().st_size > 0:
            os.replace(recording, self.path)
            log.info(
                "class-data archive %s recorded (%.0f MB, JVM exit %.1fs); later runs start faster",
                self.path,
                self.path.stat().st_size / 1e6,
                time.monotonic() - began,
            )
        else:
            with contextlib.suppress(OSError):
                recording.unlink()

    def _remove_unused_archives(self) -> None:
        """Archives of other venvs, pyspark versions or confs that no run mapped for
        UNUSED_ARCHIVE_DAYS (~120 MB each; a new venv path means a new archive)."""
        too_old = time.time() - UNUSED_ARCHIVE_DAYS * 86400
        for other in self.path.parent.glob("spark-*.jsa"):
            with contextlib.suppress(OSError):
                if other != self.path and other.stat().st_mtime < too_old:
                    other.unlink()
                    log.info(
                        "removed class-data archive %s, unused for %d days",
                        other,
                        UNUSED_ARCHIVE_DAYS,
                    )

    def _remove_stale_recordings(self) -> None:
        now = time.time()
        for leftover in self.path.parent.glob(f"{self.path.name}.*.tmp"):
            pid = leftover.suffixes[-2].lstrip(".") if len(leftover.suffixes) >= 2 else ""
            with contextlib.suppress(OSError, ValueError):
                if pid_alive(int(pid)) or now - leftover.stat().st_mtime < STALE_RECORDING_SECONDS:
                    continue
                leftover.unlink()


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ingest"


def _archive_key(section: SparkSection, classpath: str = "") -> str:
    """What an archive's validity depends on: pyspark's jars, the JVM, the class path."""
    import pyspark

    java_home = os.environ.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java") or ""
    parts = [pyspark.__version__, os.path.dirname(pyspark.__file__), sys.version]
    with contextlib.suppress(OSError):
        real = os.path.realpath(java)
        info = os.stat(real)
        parts += [real, str(info.st_size), str(int(info.st_mtime))]
    parts += [f"{k}={v}" for k, v in sorted(section.conf.items())]
    parts.append(classpath)
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


# C1 only: the JIT's C2 compiler cost more CPU (4 of 7.6 s) in a 5M-record run than it
# could win back, when the rows never pass through the JVM (no transform).
LIGHT_JIT = "-XX:TieredStopAtLevel=1"


def start_session(
    section: SparkSection,
    *,
    archive: ClassDataArchive | None = None,
    light_jit: bool = False,
    environment: dict[str, str] | None = None,
) -> tuple[Any, bool]:
    """This process's session with ingest's settings and ``[spark]``, and whether this call
    started it (else it joined the session already running in the process, which stays its
    starter's to stop). A JVM launched here maps or records ``archive``'s class data;
    ``light_jit``
    (for sessions whose rows never enter the JVM) compiles with C1 only; ``environment``:
    Delta's and S3A's settings (``ingest.spark_env.session_settings``). The user's
    ``spark.driver.extraJavaOptions`` come after ours, so they win; their extra class path
    entries are added after ours."""
    # Python workers must run this interpreter (pyarrow and ingest are installed here).
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    settings: dict[str, str] = {
        "spark.master": section.master,
        "spark.app.name": section.app_name,
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.session.timeZone": "UTC",
        # Spark 4 writes INT96 timestamps by default; Delta readers want micros.
        "spark.sql.parquet.outputTimestampType": "TIMESTAMP_MICROS",
        # Imports done once before the daemon forks its workers (see ingest/engines/spark/python_worker/daemon.py).
        "spark.python.daemon.module": "ingest.engines.spark.python_worker.daemon",
        # Delta Spark rebuilds a table's snapshot for each statement (a commit through
        # Delta Spark, CREATE TABLE, MERGE) in a job of this many tasks, 50 by default:
        # 12-28 s per commit on 2 cores, 1-3 s with one (measured). [spark] conf may raise it.
        "spark.databricks.delta.snapshotPartitions": "1",
    }
    settings.update(environment or {})
    conf = dict(section.conf)
    for key in ("spark.driver.extraClassPath", "spark.executor.extraClassPath"):
        if conf.get(key) and settings.get(key):
            conf[key] = f"{settings[key]}:{conf[key]}"
    with SparkContext._lock:  # as the builder's own check-then-start
        # A stopped session's JVM may still run (a new context starts on it) or have exited.
        gateway = getattr(SparkContext._gateway, "proc", None)
        if SparkContext._active_spark_context is None and gateway and gateway.poll() is not None:
            SparkContext._gateway = SparkContext._jvm = None
        start = SparkContext._active_spark_context is None
        launch = start and SparkContext._gateway is None
        if launch:  # the JVM's options count only for a JVM launched here
            ours = [archive.java_options() if archive else "", LIGHT_JIT if light_jit else ""]
            user = conf.get("spark.driver.extraJavaOptions", "")
            options = " ".join(option for option in [*ours, user] if option)
            if options:
                conf["spark.driver.extraJavaOptions"] = options
        settings.update(conf)
        # Credentials never go on the JVM's command line (pyspark launches it with every
        # setting as --conf k=v, which any local user reads in /proc): handed over later.
        secrets = {k: v for k, v in settings.items() if secret_setting(k)}
        settings = {k: v for k, v in settings.items() if k not in secrets}
        if launch:  # its output relayed into the log (jvmlog.py); the builder finds it
            spark_conf = SparkConf().setAll(list(settings.items()))
            SparkContext(conf=spark_conf, gateway=_launch_relayed(spark_conf))
    builder_map: dict[str, bool | float | int | str | None] = dict(settings)
    session = SparkSession.builder.config(map=builder_map).getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    hand_over(session, secrets)
    return session, start


def secret_setting(key: str) -> bool:
    """A Spark setting that holds a credential (S3A's keys and token, or any setting whose
    name says secret, password or token)."""
    return secret_looking(key) or key.endswith((".access.key", ".secret.key", ".session.token"))


def hand_over(session: Any, secrets: dict[str, str]) -> None:
    """Gives a running session the credential settings: ``spark.hadoop.*`` ones to its
    Hadoop configuration (which the file systems, and the tasks' copies of it, are made
    from) and every one to the session's runtime conf."""
    hadoop = session.sparkContext._jsc.hadoopConfiguration()
    for key, value in secrets.items():
        if key.startswith("spark.hadoop."):
            hadoop.set(key.removeprefix("spark.hadoop."), value)
        session.conf.set(key, value)


# The relay of this process's JVM (one JVM per process at a time).
_relay: JvmOutputRelay | None = None


def _launch_relayed(conf: Any) -> Any:
    """The py4j gateway to a new JVM whose stdout and stderr go to the log."""
    global _relay
    from pyspark.java_gateway import launch_gateway

    relay = _relay = JvmOutputRelay()
    try:
        popen = {"stdout": relay.write_fd, "stderr": subprocess.STDOUT}
        return launch_gateway(conf, popen_kwargs=popen)  # type: ignore[no-untyped-call]
    except Exception as exc:
        relay.launched()
        relay.join(JVM_OUTPUT_WAIT)  # the JVM has exited: its last words, logged and kept
        said = "\n".join(relay.recent) or "(nothing)"
        raise SinkError(
            f"the Spark JVM did not start: {exc}; its output ended with:\n{said}"
        ) from exc
    finally:
        relay.launched()


def drain_jvm_output(timeout: float = JVM_OUTPUT_WAIT) -> None:
    """Waits until what this process's JVM wrote so far is logged: before an exit that
    skips the interpreter's shutdown."""
    if _relay is not None:
        _relay.drain(timeout)


class SparkEngine:
    """Batches through the Spark job, on one session: given (tests) or started on a
    background thread (``warm``)."""

    def __init__(
        self,
        section: SparkSection,
        session: Any | None = None,
        *,
        transform: bool = False,
        storage_options: dict[str, str] | None = None,
    ) -> None:
        self.section = section
        self.storage_options = dict(storage_options or {})
        self.transform = transform  # batches will go through Spark SQL (the data source)
        self._session = session
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._owned = session is None
        self.started_in: float | None = None
        self._archive: ClassDataArchive | None = None
        self._committer: DeltaSparkCommitter | None = None  # for tables delta-rs cannot write
        self._checked: set[tuple[str | None, str]] = set()  # tables by name checked in the catalog
        # Set by the CLI, whose process ends after the run: the JVM stops itself when its
        # stdin closes (running SparkContext's shutdown hook), so ``stop`` need not wait
        # for the Python-side stop (~1 s, measured).
        self.leave_jvm_at_exit = False
        self._maintenance: SparkTableMaintenance | None = None

    @property
    def started(self) -> bool:
        return self._session is not None or self._thread is not None

    def land(self, batch: Batch) -> BatchResult:
        """Lands ``batch`` through the Spark job."""
        session = self.get()
        if self._committer is None:
            self._committer = DeltaSparkCommitter(session)
        table = batch.table
        names = {(table.name, table.uri), (table.dead_letter_name, table.dead_letters)}
        try:
            self._check_names(session, batch)
            return self._run(session, dataclasses.replace(batch, committer=self._committer))
        except BaseException:
            self._checked -= names  # its retry checks the catalog again before it writes
            raise

    def _run(self, session: Any, batch: Batch) -> BatchResult:
        from ingest.engines.spark.job import run_batch

        if not self.section.master.startswith("spark://"):
            return run_batch(session, batch)
        with ExecutorWatch(session, float(self.section.executorless_timeout)) as watch:
            try:
                return run_batch(session, batch)
            except Exception as exc:
                if watch.fired is not None:
                    raise SparkClusterLost(
                        f"batch had no Spark executor for {watch.fired:.0f}s on "
                        f"{self.section.master} and was cancelled: the application lost its "
                        "cluster (a master restarted without recovery forgets it); nothing "
                        "of the batch was committed; rerun to land it"
                    ) from exc
                raise

    def resolve(self, config: IngestConfig) -> IngestConfig:
        """``config`` with its tables by name (``table.name``, a route's ``name``) placed by
        the catalog (``catalog.resolve``): the session starts now, its catalog is needed
        first."""
        if not config.names_tables():
            return config
        return resolve(config, self.get())

    def _check_names(self, session: Any, batch: Batch) -> None:
        """At a named table's first batch of this run: the catalog still points its name
        at the table's location, and registers a table found there unregistered; a table
        that is nowhere yet is created now, before the batch writes into its location
        (Delta Spark creates a managed table only in an empty one), with the columns the
        batch will land, as is its dead-letter table."""
        from ingest.engines.spark.job import table_schema

        table = batch.table
        pairs = [
            (table.name, table.uri, table.storage_options, table.properties, table.partition_by),
            (table.dead_letter_name, table.dead_letters, table.dead_letter_options, {}, ()),
        ]
        catalog = CatalogTables(session)
        for name, uri, options, properties, partition_by in pairs:
            if name is None or (name, uri) in self._checked:
                continue
            exists = DeltaTable.is_deltatable(uri, storage_options=dict(options) or None)
            if not catalog.check(name, uri, exists=exists):
                dead = name == table.dead_letter_name
                schema = DEAD_LETTER_SCHEMA if dead else table_schema(session, table)
                catalog.create(
                    name,
                    uri,
                    Schema.from_arrow(nullable_schema(schema)).to_json(),
                    partition_by,
                    {**CREATED_TABLE_PROPERTIES, **properties},
                )
            self._checked.add((name, uri))

    def warm(self) -> None:
        """Starts the session in the background (once)."""
        if self._session is not None or self._thread is not None:
            return
        self._thread = start_thread("spark-start", self._start)

    def _start(self) -> None:
        began = time.monotonic()
        try:
            environment = session_settings(self.storage_options)
            if self._owned:
                classpath = environment["spark.driver.extraClassPath"]
                self._archive = ClassDataArchive.for_section(self.section, classpath=classpath)
            session, started = start_session(
                self.section,
                archive=self._archive,
                light_jit=not self.transform,
                environment=environment,
            )
            if self._owned and not started:
                # A session already ran in this process (a test's, an embedding
                # program's): batches use it, and its starter stops it, not this engine.
                log.info("spark: joined the session already running in this process")
                self._owned = False
            self.started_in = time.monotonic() - began
            log.info("spark session %s started in %.1fs", self.section.master, self.started_in)
            if self._owned:
                self._warm_up(session, self.transform)
            self._session = session
        except BaseException as exc:
            self._error = exc

    @staticmethod
    def _warm_up(session: Any, transform: bool) -> None:
        """An empty job the way batches run (ingest.engines.spark.job.warm_up): the first batch no
        longer pays for the Python workers' start and imports."""
        from ingest.engines.spark.job import warm_up

        try:
            log.info("spark warm-up job took %.1fs", warm_up(session, transform=transform))
        except Exception as exc:  # the first batch will meet the cause, with its context
            log.warning("spark warm-up job failed: %s", exc)

    @property
    def starting(self) -> bool:
        """The session (and its warm-up) is on its way up and has not failed."""
        # The thread sets the session, or the error, as its last step.
        return self._thread is not None and self._thread.is_alive()

    def jvm_exit_code(self) -> int | None:
        """The exit code of the Spark JVM this process launched, if it has exited."""
        process = getattr(
            getattr(getattr(self._session, "sparkContext", None), "_gateway", None), "proc", None
        )
        code = None if process is None else process.poll()
        return None if code is None else int(code)

    def session_if_started(self) -> Any | None:
        """The session if it is up, without waiting or starting one."""
        return self._session

    def table_maintenance(self) -> SparkTableMaintenance:
        """Delta Spark's OPTIMIZE and VACUUM beside this engine's session (started now if
        need be), for the tables ingest commits to through Delta Spark: one for the
        engine, made on first need."""
        if self._maintenance is None:
            self._maintenance = SparkTableMaintenance(self.get())
        return self._maintenance

    def get(self) -> Any:
        """The session, waiting for its start."""
        self.warm()
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise SparkStartError(
                f"the Spark session did not start: {self._error}"
            ) from self._error
        assert self._session is not None
        return self._session

    def stop(self) -> None:
        """Stops a session this provider started (a given one belongs to the caller)."""
        recording = self._archive is not None and self._archive.recording is not None
        if self.leave_jvm_at_exit and not recording:
            return
        if self._owned and self._session is not None:
            try:
                self._session.stop()
            except Exception as exc:
                log.warning("stopping the Spark session failed: %s", exc)
            self._session = None
            if self._archive is not None:
                self._archive.finish()
