"""Java artifacts from Maven Central, resolved once into a cache the whole project shares.

The resolver is the Apache Ivy jar that pyspark already ships (``pyspark/jars/ivy-*.jar``),
the same Ivy that Spark runs for ``spark.jars.packages``: nothing else is installed for it.
Every resolution uses one Ivy cache, ``$XDG_CACHE_HOME/ingest/ivy`` (``~/.cache``), so an
artifact fetched for one purpose (the test broker, Delta's jars) is never fetched again.

A resolved set is remembered as a classpath file keyed by its coordinates; a warm call reads
that file and checks the jars still exist, and starts no JVM. Concurrent callers (two test
sessions, a bench and a test) wait on a file lock instead of resolving twice.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import quoteattr

from ingest.errors import DependencyError

__all__ = ["Artifact", "cache_root", "ivy_cache", "ivy_jar", "locked", "resolve"]

RESOLVE_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class Artifact:
    """A Maven coordinate ``group:name:version``, or one file of a release that is not its
    jar, ``group:name:version:classifier@ext`` (``:classifier`` and ``@ext`` each optional;
    e.g. ``io.apicurio:apicurio-registry-app:3.3.3:all@tar.gz``). Such a file is resolved
    alone: its POM's dependencies are not."""

    group: str
    name: str
    version: str
    classifier: str | None = None
    ext: str | None = None

    @classmethod
    def parse(cls, text: str) -> Artifact:
        coordinate, at, ext = text.partition("@")
        parts = coordinate.split(":")
        if len(parts) not in (3, 4) or not all(parts) or (at and not ext):
            raise DependencyError(
                f"{text!r} is not a Maven coordinate group:artifact:version[:classifier][@ext]"
            )
        classifier = parts[3] if len(parts) == 4 else None
        return cls(parts[0], parts[1], parts[2], classifier, ext or None)

    @property
    def plain(self) -> bool:
        """A jar and its runtime dependencies (no classifier, no other file type)."""
        return self.classifier is None and self.ext is None

    def __str__(self) -> str:
        text = f"{self.group}:{self.name}:{self.version}"
        if self.classifier is not None:
            text += f":{self.classifier}"
        if self.ext is not None:
            text += f"@{self.ext}"
        return text


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ingest"


def ivy_cache() -> Path:
    """The one Ivy cache of the project (Spark's ``spark.jars.ivy`` points here too)."""
    return cache_root() / "ivy"


def ivy_jar() -> Path:
    """The Ivy jar inside the installed pyspark."""
    try:
        import pyspark
    except ImportError as exc:  # pragma: no cover - pyspark is a dependency
        raise DependencyError("resolving Java artifacts needs pyspark (it ships Ivy)") from exc
    found = sorted((Path(pyspark.__file__).parent / "jars").glob("ivy-*.jar"))
    if not found:
        raise DependencyError(f"no ivy-*.jar in {Path(pyspark.__file__).parent / 'jars'}")
    return found[-1]


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and (Path(home) / "bin" / "java").exists():
        return str(Path(home) / "bin" / "java")
    found = shutil.which("java")
    if found is None:
        raise DependencyError(
            "Java 17+ is needed (Debian: apt-get install openjdk-17-jre-headless)"
        )
    return found


def _ivy_module(artifacts: Sequence[Artifact]) -> str:
    plain = all(artifact.plain for artifact in artifacts)
    namespace = "" if plain else ' xmlns:m="http://ant.apache.org/ivy/maven"'
    lines = [
        f'<ivy-module version="2.0"{namespace}>',
        '  <info organisation="ingest" module="resolved"/>',
        "  <dependencies>",
    ]
    for artifact in artifacts:
        head = (
            f"    <dependency org={quoteattr(artifact.group)} name={quoteattr(artifact.name)}"
            f" rev={quoteattr(artifact.version)}"
        )
        if artifact.plain:
            lines.append(f'{head} conf="default->default"/>')
            continue
        ext = quoteattr(artifact.ext or "jar")
        classifier = (
            "" if artifact.classifier is None else f" m:classifier={quoteattr(artifact.classifier)}"
        )
        lines += [
            f'{head} transitive="false" conf="default->default">',
            f"      <artifact name={quoteattr(artifact.name)} type={ext} ext={ext}{classifier}/>",
            "    </dependency>",
        ]
    lines += ["  </dependencies>", "</ivy-module>", ""]
    return "\n".join(lines)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive flock on ``path`` (made if missing) for the block: concurrent processes
    (two test sessions) take turns instead of racing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read_classpath(path: Path) -> list[Path] | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    jars = [Path(entry) for entry in text.split(os.pathsep) if entry]
    if not jars or not all(jar.is_file() for jar in jars):
        return None
    return jars


def resolve(coordinates: Sequence[str], *, timeout: float = RESOLVE_TIMEOUT_S) -> list[Path]:
    """The jars of ``coordinates`` and their runtime dependencies, resolved from Maven
    Central into the shared Ivy cache on first use; the order is Ivy's (the classpath).
    A coordinate with a classifier or an extension gives that one file."""
    artifacts = [Artifact.parse(text) for text in coordinates]
    if not artifacts:
        raise DependencyError("nothing to resolve")
    key = hashlib.sha256("\n".join(sorted(map(str, artifacts))).encode()).hexdigest()[:16]
    work = cache_root() / "classpaths" / key
    classpath_file = work / "classpath.txt"
    cached = _read_classpath(classpath_file)
    if cached is not None:
        return cached
    with locked(work / ".lock"):
        cached = _read_classpath(classpath_file)  # another process may have finished it
        if cached is not None:
            return cached
        module = work / "ivy.xml"
        module.write_text(_ivy_module(artifacts))
        partial = work / "classpath.txt.partial"
        argv = [
            _java(),
            "-jar",
            str(ivy_jar()),
            "-ivy",
            str(module),
            "-confs",
            "default",
            "-cache",
            str(ivy_cache()),
            "-cachepath",
            str(partial),
        ]
        try:
            result = subprocess.run(
                argv, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise DependencyError(
                f"resolving {', '.join(map(str, artifacts))} took over {timeout:.0f}s"
            ) from exc
        jars = _read_classpath(partial) if result.returncode == 0 else None
        if jars is None:
            tail = (result.stdout + result.stderr)[-3000:]
            raise DependencyError(
                f"could not resolve {', '.join(map(str, artifacts))} from Maven Central "
                f"(Ivy exited {result.returncode}):\n{tail}"
            )
        (work / "coordinates.txt").write_text("\n".join(map(str, artifacts)) + "\n")
        partial.replace(classpath_file)
        return jars
