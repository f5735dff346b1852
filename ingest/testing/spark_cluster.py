"""A Spark standalone cluster for tests: a master and its workers, each a process of its own,
started from the installed pyspark (``$SPARK_HOME/bin/spark-class`` with pyspark's directory
as ``SPARK_HOME``).

Everything listens on 127.0.0.1 on ports free at start (the master's REST submission
server, fixed at 6066 by default, is off). With ``hosts`` (``ingest.testing.netns``
hosts), worker *i* runs in ``hosts[i]`` and the master in ``master_host`` (default
``hosts[0]``), each bound to its host's address (``SPARK_LOCAL_IP``, ``--host``) and started
with ``ip netns exec``; the master's ``/json/`` is then read from its host (``Host.call``).
Each process has its own working directory under ``work_dir`` (``master/``, ``worker-N/``:
``SPARK_WORKER_DIR`` with the executors' directories and logs, ``SPARK_LOG_DIR``) and a log
file there. The workers run their
executors' Python as this interpreter (``PYSPARK_PYTHON``) with ``python_path`` on its
``PYTHONPATH``: by default the directory the running ``ingest`` package was imported from,
so executors run the same ingest as the test (on a real cluster ingest
is installed on each host instead).

Ready means: the master logged "I have been elected leader" and its UI's ``/json/`` says
``ALIVE``; each worker logged "Successfully registered with master" and the master lists
every worker alive. Every wait is bounded and polls; none is a fixed sleep. ``stop`` ends
each process by its PID (SIGTERM to its process group, then SIGKILL), and then any
descendant seen before (an executor, pyspark's Python daemon, which leaves the group) that
is still alive, by its PID::

    with SparkCluster() as cluster:
        config = {"spark": {"master": cluster.master_url}}

    # A master on one namespace host, a worker on each of two others:
    with SparkCluster(hosts=[network["a"], network["b"]], master_host=network["m"]) as cluster:
        ...  # a driver in host "a" or "b" sets SPARK_LOCAL_IP (or spark.driver.host)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from ingest.embedded.managed import ManagedProcess, free_port, start_time, wait_until
from ingest.errors import HarnessError

if TYPE_CHECKING:
    from ingest.testing.netns import Host

__all__ = ["SparkCluster", "alive", "descendants", "spark_home"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
LEADER_LINE = "I have been elected leader"
REGISTERED_LINE = "Successfully registered with master"


def spark_home() -> Path:
    """pyspark's directory, which holds ``bin/spark-class`` and ``jars/``."""
    import pyspark

    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").is_file():
        raise HarnessError(f"no bin/spark-class in pyspark's directory {home}")
    return home


