"""kafka-delta-ingest as a peer of the end-to-end benchmark, given its binary.

The binary is built outside this repository from the upstream source (docs/benchmarks.md
says how); nothing of it is here. It does not create tables: the target is created first
with delta-rs, with the Kafka partition and offset (its ``kafka.partition`` and
``kafka.offset`` transforms) and the JSON value's fields. It runs with ``-e`` (stop at the
end offsets the run began with), JSON input without a registry, and batches as large as
ingest's (``--max_messages_per_batch``, ``--min_bytes_per_file``) so neither side is judged
by a small file size.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
from _pipeline import VALUE_SCHEMA, Measured, run_measured


def kdi_table_schema() -> pa.Schema:
    return pa.schema([("partition", pa.int32()), ("offset", pa.int64()), *VALUE_SCHEMA])


def run_kdi(
    binary: Path, bootstrap: str, topic: str, group: str, table: Path, log: Path
) -> Measured:
    from deltalake import write_deltalake

    write_deltalake(str(table), kdi_table_schema().empty_table())
    argv = [
        str(binary),
        "ingest",
        topic,
        str(table),
        *("--kafka", bootstrap, "--consumer_group", group, "--app_id", group),
        *("--auto_offset_reset", "earliest", "--ends_at_latest_offsets"),
        *("--transform", "partition: kafka.partition", "--transform", "offset: kafka.offset"),
        *("--allowed_latency", "10", "--max_messages_per_batch", "1000000"),
        *("--min_bytes_per_file", str(128 * 1024 * 1024)),
    ]
    return run_measured(argv, log=log, timeout=3600, env={**os.environ, "RUST_LOG": "info"})
