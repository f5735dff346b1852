"""Running a test on Apache Kafka and on Tansu, with Tansu's known deviations as strict xfails.

Apache Kafka is the suite's broker (the ``broker`` fixture). Tests that prove ingest stays
correct on Tansu too, or that document where Tansu departs from the protocol, run on both:
parametrize a fixture with ``BROKERS`` and fetch the server with ``server_for(request)``.
Where Tansu answers wrongly, ``tansu_deviates(request, reason=..., raises=...)`` makes that
case a strict xfail, so the test asserts the spec's answer on both brokers and starts
failing loudly when Tansu is fixed. docs/kafka-compat.md lists every deviation.
"""

from __future__ import annotations

from typing import Any

import pytest

BROKERS = [pytest.param("broker", id="kafka"), pytest.param("tansu", id="tansu")]


def server_for(request: pytest.FixtureRequest) -> Any:
    """The server of the parametrized ``BROKERS`` fixture that ``request`` belongs to."""
    return request.getfixturevalue(request.param)


def on_tansu(request: pytest.FixtureRequest) -> bool:
    callspec = getattr(request.node, "callspec", None)
    return callspec is not None and "tansu" in callspec.params.values()


def tansu_deviates(
    request: pytest.FixtureRequest, *, reason: str, raises: type[BaseException]
) -> None:
    """Marks this test, when it runs on Tansu, as a strict xfail raising ``raises``."""
    if on_tansu(request):
        request.applymarker(pytest.mark.xfail(strict=True, raises=raises, reason=reason))
