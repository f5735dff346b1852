"""``ingest run`` and ``replay`` start with the garbage collector off and end with it on,
whichever way they end (a replay once kept it off for its whole run)."""

from __future__ import annotations

import argparse
import gc
from collections.abc import Iterator

import pytest

from ingest.cli import _collector_off_at_start, _gc_after_startup

pytestmark = pytest.mark.quick


@pytest.fixture(autouse=True)
def _collector_restored() -> Iterator[None]:
    yield
    gc.unfreeze()
    gc.enable()


def test_the_collector_is_off_while_starting_and_on_for_the_run() -> None:
    seen: list[bool] = []

    @_collector_off_at_start
    def command(_args: argparse.Namespace) -> int:
        seen.append(gc.isenabled())  # the start
        _gc_after_startup()
        seen.append(gc.isenabled())  # the run
        return 0

    assert command(argparse.Namespace()) == 0
    assert seen == [False, True] and gc.isenabled()
    assert gc.get_freeze_count() > 0  # what the start built is out of its reach


@pytest.mark.parametrize("ending", ["error", "early return"])
def test_the_collector_is_on_again_however_the_command_ends(ending: str) -> None:
    @_collector_off_at_start
    def command(_args: argparse.Namespace) -> int:
        assert not gc.isenabled()
        if ending == "error":
            raise RuntimeError("the config does not load")
        return 0  # --print-config: no engine, no _gc_after_startup

    if ending == "error":
        with pytest.raises(RuntimeError):
            command(argparse.Namespace())
    else:
        assert command(argparse.Namespace()) == 0
    assert gc.isenabled()


def test_run_and_replay_both_start_so() -> None:
    from ingest import cli

    for command in (cli._run, cli._replay):
        assert getattr(command, "__wrapped__", None) is not None, command
