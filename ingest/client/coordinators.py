"""FindCoordinator: ``Cluster.find_coordinators`` runs ``find_coordinators`` here.

Version 4 batches the keys in one request; older versions ask one key per
request, pipelined on one connection. Retried on COORDINATOR_NOT_AVAILABLE,
COORDINATOR_LOAD_IN_PROGRESS and NOT_COORDINATOR, within the cluster's
``retrying``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from ingest.client.connection import expect_response
from ingest.client.metadata_cache import BrokerInfo
from ingest.errors import BrokerError, ProtocolError
from ingest.protocol.error_codes import ErrorCode, error_for
from ingest.protocol.messages import FindCoordinatorRequest, FindCoordinatorResponse

if TYPE_CHECKING:
    from ingest.client.cluster import Cluster

__all__ = ["COORDINATOR_RETRY_ERRORS", "find_coordinators"]

COORDINATOR_RETRY_ERRORS = frozenset(
    {
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.NOT_COORDINATOR,
    }
)


def find_coordinators(
    cluster: Cluster, keys: Sequence[str], *, key_type: int, within: float | None = None
) -> dict[str, BrokerInfo]:
    """The coordinator of each key; each one found is also learned as a broker. With
    ``within``, every connect, request and retry ends within that many seconds."""
    pending = list(dict.fromkeys(keys))
    found: dict[str, BrokerInfo] = {}
    clock = cluster.clock
    deadline = None if within is None else clock() + within

    def left() -> float | None:
        return None if deadline is None else max(deadline - clock(), 0.001)

    def attempt() -> dict[str, BrokerInfo]:
        connection = cluster.any_connection(within=left())
        version = connection.version_for(FindCoordinatorRequest.api_key)
        context = f"{connection.describe()}, FindCoordinator v{version}"
        answers: list[tuple[str, int, str | None, int, str, int]] = []
        if version >= 4:
            request = FindCoordinatorRequest(key_type=key_type, coordinator_keys=tuple(pending))
            response = expect_response(
                cluster.request(connection, request, timeout=left()),
                FindCoordinatorResponse,
                context,
            )
            answers = [
                (c.key, c.error_code, c.error_message, c.node_id, c.host, c.port)
                for c in response.coordinators
            ]
        else:
            tickets = [
                (
                    key,
                    cluster.send(
                        connection,
                        FindCoordinatorRequest(key=key, key_type=key_type),
                        timeout=left(),
                    ),
                )
                for key in pending
            ]
            for index, (key, ticket) in enumerate(tickets):
                try:
                    response = expect_response(
                        cluster.receive(connection, ticket), FindCoordinatorResponse, context
                    )
                except BaseException:
                    for _, later in tickets[index + 1 :]:
                        connection.abandon(later)
                    raise
                answers.append(
                    (
                        key,
                        response.error_code,
                        response.error_message,
                        response.node_id,
                        response.host,
                        response.port,
                    )
                )
        retry: BrokerError | None = None
        for key, code, message, node_id, host, port in answers:
            if key not in pending:
                continue
            if code:
                info = error_for(code)
                error = BrokerError(
                    info.code,
                    info.name,
                    info.retriable or code in COORDINATOR_RETRY_ERRORS,
                    context=f"{context}, key {key!r}",
                    message=message or info.description,
                )
                if not error.retriable:
                    raise error
                retry = error
                continue
            broker = BrokerInfo(node_id, host, port)
            cluster.metadata.learn_broker(broker)
            found[key] = broker
            pending.remove(key)
        if pending:
            if retry is not None:
                raise retry
            raise ProtocolError(f"{context}: no answer for keys {pending}")
        return found

    return cluster.retrying("FindCoordinator", attempt, within=within)
