"""A batch's record cap: an upsert table's batches stay at ``trigger.upsert_max_records``
whatever the backlog (issue 38: delta-rs's MERGE holds a batch's changes in memory)."""

from __future__ import annotations

import pytest

from ingest.config import TriggerSection
from ingest.sink.table_config import Router, TableConfig
from ingest.supervisor.engine.batcher import record_cap

pytestmark = pytest.mark.quick


def test_an_upsert_table_caps_a_batch_at_upsert_max_records() -> None:
    append = TableConfig(uri="/lake/a", group="g")
    upsert = TableConfig(uri="/lake/u", group="g", mode="upsert", merge_keys=("id",))
    trigger = TriggerSection(max_records=5_000_000, upsert_max_records=1_000_000)
    assert record_cap(trigger, Router(append)) == 5_000_000
    assert record_cap(trigger, Router(upsert)) == 1_000_000
    assert record_cap(trigger, Router(append, (("orders", upsert, None),))) == 1_000_000
    assert record_cap(TriggerSection(max_records=1000), Router(upsert)) == 1000  # the smaller
    assert record_cap(TriggerSection(max_records=0), Router(append)) == 1
