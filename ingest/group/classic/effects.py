"""The effects the rows of ``ROWS`` name, in the order a row lists them.

Each ``_do_*`` method carries out one ``Effect`` with what the ``Step`` brings;
none of them chooses a state (``GroupMachine._step`` sets the row's state after
them). ``EFFECTS`` maps each ``Effect`` to its method.
"""

from __future__ import annotations

from collections.abc import Callable

from ingest.group.classic.classic_requests import leave_group_request, sync_group_request
from ingest.group.classic.classic_transitions import Effect, Step
from ingest.group.classic.core import MachineCore
from ingest.group.events import (
    NeedMetadata,
    Output,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
)

__all__ = ["EFFECTS", "Effects"]


class Effects(MachineCore):
    """The effects of ``transitions.Effect``, on the core's state."""

    def _do_start_joining(self, step: Step, now: float, out: list[Output]) -> None:
        """A new round; ``_pump`` sends its JoinGroup at ``step.at`` once the coordinator is known."""
        self._round += 1
        self._leadership.pending = None
        self._join_due = True
        self._join_retry_at = step.at
        self._join_reason = step.reason

    def _do_retry_join(self, step: Step, now: float, out: list[Output]) -> None:
        self._join_due = True
        self._join_retry_at = now + self._backoff()

    def _do_rejoin_after_sync(self, step: Step, now: float, out: list[Output]) -> None:
        self._rejoin_after_sync = True

    def _do_abandon_round(self, step: Step, now: float, out: list[Output]) -> None:
        self._round += 1
        self._leadership.pending = None
        self._join_due = False

    def _do_revoke(self, step: Step, now: float, out: list[Output]) -> None:
        out.append(PartitionsRevoked(step.partitions))
        self._owned -= step.partitions
        self._revoking |= step.partitions
        self._revocations_pending += 1

    def _do_ask_metadata(self, step: Step, now: float, out: list[Output]) -> None:
        out.append(NeedMetadata(step.topics))

    def _do_send_sync(self, step: Step, now: float, out: list[Output]) -> None:
        assert self._coordinator is not None
        version = self._coordinator.versions.sync_group
        request = sync_group_request(
            self.config,
            generation_id=self._generation_id,
            member_id=self._member_id,
            protocol_name=self._protocol_name,
            assignments=step.assignments,
            version=version,
        )
        self._send(out, request, version)

    def _do_apply_assignment(self, step: Step, now: float, out: list[Output]) -> None:
        self._leadership.retain(step.user_data, self._protocol_name)
        added = step.assignment - self._owned
        self._owned = step.assignment
        self._owned_generation = self._generation_id
        self._metadata_check_at = now + self.config.metadata_refresh_ms / 1000
        out.append(PartitionsAssigned(added, step.assignment, self._generation_id, self._member_id))

    def _do_lose(self, step: Step, now: float, out: list[Output]) -> None:
        lost = self._owned | self._revoking
        if lost:
            out.append(PartitionsLost(lost, step.lost))
        self._owned = frozenset()
        self._owned_generation = -1
        self._revoking = frozenset()

    def _do_reset_generation(self, step: Step, now: float, out: list[Output]) -> None:
        self._reset_generation(reset_member_id=False)

    def _do_reset_member(self, step: Step, now: float, out: list[Output]) -> None:
        self._reset_generation(reset_member_id=True)

    def _do_stop(self, step: Step, now: float, out: list[Output]) -> None:
        self._do_abandon_round(step, now, out)
        self._reset_generation(reset_member_id=True)

    def _do_send_leave_group(self, step: Step, now: float, out: list[Output]) -> None:
        member_id = self._member_id
        self._do_forget_membership(step, now, out)
        assert self._coordinator is not None
        version = self._coordinator.versions.leave_group
        request = leave_group_request(
            self.config, member_id=member_id, reason=self._leave_reason, version=version
        )
        self._send(out, request, version)

    def _do_forget_membership(self, step: Step, now: float, out: list[Output]) -> None:
        self._reset_generation(reset_member_id=True)
        self._owned = frozenset()

    def _do_report(self, step: Step, now: float, out: list[Output]) -> None:
        assert step.report is not None
        out.append(step.report)

    def _reset_generation(self, *, reset_member_id: bool) -> None:
        self._generation_id = -1
        self._protocol_name = None
        self._leader_id = ""
        self._leadership.assigned_counts = None
        if reset_member_id:
            self._member_id = ""


EffectMethod = Callable[[Effects, Step, float, list[Output]], None]

#: Effect -> the method that carries it out.
EFFECTS: dict[Effect, EffectMethod] = {
    Effect.START_JOINING: Effects._do_start_joining,
    Effect.RETRY_JOIN: Effects._do_retry_join,
    Effect.REJOIN_AFTER_SYNC: Effects._do_rejoin_after_sync,
    Effect.ABANDON_ROUND: Effects._do_abandon_round,
    Effect.REVOKE: Effects._do_revoke,
    Effect.ASK_METADATA: Effects._do_ask_metadata,
    Effect.SEND_SYNC: Effects._do_send_sync,
    Effect.APPLY_ASSIGNMENT: Effects._do_apply_assignment,
    Effect.LOSE: Effects._do_lose,
    Effect.RESET_GENERATION: Effects._do_reset_generation,
    Effect.RESET_MEMBER: Effects._do_reset_member,
    Effect.STOP: Effects._do_stop,
    Effect.SEND_LEAVE_GROUP: Effects._do_send_leave_group,
    Effect.FORGET_MEMBERSHIP: Effects._do_forget_membership,
    Effect.REPORT: Effects._do_report,
}
