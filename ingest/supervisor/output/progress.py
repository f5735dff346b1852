"""Progress of a bounded run (``ingest replay``, ``ingest run --until-end``).

Given a console (a terminal: ``ingest.supervisor.output.terminal``), a ``rich`` bar:
``replay ━━━━━━━━━╸━━━━━━━━━━  412,000/1,000,000 records  95.3k/s  0:00:06``, log
records printed above it. Elsewhere (logs, pipes) a ``progress`` event is logged
every ``every`` seconds and at the end, in the log's format: ``event=progress
label=replay done=412000 total=1000000 percent=41.2 records_per_s=95300 eta_s=6``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, TaskID, TextColumn, TimeRemainingColumn
from rich.progress import Progress as Bar

from ingest.logs import event
from ingest.supervisor.output.terminal import Terminal

__all__ = ["Progress"]

log = logging.getLogger("ingest.supervisor.output.progress")


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
        console: Console | None = None,
        every: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.label = label
        self.console = console
        self.every = every
        self._clock = clock
        self._started = clock()
        self._shown_at = float("-inf")
        self._bar: Bar | None = None
        self._task = TaskID(0)
        self.done = 0
        self.total = 0
        self.lines = 0

    def update(self, done: int, total: int, *, final: bool = False) -> None:
        self.done, self.total = done, max(total, done)
        if not self.total and not final:
            return  # nothing known yet
        now = self._clock()
        if not final and now - self._shown_at < (0.2 if self.console else self.every):
            return
        self._shown_at = now
        self.lines += 1
        rate = self.done / max(now - self._started, 1e-9)
        if self.console is None:
            left = self.total - self.done
            event(
                log,
                "progress",
                label=self.label,
                done=self.done,
                total=self.total,
                percent=round(self.done / self.total * 100 if self.total else 100.0, 1),
                records_per_s=round(rate),
                eta_s=round(left / rate) if rate > 0 else None,
            )
            return
        if self._bar is None:
            self._bar = Bar(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn(
                    "{task.completed:,.0f}/{task.total:,.0f} records  {task.fields[rate]}/s"
                ),
                TimeRemainingColumn(),
                console=self.console,
                redirect_stdout=False,  # ingest.supervisor.output.terminal already does
                redirect_stderr=False,
            )
            # Its first frame shows the counts already (rich's default total is 100).
            self._task = self._bar.add_task(
                self.label, total=self.total, completed=self.done, rate=_rate(rate)
            )
            self._bar.start()
        self._bar.update(self._task, completed=self.done, total=self.total, rate=_rate(rate))
        if final:
            self.close()

    def close(self) -> None:
        """Stops the bar, left drawn as it was last (idempotent), once the log records
        written before it are printed above it."""
        if self._bar is not None:
            terminal = Terminal.active()
            if terminal is not None:
                terminal.drain()
            self._bar.refresh()
            self._bar.stop()
            self._bar = None
