"""Where a run's handoff is: ``HandoffConfig`` (the ``[handoff]`` settings: shared memory,
local files or an object store) and ``HandoffLocation`` (one namespace's root, its
filesystem, and the path of each item)."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import pyarrow.fs as pafs

from ingest.errors import ConfigError
from ingest.redaction import masked

__all__ = [
    "CORRUPT_PREFIX",
    "CORRUPT_SUFFIX",
    "DEFAULT_SHM_ROOT",
    "PRIVATE_DIR_MODE",
    "PRIVATE_FILE_MODE",
    "SEGMENT_SUFFIX",
    "HandoffConfig",
    "HandoffLocation",
    "HandoffMode",
    "IpcCompression",
    "create_private_file",
    "is_corrupt_id",
    "make_private_dir",
    "split_root",
]

HandoffMode = Literal["shm", "files"]
IpcCompression = Literal["lz4", "zstd"]
DEFAULT_SHM_ROOT = "/dev/shm"
SEGMENT_SUFFIX = ".arrows"
CORRUPT_SUFFIX = ".bin"
CORRUPT_PREFIX = "corrupt-"


@dataclass(frozen=True, kw_only=True)
class HandoffConfig:
    """How segments are handed from workers to the supervisor.

    ``root``: the directory holding run namespaces (default ``/dev/shm`` in shm
    mode), or an object-store URI in files mode. ``storage_options`` go to
    ``pyarrow.fs.S3FileSystem`` for ``s3://`` roots (endpoint_override, scheme,
    access_key, secret_key, region, ...); their values never appear in a repr.
    A segment is sealed at ``segment_max_bytes`` or ``segment_max_age`` seconds
    after its first record, whichever comes first.
    """

    mode: HandoffMode = "shm"
    root: str | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    segment_max_bytes: int = 64 * 1024 * 1024
    segment_max_age: float = 5.0
    ipc_compression: IpcCompression | None = None
    # How long a worker waits for a full handoff to free space before the run fails.
    full_timeout: float = 300.0

    def __post_init__(self) -> None:
        if self.mode not in ("shm", "files"):
            raise ConfigError(f"must be 'shm' or 'files', got {self.mode!r}", key="handoff.mode")
        if self.mode == "files" and not self.root:
            raise ConfigError("files mode needs a root directory or URI", key="handoff.root")
        if self.mode == "shm" and self.root is not None and "://" in self.root:
            raise ConfigError("shm mode needs a local tmpfs directory", key="handoff.root")
        if not isinstance(self.segment_max_bytes, int) or self.segment_max_bytes < 1:
            raise ConfigError("must be a positive int", key="handoff.segment_max_bytes")
        if not isinstance(self.segment_max_age, int | float) or self.segment_max_age <= 0:
            raise ConfigError("must be a positive number of seconds", key="handoff.segment_max_age")
        if not isinstance(self.full_timeout, int | float) or self.full_timeout <= 0:
            raise ConfigError("must be a positive number of seconds", key="handoff.full_timeout")
        if self.ipc_compression not in (None, "lz4", "zstd"):
            raise ConfigError("must be lz4, zstd or none", key="handoff.ipc_compression")
        object.__setattr__(self, "storage_options", dict(self.storage_options))

    @property
    def resolved_root(self) -> str:
        return self.root if self.root is not None else DEFAULT_SHM_ROOT

    def __repr__(self) -> str:
        options = masked(dict(self.storage_options))
        return (
            f"HandoffConfig(mode={self.mode!r}, root={self.resolved_root!r}, "
            f"storage_options={options!r}, segment_max_bytes={self.segment_max_bytes}, "
            f"segment_max_age={self.segment_max_age}, ipc_compression={self.ipc_compression!r})"
        )


# -- filesystems ----------------------------------------------------------------------


def split_root(root: str, options: Mapping[str, Any]) -> tuple[pafs.FileSystem | None, str, str]:
    """(filesystem or None for the local one, path inside it, URI prefix for that path)."""
    if "://" not in root:
        return None, os.path.abspath(root), ""
    scheme, _, rest = root.partition("://")
    if scheme == "file":
        return None, os.path.abspath("/" + rest.lstrip("/")), ""
    if scheme == "s3":
        return pafs.S3FileSystem(**options), rest.strip("/"), "s3://"
    filesystem, path = pafs.FileSystem.from_uri(root)
    return filesystem, path.rstrip("/"), f"{scheme}://"


@dataclass(frozen=True, kw_only=True)
class HandoffLocation:
    """One run's namespace: everything a worker process needs to write into it (picklable)."""

    config: HandoffConfig
    run_id: str
    namespace: str  # path inside the filesystem
    uri_prefix: str  # "" for local paths, else "s3://" etc.

    @property
    def local(self) -> bool:
        return self.uri_prefix == ""

    def filesystem(self) -> pafs.FileSystem | None:
        """The pyarrow filesystem, or None when segments are local files."""
        if self.local:
            return None
        return split_root(self.config.resolved_root, self.config.storage_options)[0]

    def path_of(self, item_id: str) -> str:
        suffix = CORRUPT_SUFFIX if is_corrupt_id(item_id) else SEGMENT_SUFFIX
        return f"{self.namespace}/{item_id}{suffix}"

    def uri_of(self, path: str) -> str:
        return f"{self.uri_prefix}{path}"


def is_corrupt_id(item_id: str) -> bool:
    return item_id.rpartition("/")[2].startswith(CORRUPT_PREFIX)


# Local handoff files are this user's alone: directories 0700, files 0600, created new
# (O_EXCL) and never through a link (O_NOFOLLOW), so another local user can neither read
# the records in them nor make a run write elsewhere.
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def make_private_dir(path: str) -> None:
    """``path`` as a directory of this user's, mode 0700 (made if missing); one that is
    a link, not a directory, or another user's is refused (``PermissionError``)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(path, PRIVATE_DIR_MODE)
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise PermissionError(f"{path} is not a directory (a link or a file stands there)")
    if info.st_uid != os.geteuid():
        raise PermissionError(f"{path} belongs to user id {info.st_uid}, not to this user")
    if stat.S_IMODE(info.st_mode) != PRIVATE_DIR_MODE:
        os.chmod(path, PRIVATE_DIR_MODE)


def create_private_file(path: str) -> int:
    """A new file at ``path``, mode 0600, opened for writing; an existing file or a link
    there is an error (``FileExistsError``, ``OSError``)."""
    return os.open(path, _CREATE, PRIVATE_FILE_MODE)
