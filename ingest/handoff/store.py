"""Where segments live: a per-run namespace in shared memory, a directory or an object store.

Layout: ``<root>/ingest-<run_id>/<topic>/<partition>/<name>`` where ``name`` is
``<first offset>-<token>.arrows`` for a segment and ``corrupt-<first offset>-<token>.bin``
for a corrupt batch's raw bytes. A segment or corrupt id is that path relative
to the namespace without its suffix, so ``release(ids)`` needs no lookup table.

Modes:

* ``shm``: the namespace is a directory under ``/dev/shm`` (tmpfs). Segments are
  written with ``write()`` (not mapped, so they do not count in a worker's RSS)
  and the reader memory-maps them: the Arrow buffers point into the page cache,
  no copy.
* ``files``: a local directory or an object-store URI (``s3://bucket/prefix``
  with ``storage_options`` for ``pyarrow.fs.S3FileSystem``, or any URI
  ``pyarrow.fs.FileSystem.from_uri`` knows), so that Spark executors on other
  machines can read them.

Atomic publication. On local filesystems a segment is written under a hidden
temporary name (``.<name>.tmp``) and renamed on seal; readers never list
dot-files. On object stores a rename is a copy, and an upload is invisible
until it completes anyway, so a segment is written straight to its final key.

Ownership and cleanup. The parent opens the namespace, records its owner
(host, pid, process start time) in ``_owner.json`` and, on local filesystems,
holds an ``flock`` on ``_lock`` for as long as it lives. At open, other
``ingest-*`` namespaces under the same root whose owner is gone are removed:
locally, those whose lock can be taken (the kernel drops an flock when its
holder dies, whatever the pid is reused for); on object stores, those written
on this host by a process that no longer exists. Only directories carrying an
``_owner.json`` are ever touched. A segment is deleted only when ``release``
names it: the supervisor calls it once the segment is durable downstream.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import shutil
import socket
import stat
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.ipc as ipc

from ingest.errors import ConfigError, IngestError
from ingest.handoff.location import (
    CORRUPT_SUFFIX,
    PRIVATE_DIR_MODE,
    PRIVATE_FILE_MODE,
    SEGMENT_SUFFIX,
    HandoffConfig,
    HandoffLocation,
    create_private_file,
    make_private_dir,
    split_root,
)
from ingest.protocol.recordbatch.records import crc32c

__all__ = [
    "CORRUPT_SUFFIX",
    "NAMESPACE_PREFIX",
    "SEGMENT_SUFFIX",
    "HandoffError",
    "HandoffFull",
    "HandoffSpaceExhausted",
    "HandoffStore",
    "file_checksum",
    "read_segment",
]

log = logging.getLogger("ingest.handoff")


NAMESPACE_PREFIX = "ingest-"
OWNER_FILE = "_owner.json"
LOCK_FILE = "_lock"
TMP_SUFFIX = ".tmp"
# A namespace without an owner file yet may be being created right now.
_UNOWNED_GRACE_SECONDS = 60.0


class HandoffError(IngestError):
    """A segment could not be written, published, read or released."""


class HandoffFull(HandoffError):
    """The handoff's filesystem is full (ENOSPC or a quota): the write was undone, and
    what was written before it is published. A reason to wait, not to fail."""


class HandoffSpaceExhausted(HandoffError):
    """The handoff stayed full for ``handoff.full_timeout`` although everything this
    run held was landed and released: another writer holds the space."""


def is_full(exc: OSError) -> bool:
    """Whether an OSError says the filesystem is out of space."""
    return exc.errno in (errno.ENOSPC, errno.EDQUOT)


def _check_id(item_id: str) -> None:
    parts = item_id.split("/")
    if len(parts) != 3 or any(part in ("", ".", "..") for part in parts):
        raise HandoffError(f"{item_id!r} is not a segment or corrupt-range id")


def file_checksum(path: str) -> int:
    """CRC-32C of a local file's bytes (Kafka's checksum, in hardware: about 4x zlib's
    CRC-32 here), read through a memory map."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return 0
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
            return crc32c(memoryview(mapped))


