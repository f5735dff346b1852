"""Files mode on an object store (SeaweedFS): segments readable from anywhere by URI."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pyarrow.fs as pafs
import pytest

from ingest.embedded.seaweedfs import ACCESS_KEY, REGION, SECRET_KEY
from ingest.handoff import HandoffConfig, HandoffError, HandoffStore, SegmentWriter, read_segment
from ingest.testing import KafkaCluster, S3Server, create_topic, produce, read_topic, unique_name
from ingest.worker import EndPosition
from tests.handoff.test_store import records
from tests.worker.support import (
    assert_same_records,
    check_tiling,
    read_segments,
    run_to_end,
    sealed,
    varied_records,
    worker_settings,
)


def s3_config(s3: S3Server, prefix: str, **extra: Any) -> HandoffConfig:
    return HandoffConfig(
        mode="files",
        root=f"s3://{s3.bucket}/{prefix}",
        storage_options={
            "endpoint_override": f"{s3.host}:{s3.port}",
            "scheme": "http",
            "access_key": ACCESS_KEY,
            "secret_key": SECRET_KEY,
            "region": REGION,
        },
        **extra,
    )


@pytest.fixture
def s3_store(s3: S3Server) -> Iterator[HandoffStore]:
    with HandoffStore(s3_config(s3, unique_name("handoff"))) as store:
        yield store


def test_segments_are_published_whole_and_read_back_by_uri(
    s3: S3Server, s3_store: HandoffStore
) -> None:
    writer = SegmentWriter(s3_store.location, "events", 3, start_offset=0)
    first, second = records(0, 500), records(500, 300)
    writer.append(first)
    writer.append(second)
    assert s3_store.visible() == []  # an upload in progress is not an object yet
    segment = writer.seal(next_offset=800)
    assert segment is not None
    assert segment.uri.startswith(f"s3://{s3.bucket}/")
    assert s3_store.visible() == [segment.segment_id]
    # A reader elsewhere needs only the URI and the store's options.
    table = read_segment(segment.uri, storage_options=s3_store.config.storage_options)
    assert table.column("offset").to_pylist() == list(range(800))
    assert table.equals(s3_store.read(segment.uri))
    size = s3.filesystem().get_file_info(segment.uri.removeprefix("s3://")).size
    assert segment.bytes == size

    corrupt = writer.write_corrupt(
        first_offset=800, last_offset=809, raw=b"raw batch", reason="r", kind="crc"
    )
    with s3.filesystem().open_input_stream(corrupt.uri.removeprefix("s3://")) as stream:
        assert stream.read() == b"raw batch"
    assert s3_store.release([segment.segment_id, corrupt.corrupt_id]) == 2
    assert s3_store.visible() == []


@pytest.mark.parametrize("outage", ["down"])  # "blackhole" (SIGSTOP) too: 26 s of timeouts
def test_a_release_the_store_does_not_answer_is_a_handoff_error_then_works(outage: str) -> None:
    """Stopped (refused connections) or frozen (no answer: the client's timeouts), the store
    makes ``release`` raise ``HandoffError`` (which the supervisor puts off to the next
    release), never a bare ``OSError`` (it crashed the run, s3-outage seed 0); back, the
    release deletes. Without the fix, "down" failed with the bare ``OSError`` of the
    existence check; with it, "blackhole" passed too."""
    with S3Server() as own, HandoffStore(s3_config(own, unique_name("handoff"))) as store:
        writer = SegmentWriter(store.location, "events", 0, start_offset=0)
        writer.append(records(0, 100))
        segment = writer.seal(next_offset=100)
        assert segment is not None
        if outage == "down":
            own.stop()
        else:
            own.pause()
        try:
            with pytest.raises(HandoffError, match="cannot release"):
                store.release([segment.segment_id])
        finally:
            if outage == "down":
                own.start()
            else:
                own.resume()
        assert store.release([segment.segment_id]) == 1
        assert store.visible() == []


def test_an_aborted_segment_never_appears(s3_store: HandoffStore) -> None:
    writer = SegmentWriter(s3_store.location, "events", 0)
    writer.append(records(0, 100))
    writer.abort()
    assert s3_store.visible() == []


def test_a_dead_runs_namespace_on_this_host_is_removed(s3: S3Server) -> None:
    prefix = unique_name("handoff")
    filesystem = s3.filesystem()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    dead_pid = int(dead.stdout)
    for run_id, host, pid in (
        ("dead", socket.gethostname(), dead_pid),
        ("elsewhere", "other-host", dead_pid),
    ):
        base = f"{s3.bucket}/{prefix}/ingest-{run_id}"
        filesystem.create_dir(base)
        with filesystem.open_output_stream(f"{base}/_owner.json") as out:
            out.write(json.dumps({"run_id": run_id, "host": host, "pid": pid}).encode())
        with filesystem.open_output_stream(f"{base}/events/0/00000000000000000000-x.arrows") as out:
            out.write(b"left behind")
    with HandoffStore(s3_config(s3, prefix), run_id="next"):
        names = {
            info.base_name
            for info in filesystem.get_file_info(pafs.FileSelector(f"{s3.bucket}/{prefix}"))
        }
    # A run of another host cannot be judged from here, so it stays.
    assert names == {"ingest-elsewhere", "ingest-next"}


@pytest.mark.quick
def test_a_worker_process_writes_its_segments_to_the_object_store(
    broker: KafkaCluster, s3: S3Server, s3_store: HandoffStore, topic: str
) -> None:
    create_topic(broker.bootstrap, topic, partitions=1)
    produce(broker.bootstrap, topic, varied_records(30_000), compression="zstd")
    reference = read_topic(broker.bootstrap, topic)
    store = s3_store
    settings = worker_settings(broker.bootstrap, store, topic, end=EndPosition.latest())
    events, finished, _ = run_to_end(settings, store)
    segments = sealed(events)
    assert finished.next_offset == 30_000
    check_tiling(segments, 0, 30_000)
    assert all(s.uri.startswith(f"s3://{s3.bucket}/") for s in segments)
    assert store.visible() == sorted(s.segment_id for s in segments)
    assert_same_records(read_segments(store, segments), reference)
