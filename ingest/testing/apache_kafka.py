"""Apache Kafka itself for tests: one node or a 3-node cluster, in KRaft combined mode.

The broker is ``org.apache.kafka:kafka_2.13`` from Maven Central, resolved once by
``ingest.jars`` (pyspark's Ivy) into the user's cache; nothing is downloaded on a warm start.
Each node is one JVM running ``kafka.Kafka`` as broker and controller, formatted first with
``kafka.tools.StorageTool`` (with the SCRAM users), on free 127.0.0.1 ports, logging through a
log4j2 properties file of our own into a file the test shows when it fails.

Listeners of every node:

============  ===========================================================================
PLAINTEXT     ``bootstrap`` (also the inter-broker listener)
SSL           ``bootstrap_for("SSL")``: TLS with a client certificate required (mutual TLS)
SASL_SSL      ``bootstrap_for("SASL_SSL")``: TLS, then PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
CONTROLLER    the KRaft quorum
============  ===========================================================================

TLS listeners advertise ``localhost`` (the certificate's name); the CA and client
certificate are in ``certificates``. Users are in ``users`` (name -> password) for every
mechanism.

Settings that differ from a production broker, for tests (each is visible in ``overrides``):
``group.initial.rebalance.delay.ms=0`` (a new group's first join is not held 3 s), a session
timeout floor of 500 ms (tests use short sessions), 4 partitions for the internal topics, and
no retention or time-based segment roll (test records carry fixed, years-old timestamps).

In namespace hosts (``KafkaCluster(3, hosts=...)``, see ``ingest.testing.netns``) every
listener binds to and advertises the node's host address (the TLS certificates name
``localhost`` only: use PLAINTEXT across hosts).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ingest.embedded.managed import wait_until
from ingest.errors import HarnessError
from ingest.testing.kafka_node import (
    _LOG4J2,
    DEFAULT_USERS,
    KAFKA_ARTIFACTS,
    KAFKA_VERSION,
    LISTENERS,
    READY_TIMEOUT_S,
    KafkaNode,
    _java,
    _properties,
    _random_cluster_id,
    kafka_classpath,
    message_definition,
)
from ingest.testing.tls import CertificateAuthority, make_certificates

if TYPE_CHECKING:
    from ingest.testing.netns import Host

__all__ = [
    "KAFKA_ARTIFACTS",
    "KAFKA_VERSION",
    "LISTENERS",
    "KafkaCluster",
    "KafkaNode",
    "kafka_classpath",
    "message_definition",
    "wait_for_leaders",
]


class KafkaCluster:
    """Apache Kafka on 127.0.0.1: ``nodes`` combined broker+controller JVMs.

    A one-node cluster also reads as a single broker (``host``, ``port``, ``pid``,
    ``kill()``, ``restart()``, ...), which is how most tests use it. With ``hosts`` (one
    ``ingest.testing.netns.Host`` per node) node *i* runs in ``hosts[i - 1]``, bound to its
    address; clients then run where they reach it (``reach``).
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        overrides: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
        hosts: Sequence[Host] | None = None,
    ) -> None:
        if nodes < 1:
            raise HarnessError("a Kafka cluster needs at least one node")
        if hosts is not None and len(hosts) != nodes:
            raise HarnessError(f"{nodes} nodes need {nodes} hosts, not {len(hosts)}")
        self.hosts = list(hosts) if hosts is not None else None
        self._own_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ingest-kafka-"))
        self.overrides = dict(overrides or {})
        self.users = dict(DEFAULT_USERS if users is None else users)
        self.ready_timeout = ready_timeout
        self.cluster_id = _random_cluster_id()
        self.classpath = ":".join(str(jar) for jar in kafka_classpath())
        self.log4j_config = self.work_dir / "log4j2.properties"
        self.log4j_config.write_text(_LOG4J2)
        self.certificates: CertificateAuthority = make_certificates(
            self.work_dir / "tls", server_names=("localhost",)
        )
        self.keystore = self.work_dir / "tls" / "server-keystore.pem"
        self.keystore.write_text(
            self.certificates.server_key.read_text() + self.certificates.server_cert.read_text()
        )
        self.nodes: list[KafkaNode] = []
        for node_id in range(1, nodes + 1):  # one at a time: each avoids the others' ports
            on = self.hosts[node_id - 1] if self.hosts is not None else None
            self.nodes.append(KafkaNode(self, node_id, on))
        self._formatted = False

    # -- addresses -----------------------------------------------------------------
    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@{n.host}:{n.ports['CONTROLLER']}" for n in self.nodes)

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def bootstrap_for(self, listener: str) -> str:
        if listener not in LISTENERS:
            raise HarnessError(f"no {listener} listener (have {', '.join(LISTENERS)})")
        return ",".join(node.address(listener) for node in self.nodes)

    @property
    def host(self) -> str:
        return self.nodes[0].host

    @property
    def port(self) -> int:
        return self.nodes[0].port

    @property
    def pid(self) -> int | None:
        return self.nodes[0].pid

    @property
    def log_path(self) -> Path:
        return self.nodes[0].log_path

    def node(self, node_id: int) -> KafkaNode:
        for node in self.nodes:
            if node.node_id == node_id:
                return node
        raise HarnessError(f"no node {node_id} in this cluster")

    def reach(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` from where the nodes can be reached: here, or, for a
        cluster in namespace hosts, from the first node's host (``Host.call``), e.g.
        ``cluster.reach(create_topic, cluster.bootstrap, "t", partitions=4)``."""
        if self.hosts is None:
            return fn(*args, **kwargs)
        return self.hosts[0].call(fn, *args, **kwargs)

    def environment(self) -> dict[str, str]:
        import os

        return {k: v for k, v in os.environ.items() if not k.startswith(("KAFKA_", "JAVA_TOOL"))}

    # -- lifecycle -----------------------------------------------------------------
    def start(self) -> KafkaCluster:
        if not self._formatted:
            formats = [self._format_in_background(node) for node in self.nodes]
            for node, proc in zip(self.nodes, formats, strict=True):
                self._finish_format(node, proc)
            self._formatted = True
        for node in self.nodes:
            node.launch()
        try:
            wait_until(self._all_answer, timeout=self.ready_timeout, what="kafka nodes to answer")
            if len(self.nodes) > 1:
                wait_until(
                    self._all_registered,
                    timeout=self.ready_timeout,
                    what=f"all {len(self.nodes)} kafka brokers in the metadata",
                )
        except HarnessError as exc:
            logs = "\n".join(f"--- node {n.node_id}:\n{n.log_tail(3000)}" for n in self.nodes)
            self.stop()
            raise HarnessError(f"{exc}\n{logs}") from exc
        return self

    def _format_in_background(self, node: KafkaNode) -> subprocess.Popen[str]:
        node.config_path.write_text(_properties(node.settings()))
        argv = [
            _java(),
            "-cp",
            self.classpath,
            f"-Dlog4j2.configurationFile={self.log4j_config}",
            "kafka.tools.StorageTool",
            "format",
            "--ignore-formatted",
            "-t",
            self.cluster_id,
            "-c",
            str(node.config_path),
        ]
        for name, password in self.users.items():
            for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
                argv += ["--add-scram", f"{mechanism}=[name={name},password={password}]"]
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def _finish_format(node: KafkaNode, proc: subprocess.Popen[str]) -> None:
        try:
            output, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired as exc:
            proc.kill()
            raise HarnessError(f"formatting kafka node {node.node_id} took over 120 s") from exc
        if proc.returncode != 0:
            raise HarnessError(
                f"kafka StorageTool format of node {node.node_id} exited {proc.returncode}:\n"
                f"{output[-3000:]}"
            )

    def _all_answer(self) -> bool:
        return all(node.answers() for node in self.nodes if node.running() or node.process)

    def _all_registered(self) -> bool:
        return bool(self.reach(_brokers_listed, self.bootstrap) == len(self.nodes))

    def stop(self) -> None:
        """Stops every node by PID (SIGTERM, then SIGKILL); keeps data and logs."""
        for node in reversed(self.nodes):
            if node.running():
                node.process.send_signal(15)  # type: ignore[union-attr]
        for node in reversed(self.nodes):
            node.stop(timeout=30)

    def kill(self) -> None:
        """SIGKILL every node, as a crash would."""
        for node in self.nodes:
            node.kill()

    def pause(self) -> None:
        for node in self.nodes:
            node.pause()

    def resume(self) -> None:
        for node in self.nodes:
            node.resume()

    def restart(self, *, kill: bool = False) -> KafkaCluster:
        """Stops (or kills) every node and starts them again on the same ports and data."""
        if kill:
            self.kill()
        else:
            self.stop()
        return self.start()

    def running(self) -> bool:
        return all(node.running() for node in self.nodes)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        share = max_bytes // len(self.nodes)
        return "\n".join(f"--- kafka node {n.node_id}:\n{n.log_tail(share)}" for n in self.nodes)

    def cleanup(self) -> None:
        """Stops the cluster and removes its work directory (logs included)."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.cleanup()

    def __repr__(self) -> str:
        return f"KafkaCluster({self.bootstrap}, nodes={len(self.nodes)})"


def _brokers_listed(bootstrap: str) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.list_topics(timeout=5).brokers)


def wait_for_leaders(bootstrap: str, topic: str, *, timeout: float = 30.0) -> None:
    """Waits until every partition of ``topic`` has a leader and a full ISR."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})

    def ready() -> bool:
        metadata = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        if metadata is None or metadata.error is not None or not metadata.partitions:
            return False
        return all(
            p.leader >= 0 and len(p.isrs) == len(p.replicas) for p in metadata.partitions.values()
        )

    wait_until(ready, timeout=timeout, what=f"leaders for every partition of {topic}")
