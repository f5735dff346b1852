"""A local handoff is this user's alone: another local user can neither read the records in
it, nor make a run write through a link, nor stop a run from starting by leaving a namespace
it cannot clean. (The suite runs as root, whose reads no mode stops; the modes, owners and
links are checked as they are on disk.)"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from ingest.handoff import HandoffConfig, HandoffError, HandoffStore, SegmentWriter
from tests.handoff.test_store import records

OTHER_UID = 65534  # nobody


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_directories_are_0700_and_files_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)  # the usual umask, which made 0755 directories and 0644 files
    try:
        with HandoffStore(HandoffConfig(mode="shm", root=str(tmp_path))) as store:
            writer = SegmentWriter(store.location, "events", 3, start_offset=10)
            writer.append(records(10, 20))
            sealed = writer.seal(next_offset=30)
            assert sealed is not None
            corrupt = writer.write_corrupt(
                first_offset=30, last_offset=31, raw=b"\x00" * 61, reason="bad crc", kind="crc"
            )
            namespace = Path(store.namespace)
            files = [p for p in namespace.rglob("*") if p.is_file()]
            dirs = [namespace, *(p for p in namespace.rglob("*") if p.is_dir())]
            assert Path(store.location.path_of(sealed.segment_id)) in files
            assert Path(store.location.path_of(corrupt.corrupt_id)) in files
            assert {p.name for p in files} >= {"_lock", "_owner.json"}
            assert {str(p): _mode(p) for p in dirs} == {str(p): 0o700 for p in dirs}
            assert {str(p): _mode(p) for p in files} == {str(p): 0o600 for p in files}
    finally:
        os.umask(old)


def test_a_namespace_another_user_made_is_refused_not_used(tmp_path: Path) -> None:
    planted = tmp_path / "ingest-r1"
    planted.mkdir(mode=0o777)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(HandoffError) as info:
        HandoffStore(HandoffConfig(mode="shm", root=str(tmp_path)), run_id="r1").open()
    assert "belongs to user id 65534" in str(info.value)
    assert list(planted.iterdir()) == []  # nothing of the run was written there


def test_a_link_in_place_of_the_namespace_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "root"
    root.mkdir()
    (root / "ingest-r1").symlink_to(elsewhere)
    with pytest.raises(HandoffError) as info:
        HandoffStore(HandoffConfig(mode="shm", root=str(root)), run_id="r1").open()
    assert "not a directory" in str(info.value)
    assert list(elsewhere.iterdir()) == []


def test_namespaces_that_cannot_be_cleaned_never_stop_a_run(tmp_path: Path) -> None:
    """Another user's namespace is theirs (left alone); one of ours whose ``_lock`` cannot be
    opened (here a directory stands in its place) is left with a warning. Both aborted the
    open before."""
    foreign = tmp_path / "ingest-foreign"
    (foreign / "_lock").mkdir(parents=True)
    (foreign / "_owner.json").write_text("{}")
    os.chown(foreign, OTHER_UID, OTHER_UID)
    broken = tmp_path / "ingest-broken"
    (broken / "_lock").mkdir(parents=True)
    (broken / "_owner.json").write_text("{}")

    with HandoffStore(HandoffConfig(mode="shm", root=str(tmp_path))) as store:
        assert store.opened
        assert store.clean_stale() == []
    assert foreign.exists() and broken.exists()


def test_a_files_root_that_does_not_exist_yet_is_made_private(tmp_path: Path) -> None:
    root = tmp_path / "not" / "yet"
    with HandoffStore(HandoffConfig(mode="files", root=str(root))) as store:
        assert Path(store.namespace).parent == root
        assert _mode(root) == 0o700 and _mode(Path(store.namespace)) == 0o700


@pytest.mark.parametrize("topic", ["..", ".", "../../escaped", "a/b", "x" * 250, ""])
def test_a_topic_name_kafka_refuses_never_becomes_a_path(tmp_path: Path, topic: str) -> None:
    # Another broker may hand out a name Apache Kafka refuses; the handoff never follows it.
    root = tmp_path / "root"
    with HandoffStore(HandoffConfig(mode="files", root=str(root))) as store:
        before = sorted(tmp_path.rglob("*"))
        with pytest.raises(HandoffError, match="cannot name a handoff directory"):
            SegmentWriter(store.location, topic, 0)
        assert sorted(tmp_path.rglob("*")) == before
