"""Exponential backoff with jitter: a small pure class, clock and randomness injected."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

__all__ = ["Backoff"]


class Backoff:
    """Delays that double per consecutive failure up to ``maximum``, with jitter.

    The n-th consecutive failure waits ``min(initial * multiplier**(n-1), maximum)``
    scaled by a factor drawn uniformly from ``[1 - jitter, 1 + jitter]``, so that
    clients that failed together do not retry together. ``rand`` returns a float
    in [0, 1) and ``clock`` a monotonic time in seconds; tests inject both.
    """

    def __init__(
        self,
        initial: float,
        maximum: float,
        *,
        multiplier: float = 2.0,
        jitter: float = 0.2,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        if initial <= 0 or maximum < initial:
            raise ValueError(f"backoff needs 0 < initial <= maximum, got {initial}, {maximum}")
        if multiplier < 1:
            raise ValueError(f"backoff multiplier must be >= 1, got {multiplier}")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {jitter}")
        self.initial = initial
        self.maximum = maximum
        self.multiplier = multiplier
        self.jitter = jitter
        self._clock = clock
        self._rand = rand
        self.failures = 0
        self._not_before = float("-inf")

    def delay(self, failures: int) -> float:
        """The delay after ``failures`` consecutive failures (0 for none)."""
        if failures <= 0:
            return 0.0
        # Cap the exponent first so huge failure counts cannot overflow.
        exponent = min(failures - 1, 64)
        base = min(self.initial * self.multiplier**exponent, self.maximum)
        return base * (1.0 - self.jitter + 2.0 * self.jitter * self._rand())

    def failed(self) -> float:
        """Records a failure now; returns the delay before the next attempt."""
        self.failures += 1
        wait = self.delay(self.failures)
        self._not_before = self._clock() + wait
        return wait

    def succeeded(self) -> None:
        self.failures = 0
        self._not_before = float("-inf")

    def remaining(self) -> float:
        """Seconds until the next attempt is allowed (0 when it is allowed now)."""
        return max(0.0, self._not_before - self._clock())

    def __repr__(self) -> str:
        return (
            f"Backoff(initial={self.initial}, maximum={self.maximum}, "
            f"failures={self.failures}, remaining={self.remaining():.3f})"
        )
