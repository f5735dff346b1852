"""The table engine both group machines run: a state change is one table lookup.

``GroupMachine`` (the classic protocol, ``classic/``) and ``ConsumerMachine`` (KIP-848,
``consumer/``) each give a ``TableEngine`` their tables, their handlers and their
effects; ``TableEngine.handle`` is their ``handle``. A machine keeps a record of what
the member knows (``ClassicMember``, ``ConsumerMember``). An input passes three
places, as in h11 and h2 (each protocol's ``*_transitions.py`` holds its tables):

1. ``TRANSITIONS``: is (state, input type) accepted? If not, ``InvalidTransition``
   is raised and nothing changes.
2. The input's handler records what the input says and names the outcome, a
   ``Step``, following Kafka's consumer (which errors rejoin at once, which back
   off, which reset the member, which lose the partitions and which are fatal).
   A handler never chooses a state.
3. ``ROWS``: the row for (state, outcome) gives the next state and the effects.
   ``TableEngine._step`` runs them on the record and enters the state; nothing
   else sets one. An input that takes several steps (an assignment applied, then
   the rejoin a changed subscription asked for; each request a lost connection
   failed) yields them, one lookup each, and still ends in one of its transition's
   ``targets``.

Requests go out from one place, the record's ``pump``, after every input.
Reading a row tells where an outcome leads and what it does on the way.
"""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import KW_ONLY, dataclass, field
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

from ingest.group.events import Output
from ingest.group.types import InvalidTransition
from ingest.protocol.partition import Partition

__all__ = [
    "MemberRecord",
    "Row",
    "Step",
    "TableEngine",
    "Transition",
    "derive_transitions",
    "each",
    "effect_methods",
    "of",
    "row",
]

StateT = TypeVar("StateT", bound=Enum)
OutcomeT = TypeVar("OutcomeT", bound=Enum)
EffectT = TypeVar("EffectT", bound=Enum)
OutputT = TypeVar("OutputT")


@dataclass(frozen=True)
class Step(Generic[OutcomeT]):
    """An outcome named by a handler, with what its effects need.

    Each protocol's effects read the fields they name; the others stay at their defaults.
    """

    outcome: OutcomeT
    _: KW_ONLY
    at: float = -math.inf  # START_JOINING: when the JoinGroup (or joining heartbeat) may go
    reason: str = ""  # START_JOINING (classic): the JoinGroup's reason
    lost: str = ""  # LOSE: why the partitions are lost
    partitions: frozenset[Partition] = frozenset()  # REVOKE: what to revoke
    assignment: frozenset[Partition] = frozenset()  # APPLY_ASSIGNMENT
    report: Output | None = None  # REPORT
    topics: frozenset[str] = frozenset()  # ASK_METADATA (classic)
    assignments: Mapping[str, bytes] = field(default_factory=dict)  # SEND_SYNC (classic)
    user_data: bytes | None = None  # APPLY_ASSIGNMENT (classic): kept for the next time we lead
    topic_ids: frozenset[uuid.UUID] = frozenset()  # ASK_TOPIC_NAMES (consumer)


@dataclass(frozen=True)
class Row(Generic[StateT, EffectT]):
    """Where an outcome leads from one state, and what it does on the way, in order."""

    next: StateT
    effects: tuple[EffectT, ...] = ()


def row(next_state: StateT, *effects: EffectT) -> Row[StateT, EffectT]:
    return Row(next_state, effects)


@dataclass(frozen=True)
class Transition(Generic[StateT, OutcomeT]):
    """An accepted (state, input type): the outcomes it may come to and where they lead.

    An input that takes several steps still ends in one of ``targets``;
    ``TableEngine.handle`` checks it.
    """

    outcomes: frozenset[OutcomeT]
    targets: frozenset[StateT]


def of(*outcomes: OutcomeT) -> frozenset[OutcomeT]:
    return frozenset(outcomes)


def each(
    states: Iterable[StateT], outcomes: frozenset[OutcomeT]
) -> dict[StateT, frozenset[OutcomeT]]:
    return dict.fromkeys(states, outcomes)


def derive_transitions(
    accepts: Mapping[type, Mapping[StateT, frozenset[OutcomeT]]],
    rows: Mapping[tuple[StateT, OutcomeT], Row[StateT, EffectT]],
) -> dict[tuple[StateT, type], Transition[StateT, OutcomeT]]:
    """(state, input type) -> outcomes and target states, from ``ACCEPTS`` and ``ROWS``."""
    return {
        (state, input_type): Transition(
            outcomes, frozenset(rows[(state, outcome)].next for outcome in outcomes)
        )
        for input_type, states in accepts.items()
        for state, outcomes in states.items()
    }


class MemberRecord(Protocol):
    """What the engine needs of a machine's record: its state, and ``pump`` after every input."""

    state: Any

    def pump(self, now: float, out: list[Any]) -> None: ...


MachineT = TypeVar("MachineT")
RecordT = TypeVar("RecordT", bound=MemberRecord)

#: A handler: reads its input and names the outcome (one step, or several in order).
Handler = Callable[[MachineT, Any, float, list[OutputT]], Step[Any] | Iterator[Step[Any]]]
#: An effect: carries out one ``Effect`` of a row on the record, with what the step brings.
EffectFn = Callable[[RecordT, Step[Any], float, list[OutputT]], None]


def effect_methods(
    record: type[RecordT], effects: type[EffectT]
) -> dict[EffectT, EffectFn[RecordT, Any]]:
    """Effect -> the record's method that carries it out: ``do_`` and the effect's name.

    A record lacking one fails at import (AttributeError), before any input."""
    return {effect: getattr(record, f"do_{effect.name.lower()}") for effect in effects}


@dataclass(frozen=True)
class TableEngine(Generic[MachineT, RecordT, StateT, OutcomeT, EffectT, OutputT]):
    """One protocol's tables, handlers and effects, run the same way for both protocols.

    A machine keeps a record (its state and what it knows); its handlers read the
    input and the record and name the outcome; the effects change the record.
    """

    rows: Mapping[tuple[StateT, OutcomeT], Row[StateT, EffectT]]
    transitions: Mapping[tuple[StateT, type], Transition[StateT, OutcomeT]]
    handlers: Mapping[type, Handler[MachineT, OutputT]]
    effects: Mapping[EffectT, EffectFn[RecordT, OutputT]]

    def handle(
        self, machine: MachineT, record: RecordT, event: object, now: float
    ) -> list[OutputT]:
        """Apply ``event`` at time ``now``; return the outputs in the order to act on them."""
        before = record.state
        transition = self.transitions.get((before, type(event)))
        if transition is None:
            raise InvalidTransition(before, type(event))
        out: list[OutputT] = []
        named = self.handlers[type(event)](machine, event, now, out)
        for step in (named,) if isinstance(named, Step) else named:
            self._step(record, step, transition, now, out)
        if record.state not in transition.targets:
            raise AssertionError(
                f"{type(event).__name__} took {before.name} to {record.state.name}, "
                f"which TRANSITIONS does not name"
            )
        record.pump(now, out)
        return out

    def _step(
        self,
        record: RecordT,
        step: Step[Any],
        transition: Transition[StateT, OutcomeT],
        now: float,
        out: list[OutputT],
    ) -> None:
        """One table lookup: run the row's effects, then enter its state."""
        row = self.rows.get((record.state, step.outcome))
        if row is None or step.outcome not in transition.outcomes:
            raise AssertionError(
                f"{step.outcome.name} in {record.state.name} is not a row of ROWS named by "
                f"this input's transition"
            )
        for effect in row.effects:
            self.effects[effect](record, step, now, out)
        record.state = row.next
