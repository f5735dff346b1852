"""The effects the rows of the consumer-protocol table name, in the order a row lists them.

Each ``_do_*`` method carries out one ``Effect`` with what the ``Step`` brings;
none chooses a state (``ConsumerMachine._step`` sets the row's state after them).
``CONSUMER_EFFECTS`` maps each ``Effect`` to its method.
"""

from __future__ import annotations

from collections.abc import Callable

from ingest.group.consumer.consumer_core import ConsumerCore
from ingest.group.consumer.consumer_events import ConsumerOutput, NeedTopicNames
from ingest.group.consumer.consumer_transitions import Effect, Step
from ingest.group.events import PartitionsAssigned, PartitionsLost, PartitionsRevoked
from ingest.group.inflight import Epoch

__all__ = ["CONSUMER_EFFECTS", "ConsumerEffects"]


class ConsumerEffects(ConsumerCore):
    """The effects of ``consumer_transitions.Effect``, on the core's state."""

    def _do_start_joining(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        """Epoch 0; ``_pump`` sends the joining heartbeat (every field) at ``step.at``."""
        self._round += 1
        self._member_epoch = 0
        self._membership_since = None
        self._target = None
        self._sent = None
        self._announced = False
        self._next_heartbeat_at = step.at

    def _do_apply_assignment(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        """Own the target; only what it adds is announced (kept partitions run on untouched).

        The heartbeat that reports it goes at once (``_heartbeat_due``).
        """
        added = step.assignment - self._owned
        self._owned = step.assignment
        if added or not self._announced:
            self._announced = True
            event = PartitionsAssigned(added, step.assignment, self._member_epoch, self._member_id)
            out.append(event)

    def _do_ask_topic_names(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self._asked |= step.topic_ids
        out.append(NeedTopicNames(step.topic_ids))

    def _do_revoke(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        out.append(PartitionsRevoked(step.partitions))
        self._owned -= step.partitions
        self._revoking |= step.partitions
        self._revocations_pending += 1

    def _do_lose(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        lost = self._owned | self._revoking
        if lost:
            out.append(PartitionsLost(lost, step.lost))
        self._owned = frozenset()
        self._revoking = frozenset()

    def _do_reset_epoch(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self._round += 1
        self._member_epoch = 0
        self._membership_since = None
        self._target = None
        self._sent = None

    def _do_abandon_round(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self._round += 1

    def _do_send_leave(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        coordinator = self._coordinator
        assert coordinator is not None and coordinator.versions.consumer_group_heartbeat is not None
        epoch = self._leave_epoch()
        self._send(
            out,
            self._leave_request(epoch),
            coordinator.versions.consumer_group_heartbeat,
            epoch=Epoch(self._round, epoch, self._member_id),  # marks the leaving heartbeat
            sent_at=now,
        )
        self._do_forget_membership(step, now, out)

    def _do_forget_membership(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self._member_epoch = 0
        self._membership_since = None
        self._owned = frozenset()
        self._target = None
        self._sent = None

    def _do_stop(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        self._round += 1
        self._do_forget_membership(step, now, out)

    def _do_report(self, step: Step, now: float, out: list[ConsumerOutput]) -> None:
        assert step.report is not None
        out.append(step.report)


EffectMethod = Callable[[ConsumerEffects, Step, float, list[ConsumerOutput]], None]

#: Effect -> the method that carries it out.
CONSUMER_EFFECTS: dict[Effect, EffectMethod] = {
    Effect.START_JOINING: ConsumerEffects._do_start_joining,
    Effect.APPLY_ASSIGNMENT: ConsumerEffects._do_apply_assignment,
    Effect.ASK_TOPIC_NAMES: ConsumerEffects._do_ask_topic_names,
    Effect.REVOKE: ConsumerEffects._do_revoke,
    Effect.LOSE: ConsumerEffects._do_lose,
    Effect.RESET_EPOCH: ConsumerEffects._do_reset_epoch,
    Effect.ABANDON_ROUND: ConsumerEffects._do_abandon_round,
    Effect.SEND_LEAVE: ConsumerEffects._do_send_leave,
    Effect.FORGET_MEMBERSHIP: ConsumerEffects._do_forget_membership,
    Effect.STOP: ConsumerEffects._do_stop,
    Effect.REPORT: ConsumerEffects._do_report,
}
