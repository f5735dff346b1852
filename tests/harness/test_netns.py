"""Hosts as network namespaces (``ingest.testing.netns``): each reaches the others over the
bridge, a cut drops its link until restored, nothing lands in the root namespace, and
every namespace goes at teardown. Skipped, naming the reason, where they cannot be made."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable

import pytest

from ingest.embedded.seaweedfs import REGION, S3Server
from ingest.testing.netns import HostNetwork, remove_stale, unavailable

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no namespace hosts: {REASON}")

_ECHO = """
import socket, sys
server = socket.create_server((sys.argv[1], 9000))
while True:
    conn, _ = server.accept()
    conn.sendall(b"hello from " + sys.argv[1].encode())
    conn.close()
"""


def _namespaces() -> set[str]:
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in listed.stdout.splitlines() if line.strip()}


def _ask(address: str) -> str:
    try:
        with socket.create_connection((address, 9000), timeout=2) as conn:
            return conn.recv(100).decode()
    except OSError as exc:
        return type(exc).__name__


def test_hosts_talk_over_the_bridge_and_a_cut_drops_the_link() -> None:
    with HostNetwork(["a", "b"]) as network:
        a, b = network["a"], network["b"]
        assert a.address != b.address and network.subnet is not None
        # The server runs in b, bound to b's address: ready once a reaches it.
        server = subprocess.Popen(b.argv([sys.executable, "-c", _ECHO, b.address]))
        try:
            deadline = time.monotonic() + 20
            while a.call(_ask, b.address) != f"hello from {b.address}":
                assert time.monotonic() < deadline, "b's server never answered a"
                time.sleep(0.1)
            a.cut()
            assert a.is_cut()
            assert a.call(_ask, b.address) == "TimeoutError"
            a.restore()
            assert not a.is_cut()
            deadline = time.monotonic() + 10
            while a.call(_ask, b.address) != f"hello from {b.address}":
                assert time.monotonic() < deadline, "the link did not come back"
                time.sleep(0.1)
        finally:
            server.kill()
            server.wait(10)
        # The root namespace has no address, route or interface of the hosts' subnet.
        prefix = str(network.subnet.network_address).rsplit(".", 1)[0] + "."
        for what in (["-o", "addr"], ["route"], ["-o", "link"]):
            shown = subprocess.run(["ip", *what], capture_output=True, text=True).stdout
            assert prefix not in shown and network.prefix not in shown
        made = {h.namespace for h in network.hosts.values()} | {network.bridge_namespace}
        assert made <= _namespaces()
    assert not made & _namespaces()


def test_the_fixture_makes_hosts_and_leaves_none(
    host_network: Callable[[list[str]], HostNetwork],
) -> None:
    network = host_network(["x", "y"])
    assert network["x"].call(socket.gethostbyname, "localhost") == "127.0.0.1"
    assert {h.namespace for h in network.hosts.values()} <= _namespaces()


def test_a_failing_test_still_removes_every_namespace() -> None:
    network = HostNetwork(["only"])
    with pytest.raises(RuntimeError), network:
        made = {network["only"].namespace, network.bridge_namespace}
        assert made <= _namespaces()
        raise RuntimeError("the test failed")
    assert not made & _namespaces()


def test_namespaces_a_killed_session_left_are_removed() -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert not os.path.exists(f"/proc/{gone.pid}")
    stale = f"ingest-{gone.pid}-abcd-br"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        assert stale in remove_stale()
        assert stale not in _namespaces()
    finally:
        subprocess.run(["ip", "netns", "del", stale], capture_output=True)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="util-linux setpriv is not installed")
def test_without_the_capabilities_hosts_are_unavailable_with_the_reason() -> None:
    """Root without CAP_SYS_ADMIN (setpriv drops every capability) cannot make a
    namespace: ``unavailable`` says so, which the fixtures skip with."""
    code = "from ingest.testing.netns import unavailable; print(unavailable())"
    done = subprocess.run(
        ["setpriv", "--bounding-set", "-all", "--inh-caps", "-all", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    assert "ip netns add failed" in done.stdout and "not permitted" in done.stdout


# Put and get through pyarrow's S3 filesystem, in a process of its own: pyarrow's I/O
# threads are process-wide and started lazily, so started from a thread moved into a host
# (``Host.call``) they would stay there and every later S3 call of this process, from
# any thread, would go out of that host (tests/harness/test_s3_and_spark.py then failed).
_PUT_AND_GET = """
import os, sys
from pyarrow import fs
s3 = fs.S3FileSystem(endpoint_override=sys.argv[1], scheme="http", region=sys.argv[2])
with s3.open_output_stream(sys.argv[3]) as out:
    out.write(b"across hosts")
with s3.open_input_stream(sys.argv[3]) as back:
    sys.stdout.write(back.read().decode())
"""


def test_seaweedfs_on_a_host_serves_the_others_until_cut() -> None:
    with HostNetwork(["s3", "client"]) as network:
        server = S3Server(on=network["s3"]).start()
        try:
            assert server.host == network["s3"].address
            env = {
                **os.environ,
                "AWS_ACCESS_KEY_ID": server.access_key,  # in the environment, not argv
                "AWS_SECRET_ACCESS_KEY": server.secret_key,
            }
            argv = [sys.executable, "-c", _PUT_AND_GET, f"{server.host}:{server.port}"]
            argv += [REGION, f"{server.bucket}/hello.txt"]
            done = subprocess.run(
                network["client"].argv(argv), env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr
            assert done.stdout == "across hosts"
            network["s3"].cut()
            assert network["client"].call(_ask_port, server.host, server.port) == "TimeoutError"
        finally:
            network["s3"].restore()
            server.cleanup()


def _ask_port(address: str, port: int) -> str:
    try:
        with socket.create_connection((address, port), timeout=2):
            return "connected"
    except OSError as exc:
        return type(exc).__name__
