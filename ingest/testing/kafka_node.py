"""One node of the test Apache Kafka (``KafkaNode``): its release and classpath, its
settings, its JVM; ``ingest.testing.apache_kafka`` puts nodes together as a cluster.

A node runs on 127.0.0.1, or in a ``ingest.testing.netns.Host`` bound to the host's
address (its command prefixed with ``ip netns exec``).
"""

from __future__ import annotations

import base64
import os
import shutil
import time
import uuid
import zipfile
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from ingest.embedded.managed import ManagedProcess, free_port, wait_until
from ingest.embedded.probe import api_versions_answered
from ingest.errors import DependencyError, HarnessError
from ingest.jars import resolve

if TYPE_CHECKING:
    from ingest.testing.apache_kafka import KafkaCluster
    from ingest.testing.netns import Host

__all__ = [
    "DEFAULT_USERS",
    "KAFKA_ARTIFACTS",
    "KAFKA_VERSION",
    "LISTENERS",
    "READY_TIMEOUT_S",
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
    """One broker+controller JVM of a KafkaCluster: on 127.0.0.1, or in ``on`` (a
    namespace host), bound to its address, where every listener advertises that address."""

    def __init__(self, cluster: KafkaCluster, node_id: int, on: Host | None = None) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.on = on
        self.host = "127.0.0.1" if on is None else on.address
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
        host = self.host if listener == "PLAINTEXT" or self.on is not None else "localhost"
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
        listeners = ",".join(f"{name}://{self.host}:{port}" for name, port in self.ports.items())
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
            f"kafka node {self.node_id} {self.bootstrap}",
            argv if self.on is None else self.on.argv(argv),
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
            if self.on is not None:
                return self.on.call(api_versions_answered, self.host, self.port)
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

    def pause(self, *, timeout: float = 10.0) -> None:
        """SIGSTOP: the node stops answering but keeps its sockets open. Returns once every
        thread of its process group is stopped: a group stop lands on each thread when the
        kernel next schedules it, and a node's thread still running on a loaded machine
        could answer one more request (seen once in CI: a paused node answered)."""
        import signal

        if self.process is not None and self.process.pid is not None:
            self.process.send_signal(signal.SIGSTOP)
            _wait_stopped(self.process.pid, timeout)

    def resume(self) -> None:
        import signal

        if self.process is not None:
            self.process.send_signal(signal.SIGCONT)

    def log_tail(self, max_bytes: int = 20_000) -> str:
        if self.process is None:
            return f"(kafka node {self.node_id} never started)"
        return self.process.log_tail(max_bytes)


def _wait_stopped(group: int, timeout: float) -> None:
    """Waits until every thread of every process in process group ``group`` is stopped
    (state T in /proc)."""
    deadline = time.monotonic() + timeout
    while True:
        running = [
            task for task in _group_tasks(group) if _task_state(task) not in ("T", "t", "Z", "X")
        ]
        if not running:
            return
        if time.monotonic() > deadline:
            raise HarnessError(
                f"process group {group}: {len(running)} threads still running {timeout:g}s "
                "after SIGSTOP"
            )
        time.sleep(0.005)


def _group_tasks(group: int) -> list[Path]:
    tasks: list[Path] = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if os.getpgid(int(proc.name)) != group:
                continue
            tasks.extend((proc / "task").iterdir())
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return tasks


def _task_state(task: Path) -> str:
    try:
        stat = (task / "stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return "X"  # gone
    return stat[stat.rindex(")") + 2 :].split()[0]
