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
"""

from __future__ import annotations

import base64
import shutil
import subprocess
import tempfile
import uuid
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from types import TracebackType

from ingest.errors import DependencyError, HarnessError
from ingest.jars import resolve
from ingest.testing._process import ManagedProcess, free_port, wait_until
from ingest.testing.probe import api_versions_answered
from ingest.testing.tls import CertificateAuthority, make_certificates

__all__ = [
    "KAFKA_VERSION",
    "LISTENERS",
    "KafkaCluster",
    "KafkaNode",
    "kafka_classpath",
    "message_definition",
]

KAFKA_VERSION = "4.4.0"
"""The pinned Apache Kafka release: the newest that resolves from Maven Central."""

KAFKA_ARTIFACTS = (
    f"org.apache.kafka:kafka_2.13:{KAFKA_VERSION}",
    # Kafka logs through slf4j 1.7; this binds it to the log4j-core Kafka already pulls in.
    "org.apache.logging.log4j:log4j-slf4j-impl:2.25.5",
)

LISTENERS = ("PLAINTEXT", "SSL", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
DEFAULT_USERS: Mapping[str, str] = {"alice": "alice-secret", "bob": "bob-secret"}
READY_TIMEOUT_S = 90.0
JVM_OPTIONS = ("-Xms128m", "-Xmx768m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20")

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = info
rootLogger.appenderRef.out.ref = out
logger.state.name = state.change.logger
logger.state.level = warn
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = warn
"""


def kafka_classpath() -> list[Path]:
    """The broker's runtime classpath (resolved on first use, then cached)."""
    return resolve(KAFKA_ARTIFACTS)


def kafka_clients_jar() -> Path:
    name = f"kafka-clients-{KAFKA_VERSION}.jar"
    for jar in kafka_classpath():
        if jar.name == name:
            return jar
    raise DependencyError(f"{name} is not on the resolved classpath")


@cache
def message_definition(name: str) -> str:
    """Kafka's JSON definition of message ``name`` (e.g. ``"FetchRequest"``), as the pinned
    release's kafka-clients jar carries it (``common/message/<name>.json``)."""
    with zipfile.ZipFile(kafka_clients_jar()) as jar:
        try:
            return jar.read(f"common/message/{name}.json").decode()
        except KeyError as exc:
            raise HarnessError(f"kafka-clients {KAFKA_VERSION} has no {name}.json") from exc


def _java() -> str:
    found = shutil.which("java")
    if found is None:
        raise DependencyError(
            "Apache Kafka needs Java 17+ (apt-get install openjdk-17-jre-headless)"
        )
    return found


def _random_cluster_id() -> str:
    # StorageTool random-uuid prints a UUID as 22 characters of unpadded base64url. Like
    # Kafka's Uuid.randomUuid, draw again when it starts with "-": StorageTool's argument
    # parser would take "-t -abc..." for an option (1 draw in 64 failed to format).
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def _properties(values: Mapping[str, str]) -> str:
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n")

    return "".join(f"{key}={escape(value)}\n" for key, value in values.items())


