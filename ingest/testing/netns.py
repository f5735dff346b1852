"""Several hosts on one machine: Linux network namespaces joined by veth pairs and a bridge.

``HostNetwork(["kafka-1", "a", "b"])`` makes, for this test session only:

* a namespace of its own for the bridge (``<prefix>-br``, bridge ``br0``), so nothing is
  added to the root namespace: no interface, address or route there changes;
* one namespace per host (``<prefix>-<i>``) with loopback up and ``eth0``, one end of a
  veth pair whose other end (``h<i>``) is a port of the bridge;
* an address per host in a private ``10.X.Y.0/24`` the harness draws and checks unused
  (no address or route of the root namespace, nor of another namespace of this machine,
  falls in it).

The names carry the process id and a random tag, so sessions running side by side do not
meet. ``stop()`` (also at interpreter exit, and from ``with``) deletes every namespace
it made; the veth pairs and the bridge go with them. A process killed before its teardown
leaves them behind: the next ``start()`` deletes those whose process is gone
(``remove_stale``). Only the filesystem is shared: a
table path or a config file reads the same on every host; only the network differs.

What a test does with a host (a ``Host``):

* ``host.argv(argv)``: the command line running ``argv`` in the host (``ip netns exec``);
  ``ingest.testing`` servers take a host and prefix their own command with it;
* ``host.call(fn, ...)``: runs ``fn`` on a thread of this process moved into the host's
  namespace (``setns``), so a Kafka client, ``create_topic`` or ``verify_exact`` reaches
  the hosts' addresses (threads a library starts from there, librdkafka's, inherit it;
  so a process-wide pool a library starts lazily, pyarrow's I/O threads under its S3
  filesystem, would stay in the host for the rest of the process: run those in a
  process of their own, ``host.argv``);
* ``host.cut()`` and ``host.restore()``: its link down and up again, as a pulled cable
  (packets are dropped; sockets stay open on both sides).

Namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2's ``ip``;
``unavailable()`` says why they cannot be made here (None when they can), and the
``host_network`` fixture skips with that reason.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ipaddress
import os
import random
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from functools import cache
from types import TracebackType
from typing import Any, ParamSpec, TypeVar

from ingest.errors import HarnessError

__all__ = ["Host", "HostNetwork", "remove_stale", "unavailable"]

P = ParamSpec("P")
T = TypeVar("T")

_CLONE_NEWNET = 0x40000000
_NETNS_DIR = "/run/netns"
_IP_TIMEOUT_S = 20.0
_SUBNET_DRAWS = 64
# ingest-<pid>-<tag>-<host index or br>: the names HostNetwork gives by default.
_OWN_NAME = re.compile(r"^ingest-(\d+)-[0-9a-f]{4}-(\d+|br)$")


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    ip = shutil.which("ip")
    if ip is None:
        raise HarnessError("iproute2's ip is not installed")
    done = subprocess.run(
        [ip, *args], capture_output=True, text=True, timeout=_IP_TIMEOUT_S, check=False
    )
    if check and done.returncode != 0:
        raise HarnessError(f"ip {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}")
    return done


@cache
def unavailable() -> str | None:
    """Why network namespaces cannot be made here, or None when they can (checked once,
    by adding and deleting one)."""
    if not sys.platform.startswith("linux"):
        return f"network namespaces are Linux only (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    if shutil.which("ip") is None:
        return "iproute2's ip is not installed"
    probe = f"ingest-probe-{os.getpid()}-{random.randrange(16**6):06x}"
    try:
        made = _ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            return f"ip netns add failed: {made.stderr.strip()}"
        link = _ip("-n", probe, "link", "add", "probe0", "type", "bridge", check=False)
        if link.returncode != 0:
            return f"no bridge in a namespace: {link.stderr.strip()}"
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"ip netns failed: {exc}"
    finally:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            _ip("netns", "del", probe, check=False)
    return None


def remove_stale() -> list[str]:
    """Deletes the namespaces a ``HostNetwork`` of a process no longer running left behind
    (killed before its teardown); returns their names. Only names of our own form, and
    only when their process id is not in use."""
    removed = []
    for line in _ip("netns", "list").stdout.split("\n"):
        name = line.split()[0] if line.strip() else ""
        found = _OWN_NAME.match(name)
        if found is None or os.path.exists(f"/proc/{found.group(1)}"):
            continue
        if _ip("netns", "del", name, check=False).returncode == 0:
            removed.append(name)
    return removed


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Every IPv4 network an address or route names, in the root namespace and in every
    named namespace (read only)."""
    outputs = [_ip("-o", "-4", "addr", "show").stdout, _ip("-4", "route", "show").stdout]
    for name in _ip("netns", "list").stdout.split("\n"):
        if name.strip():
            namespace = name.split()[0]
            outputs.append(_ip("-n", namespace, "-o", "-4", "addr", "show", check=False).stdout)
    found: list[ipaddress.IPv4Network] = []
    for text in outputs:
        for word in text.split():
            with contextlib.suppress(ValueError):
                if "/" in word or word.count(".") == 3:
                    found.append(ipaddress.IPv4Network(word, strict=False))
    return found


def _free_subnet(rng: random.Random) -> ipaddress.IPv4Network:
    used = _networks_in_use()
    for _ in range(_SUBNET_DRAWS):
        subnet = ipaddress.IPv4Network(f"10.{rng.randrange(100, 250)}.{rng.randrange(256)}.0/24")
        if not any(subnet.overlaps(other) for other in used if other.prefixlen > 0):
            return subnet
    raise HarnessError(f"no unused 10.X.Y.0/24 in {_SUBNET_DRAWS} draws")


