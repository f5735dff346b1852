"""One worker per partition costs file descriptors: a supervisor whose open-files limit
cannot hold its partitions' workers stops with a clear error naming the limit and what it
needs (exit 2), instead of a traceback (found at 400 partitions under ``ulimit -n 1024``,
scripts/bench/many_topics.py)."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.testing import KafkaCluster, create_topic, produce, unique_name
from tests.runtime.support import ROOT, records, write_config

# The ingest CLI under a hard limit it cannot raise.
LIMITED = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[1]))); "
    "sys.argv = ['ingest', *sys.argv[2:]]; "
    "runpy.run_module('ingest.cli', run_name='__main__')"
)


def test_too_few_file_descriptors_for_the_workers_is_a_clear_error(
    broker: KafkaCluster, tmp_path: Path
) -> None:
    topic = create_topic(broker.bootstrap, unique_name("fds"), partitions=40)
    produce(broker.bootstrap, topic, records(0, 0, 10))
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=unique_name("g"),
        table=tmp_path / "table",
    )
    done = subprocess.run(
        [sys.executable, "-c", LIMITED, "96", "run", "--until-end", "--config", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 2, out[-3000:]
    assert "no file descriptor left to start the worker" in out, out[-3000:]
    assert "this process may open 96 files" in out
    # No traceback of ours: the run ends on the error above. (The stdlib's fork server,
    # out of descriptors too, may print its own: multiprocessing/forkserver.py.)
    frames = [line for line in out.splitlines() if line.strip().startswith('File "')]
    assert not [f for f in frames if "/ingest/" in f], out[-3000:]


FORK_SERVER_LIMIT = (
    "import resource; "
    "soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE); "
    "low = 256 if hard == resource.RLIM_INFINITY else min(256, hard // 2); "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard)); "
    "from ingest.processes import start_fork_server; "
    "from multiprocessing import forkserver; "
    "start_fork_server(); "
    "pid = forkserver._forkserver._forkserver_pid; "
    "line = [l for l in open(f'/proc/{pid}/limits') if l.startswith('Max open files')][0]; "
    "print(line.split()[3], resource.getrlimit(resource.RLIMIT_NOFILE)[0], low)"
)


def test_the_fork_server_starts_with_the_raised_open_files_limit() -> None:
    # A soft limit of 256 (or half the hard one) below the hard one: the fork server, and
    # every worker forked from it, gets the hard limit, not the soft one it would inherit.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 128:
        pytest.skip(f"the hard open-files limit {hard} leaves no room to test raising")
    done = subprocess.run(
        [sys.executable, "-c", FORK_SERVER_LIMIT],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    server, supervisor, low = done.stdout.split()
    assert int(supervisor) > int(low)  # raised
    assert server == supervisor