def source_root() -> Path:
    """The directory the running ``ingest`` package was imported from."""
    import ingest

    return Path(ingest.__file__).resolve().parent.parent


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid`` (children, their children...), from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # The command name may hold spaces and parentheses: the fields after it.
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    pending = [pid]
    while pending:
        for child in parents.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SparkCluster:
    """A standalone master and ``workers`` workers (``cores`` and ``memory`` each) on
    loopback, or one worker per host of ``hosts`` and the master in ``master_host``
    (default ``hosts[0]``). ``master_url`` is what ``spark.master`` takes."""

    def __init__(
        self,
        workers: int | None = None,
        *,
        hosts: Sequence[Host] | None = None,
        master_host: Host | None = None,
        cores: int = 1,
        memory: str = "1g",
        work_dir: Path | None = None,
        python: str | None = None,
        python_path: Sequence[str | Path] | None = None,
        worker_env: Mapping[str, str] | None = None,
        ready_timeout: float = 90.0,
        stop_timeout: float = 10.0,
    ) -> None:
        if hosts is not None and workers is not None and workers != len(hosts):
            raise HarnessError(f"{workers} workers but {len(hosts)} hosts: one worker a host")
        if master_host is not None and not hosts:
            raise HarnessError("a master on a host needs its workers on hosts too")
        count = len(hosts) if hosts is not None else 2 if workers is None else workers
        if count < 1:
            raise HarnessError("a cluster needs at least one worker")
        self.home = spark_home()
        self.hosts: list[Host | None] = list(hosts) if hosts else [None] * count
        self.master_host = master_host or (hosts[0] if hosts else None)
        self.host = _address(self.master_host)
        self.owns_work_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ingest-spark-cluster-"))
        self.ready_timeout = ready_timeout
        self.stop_timeout = stop_timeout
        self.python = python or sys.executable
        paths = [str(p) for p in (python_path if python_path is not None else [source_root()])]
        self.port = free_port()
        self.ui_port = free_port()
        while self.ui_port == self.port:
            self.ui_port = free_port()
        self.master = self._process(
            "master",
            MASTER_CLASS,
            ["--host", self.host, "--port", str(self.port), "--webui-port", str(self.ui_port)],
            {"SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"},
            self.master_host,
        )
        self.workers: list[ManagedProcess] = []
        for index, on in enumerate(self.hosts):
            directory = self.work_dir / f"worker-{index}"
            env = {
                "SPARK_WORKER_DIR": str(directory / "work"),
                "PYSPARK_PYTHON": self.python,
                "PYSPARK_DRIVER_PYTHON": self.python,
                **({"PYTHONPATH": os.pathsep.join(paths)} if paths else {}),
                **(worker_env or {}),
            }
            argv = [
                *("--host", _address(on), "--port", "0", "--webui-port", "0"),
                *("--cores", str(cores), "--memory", memory),
                *("--work-dir", str(directory / "work"), self.master_url),
            ]
            self.workers.append(self._process(f"worker-{index}", WORKER_CLASS, argv, env, on))
        # Descendants seen while running: what ``stop`` must not leave behind.
        self._seen: dict[int, set[tuple[int, int]]] = {}

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.ui_port}"

    def worker_address(self, index: int) -> str:
        """The address worker ``index`` (and its executors) bind to."""
        return _address(self.hosts[index])

    def _process(
        self,
        name: str,
        main_class: str,
        args: list[str],
        extra_env: Mapping[str, str],
        on: Host | None = None,
    ) -> ManagedProcess:
        directory = self.work_dir / name
        (directory / "logs").mkdir(parents=True, exist_ok=True)
        (directory / "conf").mkdir(exist_ok=True)  # no spark-env.sh or defaults of the host
        env = dict(os.environ)
        for key in ("SPARK_HOME", "PYTHONPATH", "SPARK_CONF_DIR"):
            env.pop(key, None)
        env.update(
            SPARK_HOME=str(self.home),
            SPARK_CONF_DIR=str(directory / "conf"),
            SPARK_LOG_DIR=str(directory / "logs"),
            SPARK_LOCAL_IP=_address(on),
            SPARK_LOCAL_HOSTNAME=_address(on),
            SPARK_DAEMON_MEMORY="256m",
            SPARK_NO_DAEMONIZE="1",
        )
        env.update(extra_env)
        argv = [str(self.home / "bin" / "spark-class"), main_class, *args]
        if on is not None:
            argv = on.argv(argv)  # ip netns exec ... execs spark-class: the PID is its own
        where = f"{self.host}:{self.port}" if on is None else f"on {on.name} {on.address}"
        return ManagedProcess(
            f"spark {name} {where}", argv, env, directory / f"{name}.log", directory
        )

    # -- start -----------------------------------------------------------------------------

    def start(self) -> Self:
        """Starts the master, then every worker at once; returns once all are ready."""
        try:
            self.start_master()
            for worker in self.workers:
                worker.start()
            for index in range(len(self.workers)):
                self.wait_worker(index)
            wait_until(
                lambda: self.alive_workers() >= len(self.workers),
                timeout=self.ready_timeout,
                interval=0.1,
                what=f"the master to list {len(self.workers)} alive workers",
            )
        except BaseException:
            self.stop()
            raise
        return self

    def start_master(self) -> float:
        """Starts (or restarts, on the same port) the master; seconds until it leads."""
        began = time.monotonic()
        offset = _log_size(self.master.log_path)
        self.master.start()
        self._wait_line(self.master, LEADER_LINE, offset, "the master to be elected leader")
        wait_until(
            lambda: self.state().get("status") == "ALIVE",
            timeout=self.ready_timeout,
            interval=0.1,
            what=f"the master UI {self.ui_url}/json/ to say ALIVE",
        )
        return time.monotonic() - began

    def wait_worker(self, index: int, offset: int = 0) -> None:
        worker = self.workers[index]
        self._wait_line(worker, REGISTERED_LINE, offset, f"worker {index} to register")

    def restart_worker(self, index: int) -> float:
        """Starts a stopped or killed worker again; seconds until it is registered."""
        began = time.monotonic()
        worker = self.workers[index]
        offset = _log_size(worker.log_path)
        worker.start()
        self.wait_worker(index, offset)
        return time.monotonic() - began

    def _wait_line(self, process: ManagedProcess, line: str, offset: int, what: str) -> None:
        def seen() -> bool:
            if _contains(process.log_path, line, offset):
                return True
            if not process.running():
                raise HarnessError(process.died_message())
            return False

        try:
            wait_until(seen, timeout=self.ready_timeout, interval=0.05, what=what)
        except HarnessError as exc:
            raise HarnessError(f"{exc}; log {process.log_path}:\n{process.log_tail(4000)}") from exc

    # -- state -----------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """The master UI's ``/json/``: workers, applications, status (read from the
        master's host when it has one)."""
        url = f"{self.ui_url}/json/"
        if self.master_host is not None:
            return self.master_host.call(_read_json, url)
        return _read_json(url)

    def alive_workers(self) -> int:
        return int(self.state().get("aliveworkers", 0))

    def executor_pids(self, index: int) -> list[int]:
        """The executor JVMs worker ``index`` runs now."""
        pid = self.workers[index].pid
        if pid is None:
            return []
        return [
            child for child in descendants(pid) if "CoarseGrainedExecutorBackend" in _cmdline(child)
        ]

    def pids(self) -> list[int]:
        """The master's, the workers' and all their descendants' PIDs, alive now."""
        found: list[int] = []
        for process in [self.master, *self.workers]:
            if process.pid is not None and process.running():
                found.append(process.pid)
                found.extend(descendants(process.pid))
        return found

    # -- faults and stop -------------------------------------------------------------------

    def kill_worker(self, index: int) -> int:
        """SIGKILL to worker ``index`` (its JVM only, by PID), as a host crash would; its
        executors notice the lost worker and exit. Returns the PID killed."""
        worker = self.workers[index]
        if worker.popen is None or not worker.running():
            raise HarnessError(f"worker {index} is not running")
        self._remember(worker)
        os.kill(worker.popen.pid, signal.SIGKILL)
        worker.popen.wait(10)
        return worker.popen.pid

    def stop_master(self) -> None:
        self._stop(self.master)

    def stop(self) -> None:
        """Stops the workers, then the master, each by PID, and then any descendant of
        theirs still alive. Keeps the logs."""
        for process in [*self.workers, self.master]:
            self._stop(process)
        # Each remembered with its start time: a pid another process took since is not ours.
        seen = [(pid, started) for pids in self._seen.values() for pid, started in pids]
        for pid, started in seen:
            if alive(pid) and start_time(pid) == started:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

        def left() -> list[int]:
            return sorted(p for p, t in seen if alive(p) and start_time(p) == t)

        deadline = time.monotonic() + self.stop_timeout
        while time.monotonic() < deadline and left():
            time.sleep(0.05)
        still = left()
        self._seen.clear()
        if still:
            raise HarnessError(f"processes of the Spark cluster outlived its stop: {still}")

    def _remember(self, process: ManagedProcess) -> None:
        if process.pid is not None and process.running():
            self._seen.setdefault(process.pid, set()).update(
                (pid, started)
                for pid in descendants(process.pid)
                if (started := start_time(pid)) is not None
            )

    def _stop(self, process: ManagedProcess) -> None:
        self._remember(process)
        process.stop(timeout=self.stop_timeout)

    def running(self) -> bool:
        return self.master.running() and all(w.running() for w in self.workers)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        share = max_bytes // (1 + len(self.workers))
        return "\n".join(
            f"--- {p.name}:\n{p.log_tail(share)}" for p in [self.master, *self.workers]
        )

    def cleanup(self) -> None:
        """Stops the cluster and removes its work directory if it made it."""
        try:
            self.stop()
        finally:
            if self.owns_work_dir:
                shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"SparkCluster({self.master_url}, workers={len(self.workers)}, ui={self.ui_url})"


def _address(on: Host | None) -> str:
    return "127.0.0.1" if on is None else on.address


def _read_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as answer:
        state: dict[str, Any] = json.load(answer)
    return state


def _log_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _contains(path: Path, line: str, offset: int) -> bool:
    try:
        with open(path, "rb") as log:
            log.seek(offset)
            return line.encode() in log.read()
    except OSError:
        return False


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