def read_segment(
    uri: str,
    *,
    storage_options: Mapping[str, Any] | None = None,
    memory_map: bool = True,
    expect: tuple[int, int | None] | None = None,
) -> pa.Table:
    """The records of one sealed segment. Local segments are memory-mapped (no copy):
    the table's buffers point into the file's pages for as long as the table lives.

    ``expect`` is the segment's (size, checksum) from its ``SegmentSealed``: a local file
    of another size or checksum is refused before it is parsed, with a ``HandoffError``
    naming it (a changed file read through a map could kill the reader with SIGBUS).
    """
    if "://" not in uri or uri.startswith("file://"):
        path = uri.removeprefix("file://")
        if expect is not None:
            _check_segment(path, *expect)
        source: pa.NativeFile = pa.memory_map(path, "r") if memory_map else pa.OSFile(path, "rb")
        try:
            with source:
                return ipc.open_stream(source).read_all()
        except pa.ArrowInvalid as exc:
            raise HandoffError(f"segment {path} cannot be read: {exc}") from exc
    filesystem, path, _ = split_root(uri, storage_options or {})
    assert filesystem is not None
    with filesystem.open_input_stream(path) as stream:
        return ipc.open_stream(stream).read_all()


def _check_segment(path: str, size: int, checksum: int | None) -> None:
    try:
        actual = os.stat(path).st_size
        if actual != size:
            raise HandoffError(f"segment {path} is {actual} bytes; it was sealed at {size}")
        if checksum is not None and (found := file_checksum(path)) != checksum:
            raise HandoffError(
                f"segment {path} was changed after it was sealed: CRC-32C {found:#010x}, "
                f"sealed as {checksum:#010x}"
            )
    except OSError as exc:
        raise HandoffError(f"cannot read segment {path}: {exc}") from exc


# -- ownership --------------------------------------------------------------------------


