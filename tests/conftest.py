import pytest

from tests.brokers import BROKERS, server_for

pytest_plugins = ["ingest.testing.pytest_plugin"]


@pytest.fixture(params=BROKERS)
def any_broker(request: pytest.FixtureRequest) -> object:
    """Apache Kafka, then Tansu: the test runs on each (see tests/brokers.py)."""
    return server_for(request)
