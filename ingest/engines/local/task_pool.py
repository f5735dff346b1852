"""The local engine: a batch's files tasks in a pool of local processes, no JVM.

Without a SQL transform, no record of a batch enters the JVM: Spark's part is to run the
``files`` tasks (``plan.files_task``: read segments, decode, write Parquet with pyarrow)
on its Python workers, one per core. On a local master those are processes of this
machine, so the local engine runs the same tasks in a pool of its own processes
(``forkserver``: the supervisor has threads, and the server's children start with the task
modules imported), and skips the JVM, its start (1.5-6 s here) and its memory (~400 MB).

Everything else is the landing protocol's (``ingest.sink.land``), as on Spark: the txn
versions, the dead-letter commit, the one Delta commit with a txn per partition. A JSON
value schema is turned into Arrow by ``ingest.ddl.arrow_schema``, whose answers equal
Spark's (``tests/test_ddl.py``); a schema it does not claim sends the run to Spark
(``local_decode_spec`` returns None).

A pool process that dies (killed, out of memory) breaks the pool: the batch fails with
``LocalTaskError`` and is retried as any failed batch, on a new pool.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from ingest.ddl import arrow_schema
from ingest.engines.local.task_process import TASK_PROCESS_NAME, ready, run_task, task_process_start
from ingest.engines.plan import ReadPlan, SegmentTask, added_schema, collect_rows, encode_plan
from ingest.engines.tasks import group_segments
from ingest.errors import SinkError
from ingest.formats.decode import DecodeSpec, table_spec
from ingest.sink.batch import WriteRequest, WrittenFiles
from ingest.sink.files import DataFile
from ingest.sink.table_config import FIELD_FORMATS, TableConfig

__all__ = [
    "TASK_PROCESS_NAME",
    "LocalFiles",
    "LocalTaskError",
    "LocalTasks",
    "local_capable",
    "local_decode_spec",
]

# What a task process imports; the supervisor has the fork server import it too
# (``ingest.processes.preload_in_fork_server``), so tasks start with it imported.
# The pool starts a process at a submit that finds none idle, and a process is idle again
# once its task's result is back: each warm-up task waits at a barrier of ``cores``
# parties until every warm-up task runs, so none is back before the last submit (a fixed
# hold lost that race when the submitting thread was descheduled longer than the hold).
# The timeout only bounds a pool that has fewer processes than parties.
WARM_TIMEOUT_S = 60.0


class LocalTaskError(SinkError):
    """A task process of the local engine died; the batch is retried on a new pool."""


def local_capable(config: TableConfig) -> bool:
    """Whether the local engine can decode ``config``'s values: not with a transform, or
    a JSON schema whose Arrow form ``ingest.ddl`` does not claim."""
    if config.transform:
        return False
    if config.value_format in FIELD_FORMATS and config.value_schema:
        return arrow_schema(config.value_schema) is not None
    return True


def local_decode_spec(config: TableConfig) -> DecodeSpec | None:
    """The decode spec of ``config`` without Spark, or None when only Spark can say it
    (``local_capable``)."""
    if not local_capable(config):
        return None
    json_schema = None
    if config.value_format in FIELD_FORMATS and config.value_schema:
        json_schema = arrow_schema(config.value_schema)
    return table_spec(config, json_schema)


class LocalTasks:
    """A pool of ``cores`` task processes, started on first use (or by ``warm``)."""

    def __init__(self, cores: int) -> None:
        self.cores = max(cores, 1)
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            context = multiprocessing.get_context("forkserver")
            self._pool = ProcessPoolExecutor(
                max_workers=self.cores,
                mp_context=context,
                initializer=task_process_start,
                # The warm-up barrier reaches each process at its start (a lock cannot
                # travel with a task).
                initargs=(os.getpid(), context.Barrier(self.cores)),
            )
        return self._pool

    def warm(self) -> float:
        """Starts every task process (each imports the task modules); seconds."""
        began = time.perf_counter()
        pool = self._executor()
        futures = [pool.submit(ready, WARM_TIMEOUT_S) for _ in range(self.cores)]
        for future in futures:
            future.result()
        return time.perf_counter() - began

    def run(self, plan: ReadPlan) -> list[tuple[str, str]]:
        """Every task of ``plan``, in the pool; their (kind, DataFile JSON) rows."""
        encoded = encode_plan(plan)
        pool = self._executor()
        futures: list[Future[list[tuple[str, str]]]] = []
        try:
            futures = [pool.submit(run_task, encoded, i) for i in range(len(plan.tasks))]
            rows: list[tuple[str, str]] = []
            for future in futures:
                rows.extend(future.result())
            return rows
        except BrokenProcessPool as exc:
            self.stop()
            raise LocalTaskError(f"a task process of the local engine died: {exc}") from exc
        finally:
            # A failed task leaves the others running: wait for them, so none writes after
            # the landing protocol has cleaned up.
            for future in futures:
                future.cancel()
            for future in futures:
                if not future.cancelled():
                    future.exception()

    def stop(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


class LocalFiles:
    """The landing's writes (``ingest.engines.drive``) on the local engine (the arrow path)."""

    def __init__(self, tasks: LocalTasks, spec: DecodeSpec) -> None:
        self.tasks = tasks
        self.spec = spec

    def write(self, request: WriteRequest) -> WrittenFiles:
        return self.plan(request)()

    def plan(self, request: WriteRequest) -> Callable[[], WrittenFiles]:
        tasks: tuple[SegmentTask, ...] = group_segments(
            request.segments,
            skip_through=request.skip_through,
            dead_skip_through=request.dead_skip_through,
            parallelism=self.tasks.cores,
        )
        plan = ReadPlan.files(request, tasks, self.spec)
        return lambda: self._run(plan)

    def _run(self, plan: ReadPlan) -> WrittenFiles:
        data: list[DataFile] = []
        dead: list[DataFile] = []
        schema = self.spec.output_schema()
        if plan.tasks:
            rows = self.tasks.run(plan)
            data, dead, _ = collect_rows(rows)  # files tasks reject nothing
            schema = added_schema(rows, schema)
        return WrittenFiles(
            data=tuple(data),
            dead=tuple(dead),
            rejected=(),
            schema=schema,
            path="local" if plan.tasks else "none",
        )