def _process_start_ticks(pid: int) -> int | None:
    """The start time of ``pid`` in clock ticks since boot (None if it does not exist)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name is in parentheses and may hold spaces: split after the last ')'.
    fields = text[text.rfind(b")") + 2 :].split()
    return int(fields[19])


def _owner_alive(owner: Mapping[str, Any]) -> bool:
    pid = owner.get("pid")
    if not isinstance(pid, int):
        return False
    ticks = _process_start_ticks(pid)
    if ticks is None:
        return False
    # A reused pid is a different process: its start time differs.
    return owner.get("start_ticks") in (None, ticks)


def _owner_record(run_id: str) -> dict[str, Any]:
    pid = os.getpid()
    return {
        "run_id": run_id,
        "host": socket.gethostname(),
        "pid": pid,
        "start_ticks": _process_start_ticks(pid),
        "created": time.time(),
    }


class HandoffStore:
    """The parent's side of the handoff: opens the run namespace, releases, reads, cleans up.

    ``with HandoffStore(config) as store:`` opens the namespace (removing the
    ones dead runs left behind) and removes it on exit. Workers get
    ``store.location`` and write through ``SegmentWriter``.
    """

    def __init__(self, config: HandoffConfig, *, run_id: str | None = None) -> None:
        self.config = config
        self.run_id = run_id or uuid.uuid4().hex[:12]
        if not self.run_id.replace("-", "").replace("_", "").isalnum():
            raise ConfigError(f"{self.run_id!r}: use letters, digits, - and _", key="run_id")
        filesystem, root_path, uri_prefix = split_root(config.resolved_root, config.storage_options)
        self._fs = filesystem
        self.root = root_path
        self.location = HandoffLocation(
            config=config,
            run_id=self.run_id,
            namespace=f"{root_path}/{NAMESPACE_PREFIX}{self.run_id}",
            uri_prefix=uri_prefix,
        )
        self._lock_fd: int | None = None
        self.opened = False

    def __repr__(self) -> str:
        return f"HandoffStore({self.location.uri_of(self.location.namespace)!r}, {self.config!r})"

    @property
    def namespace(self) -> str:
        return self.location.namespace

    # -- lifecycle ----------------------------------------------------------------------

    def open(self) -> HandoffStore:
        """Creates the namespace, takes ownership of it and removes stale ones."""
        if self.opened:
            return self
        try:
            return self._open()
        except OSError as exc:
            # E.g. a read-only or full root: say which setting to fix, not a traceback.
            self.close(remove=False)
            raise HandoffError(
                f"cannot open the handoff namespace under {self.location.uri_of(self.root)} "
                f"(handoff.root): {exc}"
            ) from exc

    def _open(self) -> HandoffStore:
        removed = self.clean_stale()
        if removed:
            log.info(
                "handoff: removed %d namespace(s) left by dead runs: %s", len(removed), removed
            )
        owner = json.dumps(_owner_record(self.run_id)).encode()
        if self._fs is None:
            if self.config.mode == "shm" and not os.path.isdir(self.root):
                raise ConfigError(f"{self.root} is not a directory", key="handoff.root")
            os.makedirs(self.root, mode=PRIVATE_DIR_MODE, exist_ok=True)  # files mode: made
            make_private_dir(self.namespace)
            fd = os.open(
                f"{self.namespace}/{LOCK_FILE}",
                os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC,
                PRIVATE_FILE_MODE,
            )
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise HandoffError(f"{self.namespace} is owned by another live run") from None
            self._lock_fd = fd
            _write_local_atomically(f"{self.namespace}/{OWNER_FILE}", owner)
        else:
            self._fs.create_dir(self.namespace, recursive=True)
            with self._fs.open_output_stream(f"{self.namespace}/{OWNER_FILE}") as out:
                out.write(owner)
        self.opened = True
        log.info("handoff: namespace %s", self.location.uri_of(self.namespace))
        return self

    def close(self, *, remove: bool = True) -> None:
        """Gives up the namespace; ``remove`` deletes it with whatever it still holds."""
        if remove and self.opened:
            if self._fs is None:
                shutil.rmtree(self.namespace, ignore_errors=True)
            else:
                with contextlib.suppress(OSError, FileNotFoundError):
                    self._fs.delete_dir(self.namespace)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
        self.opened = False

    def __enter__(self) -> HandoffStore:
        return self.open()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def clean_stale(self) -> list[str]:
        """Removes other runs' namespaces under the root whose owner is gone."""
        removed: list[str] = []
        for name in self._namespaces():
            if name == f"{NAMESPACE_PREFIX}{self.run_id}":
                continue
            path = f"{self.root}/{name}"
            try:
                if self._fs is None:
                    if _remove_if_stale_local(path):
                        removed.append(path)
                elif self._remove_if_stale_remote(path):
                    removed.append(self.location.uri_of(path))
            except OSError as exc:  # cleanup is a courtesy: it never stops a run
                log.warning("handoff: left %s in place, it could not be cleaned: %s", path, exc)
        return removed

    def _namespaces(self) -> list[str]:
        if self._fs is None:
            try:
                names = sorted(n for n in os.listdir(self.root) if n.startswith(NAMESPACE_PREFIX))
            except FileNotFoundError:
                return []
            return [n for n in names if _owned_by_us(f"{self.root}/{n}")]
        selector = pafs.FileSelector(self.root, allow_not_found=True)
        return sorted(
            info.base_name
            for info in self._fs.get_file_info(selector)
            if info.type == pafs.FileType.Directory and info.base_name.startswith(NAMESPACE_PREFIX)
        )

    def _remove_if_stale_remote(self, path: str) -> bool:
        assert self._fs is not None
        try:
            with self._fs.open_input_stream(f"{path}/{OWNER_FILE}") as stream:
                owner = json.loads(stream.read())
        except (OSError, ValueError):
            return False  # not ours, or still being created
        if owner.get("host") != socket.gethostname() or _owner_alive(owner):
            return False  # another host's runs cannot be judged from here
        self._fs.delete_dir(path)
        return True

    # -- segments ---------------------------------------------------------------------

    def release(self, item_ids: Iterable[str]) -> int:
        """Deletes the named segments and corrupt side files; returns how many existed.

        Called once their content is durable downstream; releasing twice is harmless.
        """
        deleted = 0
        for item_id in item_ids:
            _check_id(item_id)
            path = self.location.path_of(item_id)
            try:
                if self._fs is None:
                    os.unlink(path)
                else:
                    self._fs.delete_file(path)
                deleted += 1
            except FileNotFoundError:
                pass
            except OSError as exc:
                try:
                    gone = self._fs is not None and not _exists(self._fs, path)
                except OSError:  # the store does not answer at all
                    gone = False
                if not gone:
                    raise HandoffError(f"cannot release {item_id}: {exc}") from exc
        return deleted

    def read(self, uri: str, *, memory_map: bool = True) -> pa.Table:
        return read_segment(uri, storage_options=self.config.storage_options, memory_map=memory_map)

    def visible(self) -> list[str]:
        """Ids of every published segment and corrupt side file, sorted (no temporary files)."""
        return sorted(self._visible())

    def _visible(self) -> Iterator[str]:
        prefix = len(self.namespace) + 1
        if self._fs is None:
            for directory, _, files in os.walk(self.namespace):
                for name in files:
                    item = _item_name(name)
                    if item is not None:
                        yield f"{directory}/{item}"[prefix:]
            return
        selector = pafs.FileSelector(self.namespace, recursive=True, allow_not_found=True)
        for info in self._fs.get_file_info(selector):
            if info.type == pafs.FileType.File:
                item = _item_name(info.base_name)
                if item is not None:
                    yield f"{info.path.rpartition('/')[0]}/{item}"[prefix:]

    def temporary_files(self) -> list[str]:
        """Hidden files of segments being written (local namespaces only)."""
        if self._fs is not None:
            return []
        return sorted(
            os.path.join(directory, name)
            for directory, _, files in os.walk(self.namespace)
            for name in files
            if name.startswith(".") and name.endswith(TMP_SUFFIX)
        )

    def drop_unsealed(self, topic: str, partition: int) -> list[str]:
        """Deletes the partition's segments left half-written (local namespaces only: an
        object-store upload never completed is invisible), as a worker killed mid-segment
        leaves them; called while the partition has no worker. Returns their paths."""
        if self._fs is not None:
            return []
        directory = f"{self.namespace}/{topic}/{partition}"
        dropped = []
        with contextlib.suppress(FileNotFoundError):
            for name in os.listdir(directory):
                if name.startswith(".") and name.endswith(TMP_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(f"{directory}/{name}")
                    dropped.append(f"{directory}/{name}")
        return dropped


def _item_name(name: str) -> str | None:
    if name.startswith((".", "_")):
        return None
    for suffix in (SEGMENT_SUFFIX, CORRUPT_SUFFIX):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return None


def _exists(filesystem: pafs.FileSystem, path: str) -> bool:
    return bool(filesystem.get_file_info(path).type != pafs.FileType.NotFound)


def _owned_by_us(path: str) -> bool:
    """A namespace directory of this user's (another user's runs are theirs to clean)."""
    try:
        info = os.lstat(path)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.geteuid()


def _write_local_atomically(path: str, data: bytes) -> None:
    directory, _, name = path.rpartition("/")
    tmp = f"{directory}/.{name}{TMP_SUFFIX}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)  # a crashed writer's leftover
    with os.fdopen(create_private_file(tmp), "wb") as out:
        out.write(data)
    os.replace(tmp, path)


def _remove_if_stale_local(path: str) -> bool:
    owner_path = Path(path, OWNER_FILE)
    lock_path = Path(path, LOCK_FILE)
    if not owner_path.exists():
        # Not a namespace of ours, or one being created: leave it unless clearly abandoned.
        if not lock_path.exists():
            return False
        with contextlib.suppress(FileNotFoundError):
            if time.time() - lock_path.stat().st_mtime < _UNOWNED_GRACE_SECONDS:
                return False
    try:
        fd = os.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # its owner is alive
            raise
        shutil.rmtree(path, ignore_errors=True)
        return True
    finally:
        os.close(fd)
