"""After a test session that used the servers (the schema registry too), none of their
processes is left running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ingest.processes import pid_alive

INNER_TEST = textwrap.dedent("""
    from ingest.testing import KafkaCluster, TansuBroker, create_topic

    def test_uses_every_server(broker, s3, schema_registry, topic):
        create_topic(broker.bootstrap, topic, partitions=1)
        extra = KafkaCluster().start()
        extra.kill()  # a crashed broker must not leak either
        extra.start()
        # No stop(): the harness must clean up what a test forgets.

    def test_forgotten_broker(s3):
        TansuBroker(storage="s3", s3=s3, s3_bucket="leftover-check").start()
""")


@pytest.mark.slow
def test_no_broker_or_s3_process_survives_a_session(tmp_path: Path) -> None:
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["ingest.testing.pytest_plugin"]\n')
    (tmp_path / "test_inner.py").write_text(INNER_TEST)
    pid_file = tmp_path / "pids.txt"
    env = dict(os.environ, INGEST_TESTING_PID_FILE=str(pid_file))

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    pids = [int(line) for line in pid_file.read_text().split()]
    # session broker (Kafka), s3 server, schema registry, the extra Kafka node twice, the
    # forgotten Tansu
    assert len(pids) == 6
    assert [pid for pid in pids if pid_alive(pid)] == []


def test_a_group_whose_id_another_process_took_is_not_signalled(tmp_path: Path) -> None:
    """A server's process group is signalled by its leader's pid. Once the group has ended,
    the kernel may give that pid to a new process, itself a group leader (every server the
    harness starts is one): a late stop must not kill it. Here the "new process" is the
    same pid with another start time, as start_time would read it after reuse."""
    from ingest.embedded.managed import ManagedProcess, start_time

    server = ManagedProcess("sleeper", ["sleep", "60"], dict(os.environ), tmp_path / "log")
    server.start()
    assert server.pid is not None and start_time(server.pid) is not None
    own = server._started
    try:
        server._started = (own or 0) + 1  # as if server.pid were now another process's
        server.send_signal(signal.SIGKILL)
        time.sleep(0.2)
        assert server.running() and pid_alive(server.pid)
    finally:
        server._started = own
    server.send_signal(signal.SIGKILL)  # its own start time: the group is its
    server.popen.wait(10)  # type: ignore[union-attr]
    assert not server.running()
