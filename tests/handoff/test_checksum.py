"""A sealed local segment carries its CRC-32C (``SegmentSealed.checksum``), and a reader
checks its size and checksum before parsing it: a segment changed or cut after it was
sealed is a ``HandoffError`` naming it, never wrong rows and never a signal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ingest.engines.plan import ReadPlan, SegmentTask, read_task
from ingest.formats.decode import DecodeSpec
from ingest.handoff import HandoffConfig, HandoffError, HandoffStore, SegmentSealed, SegmentWriter
from ingest.handoff.store import read_segment
from ingest.protocol.recordbatch.records import crc32c
from ingest.sink.storage import TableLocation
from tests.handoff.test_store import records


def _sealed(root: Path) -> tuple[HandoffStore, SegmentSealed]:
    store = HandoffStore(HandoffConfig(mode="files", root=str(root))).open()
    writer = SegmentWriter(store.location, "events", 3)
    writer.append(records(0, 50, size=64))
    sealed = writer.seal(next_offset=50)
    assert sealed is not None
    return store, sealed


def _plan(sealed: SegmentSealed, tmp_path: Path) -> ReadPlan:
    nowhere = TableLocation.of(str(tmp_path / "table"))
    return ReadPlan(
        mode="records",
        token="t",
        tasks=(SegmentTask((sealed.uri,), "events", 3, None, None),),
        spec=DecodeSpec(),
        table=nowhere,
        dead=nowhere,
        checks={sealed.uri: (sealed.bytes, sealed.checksum)},
    )


def test_a_sealed_segment_carries_the_crc32c_of_its_bytes(tmp_path: Path) -> None:
    store, sealed = _sealed(tmp_path)
    with store:
        path = store.location.path_of(sealed.segment_id)
        assert sealed.checksum == crc32c(Path(path).read_bytes())
        assert sealed.bytes == os.path.getsize(path)
        rows, _ = read_task(_plan(sealed, tmp_path), 0)
        assert rows.num_rows == 50


@pytest.mark.parametrize("change", ["byte", "cut", "grown"])
def test_a_segment_changed_after_sealing_is_refused_before_parsing(
    tmp_path: Path, change: str
) -> None:
    store, sealed = _sealed(tmp_path)
    with store:
        path = Path(store.location.path_of(sealed.segment_id))
        data = bytearray(path.read_bytes())
        if change == "byte":
            at = data.index(bytes([7]) * 64)  # record 7's value
            data[at] ^= 0xFF
        elif change == "cut":
            del data[len(data) // 2 :]
        else:
            data += b"\0" * 8
        path.write_bytes(bytes(data))
        with pytest.raises(HandoffError, match=str(path)):
            read_task(_plan(sealed, tmp_path), 0)
        with pytest.raises(HandoffError, match="sealed"):
            read_segment(sealed.uri, expect=(sealed.bytes, sealed.checksum))


def test_a_segment_cut_under_its_reader_is_an_error_not_a_signal(tmp_path: Path) -> None:
    # Cut to a size the reader would map and read past: the check stops it first. Run in
    # a child process, so that a SIGBUS would show as a signal, not kill the suite.
    store, sealed = _sealed(tmp_path)
    with store:
        path = Path(store.location.path_of(sealed.segment_id))
        os.truncate(path, sealed.bytes - 100)
        code = (
            "import sys\n"
            "from ingest.handoff import HandoffError\n"
            "from ingest.handoff.store import read_segment\n"
            f"try:\n    read_segment({sealed.uri!r}, expect=({sealed.bytes}, {sealed.checksum}))"
            ".column('value').to_pylist()\n"
            "except HandoffError as exc:\n    print(exc); sys.exit(3)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 3, (done.returncode, done.stderr[-2000:])
        assert str(path) in done.stdout
