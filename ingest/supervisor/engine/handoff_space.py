"""The handoff's space plan, kept true as partitions come and go.

At open the supervisor measures the handoff filesystem's free space (``handoff.space``)
and refuses a handoff that cannot hold one segment for even one partition. Each time a
worker is spawned or retired it plans again for the partitions then held: the global
cap is resized, new workers get the planned sizes in their settings, and live ones get a
``Limits`` control.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ingest.handoff import HandoffStore
from ingest.handoff.space import SpacePlan, Wanted, free_bytes, plan_space
from ingest.logs import event
from ingest.supervisor.engine.backpressure import CapDecision, GlobalBufferCap
from ingest.worker import Limits, WorkerHandle

__all__ = ["HandoffSpace"]

log = logging.getLogger("ingest.supervisor")


class HandoffSpace:
    """The current ``SpacePlan`` and its application to the cap and the workers."""

    def __init__(self, wanted: Wanted, store: HandoffStore, cap: GlobalBufferCap) -> None:
        self.wanted = wanted
        self.store = store
        self.cap = cap
        self.free: int | None = None
        self.plan = plan_space(wanted, None, 1, where="")

    @property
    def where(self) -> str:
        return self.store.config.resolved_root

    def measure(self) -> SpacePlan:
        """Measures the free space (once, at open) and plans for one partition; raises
        ``HandoffTooSmall`` when even that does not fit."""
        self.free = free_bytes(self.where)
        self.plan = plan_space(self.wanted, self.free, 1, where=self.where)
        event(
            log,
            "handoff_space",
            root=self.where,
            free_bytes=self.free if self.free is not None else "unbounded",
            budget_bytes=self.plan.budget_bytes if self.free is not None else "unbounded",
        )
        return self.plan

    def fit(
        self, partitions: int, live: Iterable[WorkerHandle]
    ) -> tuple[SpacePlan, CapDecision | None]:
        """Plans for ``partitions`` held partitions; when the sizes change, resizes the
        cap and tells the ``live`` workers. Returns the plan and the cap's decision."""
        plan = plan_space(self.wanted, self.free, partitions, where=self.where)
        if plan == self.plan:
            return plan, None
        previous, self.plan = self.plan, plan
        decision = self.cap.resize(plan.max_buffered_bytes, plan.resume_buffered_bytes)
        if self.free is not None and (
            plan.segment_max_bytes,
            plan.max_buffered_bytes,
        ) != (previous.segment_max_bytes, previous.max_buffered_bytes):
            event(
                log,
                "handoff_plan",
                partitions=partitions,
                free_bytes=self.free,
                segment_max_bytes=plan.segment_max_bytes,
                max_buffered_bytes=plan.max_buffered_bytes,
                max_unacked_bytes=plan.max_unacked_bytes,
            )
        limits = Limits(plan.segment_max_bytes, plan.max_unacked_bytes, plan.resume_unacked_bytes)
        for handle in live:
            handle.send(limits)
        return plan, decision
