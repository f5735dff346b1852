from collections.abc import Iterator

import pytest

from ingest.testing import KafkaCluster
from tests.brokers import BROKERS, server_for

pytest_plugins = ["ingest.testing.pytest_plugin"]


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