def _enter(namespace: str) -> None:
    """Moves the calling thread into ``namespace``'s network namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(os.path.join(_NETNS_DIR, namespace), os.O_RDONLY)
    try:
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            errno = ctypes.get_errno()
            raise HarnessError(f"setns into {namespace}: {os.strerror(errno)}")
    finally:
        os.close(fd)


class Host:
    """One host of a ``HostNetwork``: a network namespace with ``address`` on ``eth0``."""

    def __init__(self, network: HostNetwork, name: str, index: int, address: str) -> None:
        self.network = network
        self.name = name
        self.index = index
        self.address = address
        self.namespace = f"{network.prefix}-{index}"
        self.peer = f"h{index}"  # its veth's other end, in the bridge's namespace

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in this host (``ip netns exec``, which then execs it: the PID a
        caller gets is the command's own)."""
        ip = shutil.which("ip") or "ip"
        return [ip, "netns", "exec", self.namespace, *argv]

    def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``fn(*args, **kwargs)`` on a new thread in this host's network namespace; its
        result, or its exception raised here. Waits at most ``network.call_timeout``."""
        result: list[Any] = []
        error: list[BaseException] = []

        def run() -> None:
            try:
                _enter(self.namespace)
                result.append(fn(*args, **kwargs))
            except BaseException as exc:
                error.append(exc)

        thread = threading.Thread(target=run, name=f"in-{self.name}", daemon=True)
        thread.start()
        thread.join(self.network.call_timeout)
        if thread.is_alive():
            raise HarnessError(
                f"{getattr(fn, '__name__', fn)} in host {self.name} took over "
                f"{self.network.call_timeout:g}s"
            )
        if error:
            raise error[0]
        return result[0]  # type: ignore[no-any-return]

    def cut(self) -> None:
        """Pulls the cable: the bridge's end of this host's link goes down."""
        _ip("-n", self.network.bridge_namespace, "link", "set", self.peer, "down")

    def restore(self) -> None:
        """Plugs it back in."""
        _ip("-n", self.network.bridge_namespace, "link", "set", self.peer, "up")

    def is_cut(self) -> bool:
        """Whether the bridge's end of the link is down (its flags lack UP)."""
        shown = _ip("-n", self.network.bridge_namespace, "-o", "link", "show", self.peer).stdout
        flags = shown.partition("<")[2].partition(">")[0].split(",")
        return "UP" not in flags

    def __repr__(self) -> str:
        return f"Host({self.name!r}, {self.address}, netns {self.namespace})"


class HostNetwork:
    """Hosts named ``names`` on one bridge, each in a network namespace of its own."""

    def __init__(
        self,
        names: Sequence[str],
        *,
        prefix: str | None = None,
        seed: int | None = None,
        call_timeout: float = 300.0,
    ) -> None:
        if not names or len(set(names)) != len(names):
            raise HarnessError(f"host names must be given and distinct: {list(names)}")
        if len(names) > 200:
            raise HarnessError("at most 200 hosts on one bridge")
        self.rng = random.Random(seed)
        tag = f"{self.rng.randrange(16**4):04x}"
        # Namespace names are free-form; the veth ends are interface names (15 characters).
        self.prefix = prefix or f"ingest-{os.getpid()}-{tag}"
        self.bridge_namespace = f"{self.prefix}-br"
        self.call_timeout = call_timeout
        self.names = list(names)
        self.subnet: ipaddress.IPv4Network | None = None
        self.hosts: dict[str, Host] = {}
        self._made: list[str] = []
        self._lock = threading.Lock()

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    def start(self) -> HostNetwork:
        reason = unavailable()
        if reason is not None:
            raise HarnessError(f"cannot make hosts: {reason}")
        atexit.register(self.stop)
        remove_stale()
        try:
            self.subnet = _free_subnet(self.rng)
            addresses = list(self.subnet.hosts())
            length = self.subnet.prefixlen
            self._add_namespace(self.bridge_namespace)
            bridge = ("-n", self.bridge_namespace)
            _ip(*bridge, "link", "add", "br0", "type", "bridge")
            _ip(*bridge, "link", "set", "br0", "up")
            for index, name in enumerate(self.names, start=1):
                host = Host(self, name, index, str(addresses[index]))
                self._add_namespace(host.namespace)
                inside = ("-n", host.namespace)
                _ip(*inside, "link", "set", "lo", "up")
                veth = ("link", "add", host.peer, "type", "veth", "peer", "name", "eth0")
                _ip(*bridge, *veth, "netns", host.namespace)
                _ip(*bridge, "link", "set", host.peer, "master", "br0", "up")
                _ip(*inside, "addr", "add", f"{host.address}/{length}", "dev", "eth0")
                _ip(*inside, "link", "set", "eth0", "up")
                self.hosts[name] = host
        except BaseException:
            self.stop()
            raise
        return self

    def _add_namespace(self, name: str) -> None:
        _ip("netns", "add", name)
        with self._lock:
            self._made.append(name)

    def stop(self) -> None:
        """Deletes every namespace this network made (and so its links); processes still
        running in a host lose its network. Safe to call twice."""
        with self._lock:
            made, self._made = self._made, []
        failures = []
        for name in reversed(made):
            try:
                done = _ip("netns", "del", name, check=False)
            except (OSError, subprocess.TimeoutExpired, HarnessError) as exc:
                failures.append(f"{name}: {exc}")
                continue
            if done.returncode != 0:
                failures.append(f"{name}: {done.stderr.strip()}")
        with contextlib.suppress(ValueError):
            atexit.unregister(self.stop)
        if failures:
            raise HarnessError(f"could not delete namespaces: {'; '.join(failures)}")

    def __enter__(self) -> HostNetwork:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"HostNetwork({self.prefix}, {self.subnet}, hosts={self.names})"
