"""The consumer protocol's transition table (KIP-848) is the only place its states are
chosen, and it is complete: every outcome a handler may name has a row, every row is
named, every effect and every input has its implementation."""

from __future__ import annotations

import ast
from pathlib import Path

from ingest.group.consumer.consumer_events import CONSUMER_INPUT_TYPES
from ingest.group.consumer.consumer_machine import HANDLERS
from ingest.group.consumer.consumer_member import EFFECTS
from ingest.group.consumer.consumer_transitions import (
    ACCEPTS,
    ROWS,
    TERMINAL,
    TRANSITIONS,
    ConsumerState,
    Effect,
    Outcome,
)

GROUP = Path(__file__).resolve().parents[2] / "ingest" / "group"
S = ConsumerState
On = Outcome


def test_every_input_has_a_handler_and_an_acceptance_row() -> None:
    assert set(HANDLERS) == set(CONSUMER_INPUT_TYPES) == set(ACCEPTS)


def test_every_effect_is_implemented() -> None:
    assert set(EFFECTS) == set(Effect)


def test_the_size_of_the_table() -> None:
    """8 states x 15 input types; the pairs refused are the ones the protocol rules out."""
    refused = {(s, i.__name__) for s in S for i in CONSUMER_INPUT_TYPES} - {
        (s, i.__name__) for s, i in TRANSITIONS
    }
    not_a_member = {S.LEAVING, S.FENCED, S.FAILED}
    assert refused == {
        *((s, "Subscribe") for s in not_a_member),
        *((s, "SubscribeRegex") for s in not_a_member),
        # a RevocationDone answers a PartitionsRevoked, which only REVOKING and LEAVING await
        *((s, "RevocationDone") for s in (S.UNJOINED, S.JOINING, S.STABLE, S.RECONCILING)),
    }
    assert len(TRANSITIONS) == 8 * 15 - 10 == 110
    assert len(ROWS) == 56


def test_every_named_outcome_has_a_row_and_every_row_is_named() -> None:
    named = set()
    for (state, input_type), transition in TRANSITIONS.items():
        assert transition.outcomes, (state, input_type)
        for outcome in transition.outcomes:
            assert (state, outcome) in ROWS, (state.name, input_type.__name__, outcome.name)
            named.add((state, outcome))
        assert transition.targets == {ROWS[(state, o)].next for o in transition.outcomes}
    assert set(ROWS) == named, sorted((s.name, o.name) for s, o in set(ROWS) - named)
    assert {outcome for _, outcome in ROWS} == set(Outcome)


def test_rows_read_as_kip_848_says() -> None:
    # Incremental reconciliation: revoke first (and wait), then own the target.
    assert ROWS[(S.STABLE, On.REVOKE)].next is S.REVOKING
    assert ROWS[(S.STABLE, On.REVOKE)].effects == (Effect.REVOKE,)
    assert ROWS[(S.REVOKING, On.RECONCILED)].next is S.STABLE
    assert ROWS[(S.STABLE, On.RECONCILED)].effects == (Effect.APPLY_ASSIGNMENT,)
    # A fenced member loses (never revokes) its partitions and rejoins at epoch 0 ...
    assert ROWS[(S.STABLE, On.MEMBER_FENCED)].next is S.JOINING
    assert ROWS[(S.STABLE, On.MEMBER_FENCED)].effects == (
        Effect.LOSE,
        Effect.RESET_EPOCH,
        Effect.START_JOINING,
    )
    # ... unless a revocation is pending: it rejoins once that is acknowledged.
    assert ROWS[(S.REVOKING, On.MEMBER_FENCED)].next is S.REVOKING
    assert ROWS[(S.REVOKING, On.JOIN)].next is S.JOINING
    # Leaving revokes what is owned before the leaving heartbeat.
    assert ROWS[(S.STABLE, On.REVOKE_THEN_LEAVE)].next is S.LEAVING
    assert ROWS[(S.LEAVING, On.SEND_LEAVE)].effects == (Effect.SEND_LEAVE,)
    assert ROWS[(S.LEAVING, On.LEFT)].next is S.UNJOINED
    for state in S:
        assert ROWS[(state, On.STAY)].next is state and not ROWS[(state, On.STAY)].effects
    # Nothing leaves a terminal state, and every way into one loses the partitions first.
    for (state, outcome), row in ROWS.items():
        if state in TERMINAL:
            assert outcome is On.STAY
        elif row.next in TERMINAL:
            assert row.effects[0] is Effect.LOSE and Effect.STOP in row.effects
    # A joining member owns nothing, so nothing can be revoked there.
    assert (S.JOINING, On.REVOKE) not in ROWS


def test_only_the_table_lookup_sets_the_state() -> None:
    """The record's ``state`` is set in two places in the consumer package and the engine: its
    initial value, and the engine's one table lookup (``TableEngine._step``)."""
    places = []
    for path in sorted([*(GROUP / "consumer").glob("*.py"), GROUP / "engine.py"]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                field = isinstance(target, ast.Name) and target.id == "state"
                if (isinstance(node, ast.AnnAssign) and field and node.value is not None) or (
                    isinstance(target, ast.Attribute) and target.attr in ("state", "_state")
                ):
                    places.append((path.name, ast.unparse(node.value)))
    assert sorted(places) == [("consumer_member.py", "UNJOINED"), ("engine.py", "row.next")]
