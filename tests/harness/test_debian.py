"""``debian_tool``: a program out of a Debian package, kept in the cache, never installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ingest.errors import DependencyError
from ingest.testing import debian_tool
from ingest.testing.debian import debian_cache


def test_promtool_is_unpacked_from_debians_prometheus_into_the_cache(
    promtool: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert promtool == debian_cache() / "prometheus" / "promtool"
    source = (promtool.parent / "source.txt").read_text().splitlines()
    assert source[0].startswith("prometheus_") and source[0].endswith(".deb"), source
    assert source[1].startswith("promtool, version "), source
    version = subprocess.run(
        [str(promtool), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert (version.stdout + version.stderr).startswith("promtool, version ")
    # Not installed: the machine's PATH has no promtool of it.
    assert shutil.which("promtool") in (None, str(promtool))
    # A warm call asks apt nothing: it works with neither apt-get nor dpkg-deb on PATH.
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    assert debian_tool("prometheus", "promtool") == promtool


def test_without_apt_get_the_reason_is_given(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing cached there
    empty = tmp_path / "bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(DependencyError) as info:
        debian_tool("prometheus", "promtool")
    assert str(info.value) == (
        "apt-get and dpkg-deb not on PATH: promtool comes from Debian's 'prometheus' package, "
        "fetched with apt-get download and dpkg-deb -x"
    )
    assert not (tmp_path / "cache" / "ingest" / "debian" / "prometheus" / "promtool").exists()
