import os
from collections.abc import Iterator

import pytest

from ingest.testing import KafkaCluster
from tests.brokers import BROKERS, server_for

pytest_plugins = ["ingest.testing.pytest_plugin"]

# As the `ingest` command sets for itself (ingest/cli.py): no spinning OpenBLAS threads in
# the processes the tests start (probes, peers, Spark's Python workers); none does linear
# algebra.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(params=BROKERS)
def any_broker(request: pytest.FixtureRequest) -> object:
    """Apache Kafka, then Tansu: the test runs on each (see tests/brokers.py)."""
    return server_for(request)


@pytest.fixture(scope="session")
def _restartable_kafka() -> Iterator[KafkaCluster]:
    server = KafkaCluster(1).start()
    yield server
    server.cleanup()


@pytest.fixture(scope="module")
def restartable_broker(_restartable_kafka: KafkaCluster) -> KafkaCluster:
    """One Apache Kafka node that tests may kill and restart (the session's ``broker`` is
    never restarted under the tests that share it): one JVM start for all of them, each on
    topics of its own. A node that a module left down is started again for the next."""
    if not _restartable_kafka.running():
        _restartable_kafka.restart(kill=True)
    return _restartable_kafka


# scripts/test --quick (`-m quick`): these folders and modules whole, less every test that
# uses a server (a fixture below, directly or through another): the pure layers, the
# codec and the config. Each feature family adds one end-to-end test of its own, marked
# `@pytest.mark.quick` where it is defined.
QUICK_PATHS = (
    "tests/protocol/",
    "tests/group/",
    "tests/client/",
    "tests/worker/",
    "tests/test_config.py",
    "tests/test_config_schema.py",
    "tests/test_ddl.py",
    "tests/test_error_tree.py",
    "tests/test_layers.py",
    "tests/test_structure.py",
    "tests/test_doc_paths.py",
)
SERVER_FIXTURES = frozenset(
    {
        "broker",
        "any_broker",
        "kafka_cluster",
        "restartable_broker",
        "tansu",
        "s3",
        "schema_registry",
        "spark",
        "spark_cluster",
        "host_network",
    }
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    root = config.rootpath
    for item in items:
        where = item.path.relative_to(root).as_posix()
        if where.startswith(QUICK_PATHS) and not SERVER_FIXTURES.intersection(
            getattr(item, "fixturenames", ())
        ):
            item.add_marker(pytest.mark.quick)
