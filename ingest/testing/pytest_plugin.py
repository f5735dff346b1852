"""pytest fixtures for ingest's real test servers.

Enable it with ``pytest_plugins = ["ingest.testing.pytest_plugin"]`` in a conftest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from ingest.embedded.managed import live_processes, stop_all
from ingest.embedded.seaweedfs import S3Server
from ingest.embedded.tansu import TansuBroker
from ingest.errors import DependencyError
from ingest.testing.apache_kafka import KafkaCluster
from ingest.testing.debian import debian_tool
from ingest.testing.kafka import unique_name
from ingest.testing.metastore import HiveMetastore
from ingest.testing.netns import HostNetwork, unavailable
from ingest.testing.registry import SchemaRegistry, registry_java
from ingest.testing.spark_cluster import SparkCluster

_SERVERS_KEY = pytest.StashKey[list[Any]]()


def _register(config: pytest.Config, server: Any) -> None:
    config.stash.setdefault(_SERVERS_KEY, []).append(server)


@pytest.fixture(scope="session")
def broker(pytestconfig: pytest.Config) -> Iterator[KafkaCluster]:
    """One Apache Kafka node (broker + controller, KRaft) for the whole test session, with
    PLAINTEXT, SSL and SASL_SSL listeners."""
    server = KafkaCluster(1).start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def kafka_cluster(pytestconfig: pytest.Config) -> Iterator[KafkaCluster]:
    """Three Apache Kafka nodes (each broker + controller), replication factor 3 and
    ``min.insync.replicas=2``, for the whole test session (started on first use, ~11 s)."""
    server = KafkaCluster(3).start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def tansu(pytestconfig: pytest.Config) -> Iterator[TansuBroker]:
    """One Tansu broker (memory storage) for the whole test session: the quickstart's
    embedded broker, with the deviations docs/kafka-compat.md lists."""
    server = TansuBroker().start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def s3(pytestconfig: pytest.Config) -> Iterator[S3Server]:
    """One SeaweedFS S3 server for the whole test session."""
    server = S3Server().start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def schema_registry(pytestconfig: pytest.Config) -> Iterator[SchemaRegistry]:
    """One schema registry (Apicurio, Confluent's API at ``url``, global compatibility
    BACKWARD, in-memory) for the whole test session; skips when no Java 21+ is found."""
    try:
        java = registry_java()
    except DependencyError as exc:
        pytest.skip(str(exc))
    server = SchemaRegistry(java=java).start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def hive_metastore(pytestconfig: pytest.Config) -> Iterator[HiveMetastore]:
    """One Hive metastore (Hive's Thrift server from pyspark's jars, Derby inside) for the
    whole test session: Spark's catalog for tables by name (``spark_conf``)."""
    server = HiveMetastore().start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def promtool() -> Path:
    """Prometheus' ``promtool`` (Debian's ``prometheus`` package, fetched once into the
    cache by ``debian_tool``); skips naming the reason when it cannot be had."""
    try:
        return debian_tool("prometheus", "promtool")
    except DependencyError as exc:
        pytest.skip(str(exc))


@pytest.fixture
def host_network() -> Iterator[Callable[[Sequence[str]], HostNetwork]]:
    """Makes ``HostNetwork(names)`` (network-namespace hosts, ``ingest.testing.netns``)
    for this test and deletes them after it, failed or not; skips naming the reason where
    namespaces cannot be made (not root, no ``ip``)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"no namespace hosts: {reason}")
    made: list[HostNetwork] = []

    def make(names: Sequence[str]) -> HostNetwork:
        network = HostNetwork(names)
        made.append(network)
        return network.start()

    yield make
    for network in made:
        network.stop()


@pytest.fixture
def topic(request: pytest.FixtureRequest) -> str:
    """A topic name unique to this test (not created)."""
    return unique_name(f"t-{request.node.name[:40]}".replace("[", "-").replace("]", ""))


@pytest.fixture
def group(request: pytest.FixtureRequest) -> str:
    """A consumer-group name unique to this test."""
    return unique_name(f"g-{request.node.name[:40]}".replace("[", "-").replace("]", ""))


@pytest.fixture(scope="session")
def spark(pytestconfig: pytest.Config) -> Iterator[Any]:
    """One local[2] Spark session for the test session (it cold-starts in ~8 s). A test
    that leaves it stopped, or its JVM gone, fails at its teardown (``_shared_spark``)."""
    from ingest.testing.spark import local_spark_session

    session = local_spark_session()
    pytestconfig.stash[_SPARK_KEY] = session
    yield session
    reported = pytestconfig.stash.get(_SPARK_KEY, None) is None  # by the test that broke it
    pytestconfig.stash[_SPARK_KEY] = None
    broken = _spark_broken(session)
    if broken is None:
        session.stop()
    elif not reported:
        pytest.fail(f"the suite's Spark session {broken} before the end of the test session")


_SPARK_KEY = pytest.StashKey[Any]()


def _spark_broken(session: Any) -> str | None:
    """How the suite's shared session is broken (stopped, replaced, its JVM exited), or
    None."""
    from pyspark import SparkContext

    process = getattr(session.sparkContext._gateway, "proc", None)
    if process is not None and process.poll() is not None:
        return f"lost its JVM (pid {process.pid}, exit code {process.returncode})"
    if session.sparkContext._jsc is None:
        return "was stopped"
    if SparkContext._active_spark_context is not session.sparkContext:
        return "was replaced by another SparkContext"
    return None


@pytest.fixture(autouse=True)
def _shared_spark(pytestconfig: pytest.Config) -> Iterator[None]:
    """Fails the test that broke the suite's shared Spark session (stopped it, or made its
    JVM exit), at its own teardown: every later Spark test would fail, far from the cause."""
    yield
    session = pytestconfig.stash.get(_SPARK_KEY, None)
    broken = None if session is None else _spark_broken(session)
    if broken is not None:
        pytestconfig.stash[_SPARK_KEY] = None  # reported once, here
        pytest.fail(f"this test broke the suite's Spark session: it {broken}")


@pytest.fixture(scope="session")
def spark_cluster(pytestconfig: pytest.Config) -> Iterator[SparkCluster]:
    """A Spark standalone master and two workers (1 core, 1 GiB each) on loopback for the
    whole test session, started on first use (~7 s); ``spark_cluster.master_url`` is what
    ``spark.master`` takes. Its executors run this interpreter and this checkout's ingest."""
    server = SparkCluster(2).start()
    _register(pytestconfig, server)
    yield server
    server.cleanup()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.failed:
        # A failing test shows what the servers it may have used said.
        for server in item.config.stash.get(_SERVERS_KEY, []):
            report.sections.append((f"log of {server!r}", server.log_tail(6000)))
    return report


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftover = live_processes()
    if leftover:
        names = ", ".join(f"{p.name} (pid {p.pid})" for p in leftover)
        stop_all()
        session.config.stash.setdefault(_SERVERS_KEY, [])
        print(f"\ningest.testing: stopped servers left running by tests: {names}")
    pid_file = os.environ.get("INGEST_TESTING_PID_FILE")
    if pid_file:
        from ingest.embedded.managed import STARTED_PIDS

        with open(pid_file, "w") as out:
            out.write("\n".join(str(pid) for pid in STARTED_PIDS))
