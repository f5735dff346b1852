"""WorkerSettings refuse what no worker could run with, naming the setting."""

from __future__ import annotations

from typing import Any

import pytest

from ingest.client import ClientConfig
from ingest.errors import ConfigError
from ingest.handoff import HandoffConfig, HandoffStore
from ingest.worker import StartPosition, WorkerSettings


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"partition": -1}, "partition"),
        ({"max_unacked_bytes": 10, "resume_unacked_bytes": 20}, "resume_unacked_bytes"),
        ({"log_format": "xml"}, "log_format"),
    ],
)
def test_bad_settings_are_refused_by_name(changes: dict[str, Any], key: str) -> None:
    with HandoffStore(HandoffConfig()) as store, pytest.raises(ConfigError) as raised:
        WorkerSettings(
            client=ClientConfig(bootstrap_servers="127.0.0.1:9092"),
            topic="t",
            partition=changes.pop("partition", 0),
            handoff=store.location,
            start=StartPosition.earliest(),
            **changes,
        )
    assert raised.value.key == key
