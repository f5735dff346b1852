"""The supervisor's global cap on unreleased segment bytes, across all workers.

Each worker caps its own unreleased bytes; this caps their sum, so N workers
cannot hold N x the per-worker cap between two Spark batches. Pure policy: the
caller reports sealed and released bytes per worker and applies the decisions
(pause or resume every worker) it gets back.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from enum import Enum

from ingest.errors import ConfigError


class CapDecision(Enum):
    PAUSE_ALL = "pause_all"
    RESUME_ALL = "resume_all"


@dataclass
class GlobalBufferCap:
    """Pauses every worker at ``max_bytes`` held, resumes them below ``resume_bytes``."""

    max_bytes: int
    resume_bytes: int
    _held: dict[Hashable, int] = field(default_factory=dict, init=False)
    _paused: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not 0 <= self.resume_bytes < self.max_bytes:
            raise ConfigError(
                f"expected 0 <= resume_bytes ({self.resume_bytes}) < max_bytes ({self.max_bytes})",
                key="backpressure",
            )

    @property
    def held_bytes(self) -> int:
        return sum(self._held.values())

    @property
    def paused(self) -> bool:
        return self._paused

    def sealed(self, worker: Hashable, nbytes: int) -> CapDecision | None:
        self._held[worker] = self._held.get(worker, 0) + nbytes
        return self._decide()

    def released(self, worker: Hashable, nbytes: int) -> CapDecision | None:
        held = self._held.get(worker, 0)
        if nbytes > held:
            raise ValueError(f"worker {worker!r} released {nbytes} bytes but holds {held}")
        self._held[worker] = held - nbytes
        return self._decide()

    def forget(self, worker: Hashable) -> CapDecision | None:
        """A worker is gone and its segments abandoned (revoked, or lost membership)."""
        self._held.pop(worker, None)
        return self._decide()

    def resize(self, max_bytes: int, resume_bytes: int) -> CapDecision | None:
        """New bounds (the handoff's space plan changed); pauses or resumes at once if the
        bytes held now call for it."""
        if not 0 <= resume_bytes < max_bytes:
            raise ConfigError(
                f"expected 0 <= resume_bytes ({resume_bytes}) < max_bytes ({max_bytes})",
                key="backpressure",
            )
        self.max_bytes, self.resume_bytes = max_bytes, resume_bytes
        return self._decide()

    def _decide(self) -> CapDecision | None:
        held = self.held_bytes
        if not self._paused and held >= self.max_bytes:
            self._paused = True
            return CapDecision.PAUSE_ALL
        if self._paused and held < self.resume_bytes:
            self._paused = False
            return CapDecision.RESUME_ALL
        return None
