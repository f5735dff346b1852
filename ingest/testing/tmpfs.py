"""Small real filesystems for tests and benchmarks: a size-limited tmpfs, mounted and
unmounted around a block, as a container's ``/dev/shm`` would be.

Mounting needs root (CAP_SYS_ADMIN); ``mount_refusal()`` says why not, so a test can
skip with the reason::

    from ingest.testing.tmpfs import mount_refusal, small_tmpfs

    with small_tmpfs(32 * 1024**2, base=tmp_path) as root:
        ...  # handoff.root = str(root)

``fill(path, leave)`` has another process (``fallocate``) take all but ``leave`` bytes of
the free space: a writer that is not ingest filling the filesystem.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

from ingest.errors import HarnessError

__all__ = ["fill", "mount_refusal", "small_tmpfs"]


def mount_refusal() -> str | None:
    """Why this process cannot mount a tmpfs (None: it can)."""
    if os.name != "posix" or not Path("/proc/mounts").exists():
        return "tmpfs mounts need Linux"
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root (CAP_SYS_ADMIN); run as root to test small filesystems"
    if any(shutil.which(tool) is None for tool in ("mount", "umount", "fallocate")):
        return "mount, umount and fallocate (util-linux) are not all installed"
    return None


@contextlib.contextmanager
def small_tmpfs(size_bytes: int, *, base: Path) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at a fresh directory under ``base``; unmounted
    (lazily, if still busy) and removed on exit. Raises HarnessError when it cannot."""
    reason = mount_refusal()
    if reason is not None:
        raise HarnessError(reason)
    mountpoint = base / f"tmpfs-{uuid.uuid4().hex[:8]}"
    mountpoint.mkdir(parents=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={int(size_bytes)},mode=0777", "tmpfs", mountpoint],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        mountpoint.rmdir()
        raise HarnessError(f"mount tmpfs at {mountpoint}: {done.stderr.strip()}")
    try:
        yield mountpoint
    finally:
        if subprocess.run(["umount", mountpoint], capture_output=True, check=False).returncode:
            subprocess.run(["umount", "-l", mountpoint], capture_output=True, check=False)
        with contextlib.suppress(OSError):
            mountpoint.rmdir()


def fill(path: Path, *, leave: int = 0) -> int:
    """Another process (``fallocate``) takes the filesystem's free space but ``leave``
    bytes, in the file ``path``; returns the bytes it took. Remove the file to give the
    space back."""
    stat = os.statvfs(path.parent)
    take = stat.f_bavail * stat.f_frsize - leave
    if take <= 0:
        return 0
    done = subprocess.run(
        ["fallocate", "-l", str(take), str(path)], capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        raise HarnessError(f"fallocate -l {take} {path}: {done.stderr.strip()}")
    return take