class KafkaNode:
    """One broker+controller JVM of a KafkaCluster."""

    def __init__(self, cluster: KafkaCluster, node_id: int) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.host = "127.0.0.1"
        # Distinct ports: a port freed by one draw can come back from the next (the kernel
        # reuses it), and two listeners on one port stop the node's StorageTool format.
        taken = {port for node in cluster.nodes for port in node.ports.values()}
        self.ports: dict[str, int] = {}
        for name in (*LISTENERS, "CONTROLLER"):
            port = free_port()
            while port in taken:
                port = free_port()
            taken.add(port)
            self.ports[name] = port
        self.directory = cluster.work_dir / f"node-{node_id}"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.config_path = self.directory / "server.properties"
        self.process: ManagedProcess | None = None

    @property
    def port(self) -> int:
        return self.ports["PLAINTEXT"]

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def address(self, listener: str) -> str:
        host = self.host if listener == "PLAINTEXT" else "localhost"
        return f"{host}:{self.ports[listener]}"

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    def settings(self) -> dict[str, str]:
        cluster = self.cluster
        ca = cluster.certificates
        listeners = ",".join(f"{name}://127.0.0.1:{port}" for name, port in self.ports.items())
        advertised = ",".join(f"{name}://{self.address(name)}" for name in LISTENERS)
        replicas = str(len(cluster.nodes))
        min_isr = "2" if len(cluster.nodes) >= 3 else "1"
        values = {
            "process.roles": "broker,controller",
            "node.id": str(self.node_id),
            "controller.quorum.voters": cluster.voters,
            "listeners": listeners,
            "advertised.listeners": advertised,
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": (
                "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_SSL:SASL_SSL"
            ),
            "log.dirs": str(self.directory / "data"),
            "default.replication.factor": replicas,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "4",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": min_isr,
            "transaction.state.log.num.partitions": "4",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": min_isr,
            "num.partitions": "1",
            "group.initial.rebalance.delay.ms": "0",
            # Tests write records with fixed, years-old timestamps: by default the
            # retention check would delete them ~30 s after start (7 days by record
            # time), and every append would roll a new segment (log.roll.ms, by the first
            # record's time).
            "log.retention.ms": "-1",
            "log.roll.ms": str(100 * 365 * 24 * 3600 * 1000),
            "group.min.session.timeout.ms": "500",
            "group.consumer.min.session.timeout.ms": "500",
            "group.consumer.min.heartbeat.interval.ms": "500",
            "group.share.min.session.timeout.ms": "500",
            "group.share.min.heartbeat.interval.ms": "500",
            # TLS: PEM files, a client certificate required on the SSL listener.
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(cluster.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(ca.ca_cert),
            "listener.name.ssl.ssl.client.auth": "required",
            "listener.name.sasl_ssl.ssl.client.auth": "none",
            "sasl.enabled.mechanisms": ",".join(SASL_MECHANISMS),
            "listener.name.sasl_ssl.plain.sasl.jaas.config": (
                "org.apache.kafka.common.security.plain.PlainLoginModule required "
                + " ".join(f'user_{name}="{password}"' for name, password in cluster.users.items())
                + ";"
            ),
        }
        for mechanism in ("scram-sha-256", "scram-sha-512"):
            values[f"listener.name.sasl_ssl.{mechanism}.sasl.jaas.config"] = (
                "org.apache.kafka.common.security.scram.ScramLoginModule required;"
            )
        values.update(cluster.overrides)
        return values

    def _new_process(self) -> ManagedProcess:
        argv = [
            _java(),
            *JVM_OPTIONS,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.cluster.log4j_config}",
            "-cp",
            self.cluster.classpath,
            "kafka.Kafka",
            str(self.config_path),
        ]
        return ManagedProcess(
            f"kafka node {self.node_id} :{self.port}",
            argv,
            self.cluster.environment(),
            self.log_path,
            cwd=self.directory,
        )

    def launch(self) -> None:
        """Starts the JVM (the caller waits for readiness)."""
        if self.process is None:
            self.process = self._new_process()
        self.process.start()

    def answers(self) -> bool:
        if not self.running():
            raise HarnessError(self.died_message())
        try:
            return api_versions_answered(self.host, self.port)
        except OSError:
            return False

    def died_message(self) -> str:
        if self.process is None:
            return f"kafka node {self.node_id} was never started"
        return self.process.died_message()

    def running(self) -> bool:
        return self.process is not None and self.process.running()

    def start(self, *, timeout: float = READY_TIMEOUT_S) -> KafkaNode:
        self.launch()
        try:
            wait_until(
                self.answers,
                timeout=timeout,
                what=f"kafka node {self.node_id} to answer ApiVersions",
            )
        except HarnessError as exc:
            tail = self.log_tail(4000)
            self.stop(timeout=5)
            raise HarnessError(f"{exc}; its log:\n{tail}") from exc
        return self

    def stop(self, *, timeout: float = 30.0) -> int | None:
        """SIGTERM (a controlled shutdown), then SIGKILL after ``timeout``."""
        return self.process.stop(timeout=timeout) if self.process is not None else None

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()

    def pause(self) -> None:
        """SIGSTOP: the node stops answering but keeps its sockets open."""
        import signal

        if self.process is not None:
            self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        import signal

        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        if self.process is None:
            return f"(kafka node {self.node_id} never started)"
        return self.process.log_tail(max_bytes)


class KafkaCluster:
    """Apache Kafka on 127.0.0.1: ``nodes`` combined broker+controller JVMs.

    A one-node cluster also reads as a single broker (``host``, ``port``, ``pid``,
    ``kill()``, ``restart()``, ...), which is how most tests use it.
    """

    def __init__(
        self,
        nodes: int = 1,
        *,
        overrides: Mapping[str, str] | None = None,
        users: Mapping[str, str] | None = None,
        work_dir: Path | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        if nodes < 1:
            raise HarnessError("a Kafka cluster needs at least one node")
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
            self.nodes.append(KafkaNode(self, node_id))
        self._formatted = False

    # -- addresses -----------------------------------------------------------------
    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@127.0.0.1:{n.ports['CONTROLLER']}" for n in self.nodes)

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
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        metadata = admin.list_topics(timeout=5)
        return len(metadata.brokers) == len(self.nodes)

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
