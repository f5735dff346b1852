"""Progress of a bounded run: a bar on a terminal, log events elsewhere.

On a TTY one line is redrawn (``\\r``) at most a few times a second:
``[#########...........]  412,000/1,000,000 records  95.3k/s  ETA 0:06``.
Elsewhere (logs, pipes) a ``progress`` event is logged every ``every`` seconds
and at the end, in the log's format: ``event=progress label=replay done=412000
total=1000000 percent=41.2 records_per_s=95300 eta_s=6``.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TextIO

from ingest.logs import event

__all__ = ["Progress"]

log = logging.getLogger("ingest.supervisor.progress")

_BAR = 30
_TTY_EVERY = 0.2


def _duration(seconds: float) -> str:
    total = round(seconds)
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def _rate(value: float) -> str:
    for unit, factor in (("M", 1e6), ("k", 1e3)):
        if value >= factor:
            return f"{value / factor:.1f}{unit}"
    return f"{value:.0f}"


class Progress:
    """Reports ``done`` of ``total`` records (the total may grow as ends become known)."""

    def __init__(
        self,
        label: str = "progress",
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.every = every
        self._clock = clock
        self._started = clock()
        self._shown_at = float("-inf")
        self.done = 0
        self.total = 0
        self.lines = 0

    def update(self, done: int, total: int, *, final: bool = False) -> None:
        self.done, self.total = done, max(total, done)
        if not self.total and not final:
            return  # nothing known yet
        now = self._clock()
        if not final and now - self._shown_at < (_TTY_EVERY if self.tty else self.every):
            return
        self._shown_at = now
        self.lines += 1
        if not self.tty:
            fraction, rate, eta = self._numbers(now)
            event(
                log,
                "progress",
                label=self.label,
                done=self.done,
                total=self.total,
                percent=round(fraction * 100, 1),
                records_per_s=round(rate),
                eta_s=None if eta is None else round(eta),
            )
            return
        self.stream.write(self.render(now))
        if final:
            self.stream.write("\n")
        self.stream.flush()

    def _numbers(self, now: float) -> tuple[float, float, float | None]:
        elapsed = max(now - self._started, 1e-9)
        rate = self.done / elapsed
        left = self.total - self.done
        eta = left / rate if rate > 0 else None
        fraction = self.done / self.total if self.total else 1.0
        return fraction, rate, eta

    def render(self, now: float | None = None) -> str:
        fraction, rate, eta = self._numbers(self._clock() if now is None else now)
        filled = round(fraction * _BAR)
        bar = "#" * filled + "." * (_BAR - filled)
        shown_eta = "--:--" if eta is None else _duration(eta)
        return (
            f"\r{self.label} [{bar}] {self.done:,}/{self.total:,} records  "
            f"{_rate(rate)}/s  ETA {shown_eta}"
        )
