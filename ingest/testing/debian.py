"""One program out of a Debian package, fetched once into the project's cache; no install.

``debian_tool("prometheus", "promtool")`` gives the path of ``promtool`` from Debian's
``prometheus`` package: on first use ``apt-get download`` fetches the ``.deb`` into a
temporary folder, ``dpkg-deb -x`` unpacks it there, and only the program is kept, as
``$XDG_CACHE_HOME/ingest/debian/<package>/<binary>`` (``~/.cache``), beside a
``source.txt`` naming the ``.deb`` it came from. Nothing is installed system-wide and no
root is needed. A warm call runs ``<binary> --version`` and asks apt nothing.

apt-get reads the machine's package lists first. A machine that has none yet (a fresh
container) or whose lists no longer name a downloadable version gets lists of its own,
``apt-get update`` into ``<cache>/debian/apt/`` (about 14 MB for bookworm, a few seconds),
never the system's ``/var/lib/apt``. Concurrent callers wait on a lock instead of fetching
twice.

Everything that stops it (no ``apt-get`` or ``dpkg-deb`` on ``PATH``, a download that
fails, a package without that program, a program that does not run here) raises
``DependencyError`` with the reason, which a test can skip with::

    try:
        promtool = debian_tool("prometheus", "promtool")
    except DependencyError as exc:
        pytest.skip(str(exc))
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ingest.errors import DependencyError
from ingest.jars import cache_root, locked

__all__ = ["debian_cache", "debian_tool"]

TIMEOUT_S = 300.0
_TAIL = 2000


def debian_cache() -> Path:
    """Where the programs (and apt's own lists, when the machine's do not serve) are kept."""
    return cache_root() / "debian"


def _run(argv: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise DependencyError(f"{' '.join(argv)} took over {timeout:.0f}s") from exc


def _works(binary: Path) -> str | None:
    """``binary --version``'s first line, or None when it does not run here."""
    if not binary.is_file():
        return None
    try:
        result = subprocess.run(
            [str(binary), "--version"], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    lines = (result.stdout + result.stderr).strip().splitlines()
    return lines[0] if lines else ""


def _private_apt_options() -> list[str]:
    root = debian_cache() / "apt"
    for folder in (root / "lists" / "partial", root / "cache" / "archives" / "partial"):
        folder.mkdir(parents=True, exist_ok=True)
    return [
        "-o",
        f"Dir::State::Lists={root / 'lists'}",
        "-o",
        f"Dir::Cache={root / 'cache'}",
        "-o",
        f"Dir::Cache::Archives={root / 'cache' / 'archives'}",
        "-o",
        "Debug::NoLocking=1",  # the private lists need no system lock (and no root)
    ]


def _download(apt_get: str, package: str, work: Path, timeout: float) -> Path:
    """The package's ``.deb`` in ``work``: with the machine's lists, else with lists of our
    own, updated first."""
    tried: list[str] = []
    for private in (False, True):
        options = _private_apt_options() if private else []
        if private:
            update = _run([apt_get, "-q", *options, "update"], work, timeout)
            if update.returncode != 0:
                tried.append(
                    f"apt-get update (lists in {debian_cache() / 'apt'}) exited "
                    f"{update.returncode}: {(update.stdout + update.stderr)[-_TAIL:].strip()}"
                )
                break
        result = _run([apt_get, "-q", *options, "download", package], work, timeout)
        debs = sorted(work.glob(f"{package}_*.deb"))
        if result.returncode == 0 and debs:
            return debs[-1]
        where = "its own lists" if private else "the machine's lists"
        tried.append(
            f"apt-get download {package} with {where} exited {result.returncode}: "
            f"{(result.stdout + result.stderr)[-_TAIL:].strip()}"
        )
    raise DependencyError(f"could not download Debian's {package!r}: " + "; ".join(tried))


def debian_tool(package: str, binary: str, *, timeout: float = TIMEOUT_S) -> Path:
    """The program ``binary`` (``usr/bin`` or ``usr/sbin``) of Debian's ``package``, fetched
    and unpacked into the cache on first use (see the module docstring). Raises
    ``DependencyError`` naming why it cannot be had."""
    home = debian_cache() / package
    tool = home / binary
    if _works(tool) is not None:
        return tool
    with locked(debian_cache() / f".{package}.lock"):
        if _works(tool) is not None:  # another process fetched it meanwhile
            return tool
        apt_get, dpkg_deb = shutil.which("apt-get"), shutil.which("dpkg-deb")
        if apt_get is None or dpkg_deb is None:
            missing = [n for n, p in (("apt-get", apt_get), ("dpkg-deb", dpkg_deb)) if p is None]
            raise DependencyError(
                f"{' and '.join(missing)} not on PATH: {binary} comes from Debian's "
                f"{package!r} package, fetched with apt-get download and dpkg-deb -x"
            )
        home.mkdir(parents=True, exist_ok=True)
        work = Path(tempfile.mkdtemp(prefix=f".{package}.", dir=home.parent))
        try:
            work.chmod(0o755)  # apt's download may run as its sandbox user, _apt
            deb = _download(apt_get, package, work, timeout)
            tree = work / "tree"
            unpacked = _run([dpkg_deb, "-x", str(deb), str(tree)], work, timeout)
            if unpacked.returncode != 0:
                raise DependencyError(
                    f"dpkg-deb -x {deb.name} exited {unpacked.returncode}: "
                    f"{(unpacked.stdout + unpacked.stderr)[-_TAIL:].strip()}"
                )
            found = [tree / d / binary for d in ("usr/bin", "usr/sbin", "bin", "sbin")]
            program = next((p for p in found if p.is_file()), None)
            if program is None:
                raise DependencyError(f"{deb.name} holds no usr/bin/{binary}")
            partial = home / f".{binary}.partial"
            shutil.copy2(program, partial)
            partial.chmod(0o755)
            version = _works(partial)
            if version is None:
                raise DependencyError(f"{binary} from {deb.name} does not run here (--version)")
            os.replace(partial, tool)
            (home / "source.txt").write_text(f"{deb.name}\n{version}\n")
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return tool
