"""No secret on a command line: the S3 keys of a table (conf/s3.toml's shape: storage options
from the environment) reach Spark's S3A once the JVM runs, never as ``--conf`` on its
command line, where any local user reads them in ``/proc/PID/cmdline``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from ingest.testing import S3Server
from ingest.testing.faults import process_tree

pytestmark = pytest.mark.spark

# A session started the way `ingest run` starts one (SparkEngine), with the table's storage
# options; it writes and reads a Delta table on S3 through S3A, so the keys did reach it.
CHILD = """
import json, sys
from ingest.config import SparkSection
from ingest.engines.spark.spark_session import SparkEngine

options, uri = json.loads(sys.stdin.readline())
engine = SparkEngine(SparkSection(master="local[1]", class_data_sharing=False),
                     storage_options=options)
session = engine.get()
session.range(5).write.format("delta").save(uri)
print(session.read.format("delta").load(uri).count(), flush=True)
sys.stdin.readline()  # the parent reads /proc meanwhile
engine.stop()
"""


@pytest.fixture(scope="module")
def private_s3() -> Iterator[S3Server]:
    server = S3Server(secret_key=f"ingest-secret-{uuid.uuid4().hex}").start()
    yield server
    server.cleanup()


def _holders(root: int, secret: bytes) -> list[str]:
    found = []
    for process in process_tree(root):
        for part in ("cmdline", "environ"):
            try:
                text = Path(f"/proc/{process.pid}/{part}").read_bytes()
            except OSError:
                continue
            if secret in text:
                found.append(f"{process.pid} {process.kind} {part}: {process.cmdline[:120]}")
    return found


def test_the_s3_secret_is_on_no_command_line_and_in_no_environment(
    private_s3: S3Server,
) -> None:
    secret = private_s3.secret_key.encode()
    uri = f"s3a://{private_s3.bucket}/{uuid.uuid4().hex}/events"
    env = {k: v for k, v in os.environ.items() if "AWS" not in k}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        child.stdin.write(json.dumps([private_s3.storage_options(), uri]) + "\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "5"  # the keys reached S3A
        tree = process_tree(child.pid)
        assert any(p.kind == "jvm" for p in tree), tree
        assert _holders(child.pid, secret) == []
    finally:
        child.stdin.write("\n")
        child.stdin.close()
        child.wait(60)
