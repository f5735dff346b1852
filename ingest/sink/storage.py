"""A table's location as a pyarrow filesystem, from the URI and delta-rs storage options.

Spark tasks and the driver write and check data files with pyarrow, while
delta-rs commits them; both must see the same objects, so the pyarrow
filesystem is built from delta-rs's own (object_store) options:
``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
``AWS_SESSION_TOKEN``, ``AWS_REGION``, ``AWS_ALLOW_HTTP`` (any case).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from ingest.errors import SinkError

__all__ = ["TableLocation", "normalize_uri", "s3_filesystem_options"]


def normalize_uri(uri: str) -> str:
    """The one spelling of a table's URI: absolute local paths (``file:/x``, ``file:///x``
    and ``/x`` alike), no trailing slash, ``s3a://`` read as ``s3://``."""
    uri = uri.strip()
    if uri.startswith("file:") and not uri.startswith("file://"):
        uri = "file://" + uri.removeprefix("file:")  # Hadoop's spelling, file:/x
    if "://" not in uri:
        return os.path.abspath(uri)
    scheme, _, rest = uri.partition("://")
    scheme = scheme.lower()
    if scheme == "file":
        return os.path.abspath("/" + rest.lstrip("/"))
    if scheme == "s3a":
        scheme = "s3"
    return f"{scheme}://{rest.rstrip('/')}"


def s3_filesystem_options(options: Mapping[str, str]) -> dict[str, object]:
    """pyarrow ``S3FileSystem`` arguments from delta-rs (object_store) storage options:
    the endpoint, the keys and the region, whatever their case."""
    lowered = {key.lower(): value for key, value in options.items()}
    kwargs: dict[str, object] = {}
    endpoint = lowered.get("aws_endpoint_url") or lowered.get("aws_endpoint")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    for ours, theirs in (
        ("aws_access_key_id", "access_key"),
        ("aws_secret_access_key", "secret_key"),
        ("aws_session_token", "session_token"),
        ("aws_region", "region"),
    ):
        if lowered.get(ours):
            kwargs[theirs] = lowered[ours]
    return kwargs


def _s3_filesystem(options: Mapping[str, str]) -> pafs.S3FileSystem:
    return pafs.S3FileSystem(**s3_filesystem_options(options))


@dataclass(frozen=True)
class TableLocation:
    """Where one Delta table's files live (picklable: Spark tasks get it)."""

    uri: str
    storage_options: Mapping[str, str]

    @classmethod
    def of(cls, uri: str, storage_options: Mapping[str, str] | None = None) -> TableLocation:
        return cls(normalize_uri(uri), dict(storage_options or {}))

    @property
    def local(self) -> bool:
        return "://" not in self.uri

    def filesystem(self) -> tuple[pafs.FileSystem, str]:
        """(filesystem, root path inside it)."""
        if self.local:
            return pafs.LocalFileSystem(), self.uri
        scheme, _, rest = self.uri.partition("://")
        if scheme == "s3":
            return _s3_filesystem(self.storage_options), rest
        try:
            filesystem, path = pafs.FileSystem.from_uri(self.uri)
        except Exception as exc:
            raise SinkError(f"{self.uri}: no filesystem for this URI: {exc}") from exc
        return filesystem, path

    def delta_options(self) -> dict[str, str] | None:
        return dict(self.storage_options) or None

    def sizes(self, paths: Iterable[str]) -> dict[str, int | None]:
        """Size of each relative path, None for a missing one (one listing call)."""
        filesystem, root = self.filesystem()
        relative = list(paths)
        infos = filesystem.get_file_info([f"{root}/{path}" for path in relative])
        return {
            path: (info.size if info.type == pafs.FileType.File else None)
            for path, info in zip(relative, infos, strict=True)
        }

    def delete(self, paths: Iterable[str]) -> None:
        """Deletes relative paths; missing ones are fine."""
        filesystem, root = self.filesystem()
        for path in paths:
            try:
                filesystem.delete_file(f"{root}/{path}")
            except FileNotFoundError:
                pass
            except OSError as exc:
                info = filesystem.get_file_info(f"{root}/{path}")
                if info.type != pafs.FileType.NotFound:
                    raise SinkError(f"{self.uri}: cannot delete {path}: {exc}") from exc

    def delete_dir(self, path: str) -> None:
        filesystem, root = self.filesystem()
        with contextlib.suppress(OSError):
            filesystem.delete_dir(f"{root}/{path}")

    def __repr__(self) -> str:
        return f"TableLocation({self.uri!r})"
