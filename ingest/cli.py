"""The ``ingest`` command line.

    ingest run    -c conf/x.toml [--until-end]       the consumer group into the Delta table
    ingest replay -c conf/x.toml --from F [--to T]   a range again, idempotently, no group
    ingest status -c conf/x.toml [--json]            offsets, txn versions, lag, the group
    ingest maintain -c conf/x.toml [--json]          one maintenance pass: compaction, checkpoint,
                                                     log retention, VACUUM ([maintenance])
    ingest broker                                    the embedded test broker (Tansu)
    ingest config-schema                             the config's JSON Schema (every key:
                                                     docs/configuration.md)

``--print-config`` (run, replay, status, maintain) prints the effective config, secrets
masked, and exits. Exit codes: 0 done; 1 failed (the message says why);
2 configuration error; 128+N stopped at once by a second signal N.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version
from typing import Any

from ingest.errors import ConfigError, IngestError

# numpy (which pyarrow imports) starts OpenBLAS's thread pool at import, and its threads
# spin: 0.1 CPU s in every fresh interpreter of a run (the supervisor, the fork server),
# measured by scripts/bench/e2e.py --profile. ingest does no linear algebra, and its task
# processes are one per core already. A user's own setting is kept.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _broker(args: argparse.Namespace) -> int:
    """Runs the embedded test broker in the foreground until interrupted."""
    from ingest.embedded.seaweedfs import S3Server, weed_binary
    from ingest.embedded.tansu import TansuBroker, tansu_binary
    from ingest.errors import HarnessError

    try:
        tansu_binary()
        if args.storage == "s3":
            weed_binary()
    except HarnessError as exc:
        print(f"ingest broker: {exc}", file=sys.stderr)
        return 2
    s3 = S3Server().start() if args.storage == "s3" else None
    broker = TansuBroker(storage=args.storage, s3=s3, port=args.port).start()
    print(f"bootstrap.servers={broker.bootstrap}", flush=True)
    print(f"log={broker.log_path}", flush=True)
    stopped = False

    def stop(_sig: int, _frame: object) -> None:
        nonlocal stopped
        stopped = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        while not stopped and broker.running():
            time.sleep(0.2)
    finally:
        broker.stop()
        if s3 is not None:
            s3.stop()
    return 0


@contextlib.contextmanager
def _stop_on_signals(engine: Any) -> Iterator[None]:
    """SIGTERM/SIGINT: a graceful stop; a second one ends the process at once (the Delta
    txn filter keeps the table exact whatever was in flight)."""
    received: list[int] = []

    def handler(signum: int, _frame: object) -> None:
        if received:
            from ingest.supervisor.output.terminal import Terminal

            terminal = Terminal.active()
            if terminal is not None:
                terminal.restore()  # the message goes to the terminal, below the bar
                os.write(2, b"\n")
            os.write(2, b"ingest: second signal: exiting at once\n")
            os._exit(128 + signum)
        received.append(signum)
        engine.request_stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _load(args: argparse.Namespace, *, quiet: bool = False) -> Any:
    from ingest.config import load_config, render_config
    from ingest.logs import configure_logging

    config = load_config(args.config)
    if args.print_config:
        from ingest.supervisor.wiring import rebalance_protocol_note

        print(f"# {rebalance_protocol_note(config)}")
        print(render_config(config), end="")
        return None
    level = config.logging.level
    if quiet and level == "info":
        level = "warning"  # a report on stdout: only trouble on stderr
    configure_logging(config.logging.format, level)
    return config


def _check_bootstrap(config: Any) -> None:
    """No bootstrap server answering at start is a configuration error (exit 2), told
    within kafka.retry_timeout, before Spark or any worker starts."""
    from ingest.client import Cluster
    from ingest.errors import KafkaConnectionError
    from ingest.supervisor.wiring import client_config

    try:
        with Cluster(client_config(config)) as cluster:
            cluster.bootstrap()
    except KafkaConnectionError as exc:
        servers = ", ".join(config.kafka.bootstrap_servers)
        raise ConfigError(
            f"no bootstrap server of [{servers}] answered within "
            f"{float(config.kafka.retry_timeout):g}s: {exc}",
            path=config.path,
            key="kafka.bootstrap_servers",
        ) from exc


@contextlib.contextmanager
def _terminal(bar: bool) -> Iterator[Any]:
    """When a bar will be drawn (``bar``) and stderr is a terminal, a ``Terminal``: the
    process and its children write above the bar; opened before the fork server starts,
    whose children write to the fds it had at its start. Elsewhere ``None``."""
    if not bar:
        yield None
        return
    from ingest.supervisor.output.terminal import Terminal, on_terminal

    if not on_terminal():
        yield None
        return
    with Terminal() as terminal:
        yield terminal


@contextlib.contextmanager
def _progress(label: str, terminal: Any) -> Iterator[Any]:
    """On a terminal (``_terminal``), a bar (``Progress`` on its console); elsewhere
    ``None`` (the run logs ``progress`` events)."""
    if terminal is None:
        yield None
        return
    from ingest.supervisor.output.progress import Progress

    progress = Progress(label, console=terminal.console)
    try:
        yield progress
    finally:
        progress.close()


def _finish(outcome: Any) -> int:
    if outcome.exit_code:
        from ingest.engines.spark.spark_session import drain_jvm_output

        drain_jvm_output()  # the JVM's last lines may explain the failure: log them first
        print(f"ingest: {outcome.message}", file=sys.stderr, flush=True)
    if outcome.batch_running:
        # A Spark job still runs on its thread and would hold the interpreter's exit.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(outcome.exit_code)
    return int(outcome.exit_code)


def _fork_server_tasks(engine: object) -> bool:
    """Whether the fork server imports the local engine's task modules too: unless
    ``[spark] engine = "spark"`` (with "auto" a batch without a transform runs locally)."""
    return engine != "spark"


def _start_fork_server_early(args: argparse.Namespace) -> None:
    """The workers' fork server starts before the config loads and imports on the other
    core while this process imports and validates the config (~0.3 s: pydantic, pyarrow,
    the Kafka client), then imports the supervisor and joins; started after the load, the
    first worker waited for it (measured: assignment to first worker 0.3-0.45 s on a
    100k-record --until-end run). Whether it imports the task modules is read from the
    file's ``[spark] engine``; a file that cannot be read or parsed starts nothing here
    (the load says what is wrong), nor does ``--print-config``."""
    if args.print_config:
        return
    import tomllib

    try:
        with open(args.config, "rb") as file:
            document = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError):
        return
    spark = document.get("spark")
    engine = spark.get("engine", "auto") if isinstance(spark, dict) else "auto"
    from ingest.processes import start_fork_server

    start_fork_server(tasks=_fork_server_tasks(engine))


def _start_fork_server(config: Any) -> None:
    """The fork server, if ``_start_fork_server_early`` did not start it (a no-op
    otherwise). Inside ``_terminal``: the server's children write to the fds it had at
    its start, which on a terminal must be the pipes ``Terminal`` prints above the bar."""
    from ingest.processes import start_fork_server

    start_fork_server(tasks=_fork_server_tasks(config.spark.engine))


def _collector_off_at_start(
    command: Callable[[argparse.Namespace], int],
) -> Callable[[argparse.Namespace], int]:
    """``run`` and ``replay`` start with the garbage collector off: its full passes over the
    growing heap of imports cost the supervisor 0.2 CPU s a run (scripts/bench/e2e.py
    --profile), and those objects live for the whole run. ``_gc_after_startup`` turns it
    back on once the engine is built; any other way out (an error, ``--print-config``)
    turns it on here. (The fork server is a fresh interpreter: workers and task
    processes, forked from it, have theirs on.)"""

    @functools.wraps(command)
    def wrapped(args: argparse.Namespace) -> int:
        gc.disable()
        try:
            return command(args)
        finally:
            gc.enable()

    return wrapped


def _gc_after_startup() -> None:
    """The collector back on, with what the start built (modules, the config, the engine)
    moved out of its reach (``_collector_off_at_start``)."""
    gc.freeze()
    gc.enable()


@_collector_off_at_start
def _run(args: argparse.Namespace) -> int:
    with _terminal(args.until_end and not args.print_config) as terminal:
        _start_fork_server_early(args)
        config = _load(args)
        if config is None:
            return 0
        _check_bootstrap(config)
        with _progress("until-end", terminal) as progress:
            _start_fork_server(config)
            from ingest.supervisor.modes.group_run import group_run

            engine = group_run(config, until_end=args.until_end, progress=progress)
            engine.lander.leave_jvm_at_exit = True
            _gc_after_startup()
            with _stop_on_signals(engine):
                outcome = engine.run()
    return _finish(outcome)


@_collector_off_at_start
def _replay(args: argparse.Namespace) -> int:
    with _terminal(not args.print_config) as terminal:
        _start_fork_server_early(args)
        config = _load(args)
        if config is None:
            return 0
        _check_bootstrap(config)
        with _progress("replay", terminal) as progress:
            _start_fork_server(config)
            from ingest.supervisor.modes.replay import parse_partitions, parse_position, replay_run

            engine = replay_run(
                config,
                start=parse_position(args.from_, "--from"),
                end=parse_position(args.to, "--to") if args.to else None,
                partitions=parse_partitions(args.partitions, config.source.topics or None),
                overwrite=args.overwrite,
                progress=progress,
            )
            engine.lander.leave_jvm_at_exit = True
            _gc_after_startup()
            with _stop_on_signals(engine):
                outcome = engine.run()
    return _finish(outcome)


def _resolved(config: Any) -> Any:
    """``config`` with its table by name placed by Spark's catalog (``ingest status`` and
    ``ingest maintain``; a run's engine does it for ``run`` and ``replay``)."""
    from ingest.engines.landing import resolve_names

    config, engine = resolve_names(config)
    if engine is not None:
        engine.leave_jvm_at_exit = True  # the JVM stops itself when this process ends
    return config


def _status(args: argparse.Namespace) -> int:
    config = _load(args, quiet=True)
    if config is None:
        return 0
    _check_bootstrap(config)
    config = _resolved(config)
    from ingest.supervisor.output.status import collect_status, print_table, render_text

    report = collect_status(config)
    if args.json:
        import json

        print(json.dumps(report, indent=2, default=str))
    elif sys.stdout.isatty():
        from rich.console import Console

        print_table(report, Console(highlight=False, markup=False, emoji=False))
    else:
        print(render_text(report), end="")
    return 0


def _maintain(args: argparse.Namespace) -> int:
    """One maintenance pass over the table and its dead-letter table (no broker needed)."""
    config = _load(args, quiet=True)
    if config is None:
        return 0
    from ingest.engines.landing import resolve_names
    from ingest.engines.spark.spark_session import SparkEngine
    from ingest.supervisor.engine.maintainer import maintain_tables, maintenance_fields

    config, engine = resolve_names(config)
    # Delta Spark maintains the tables ingest commits to through it: the Spark engine,
    # started only for such a table (not with spark.engine = "local").
    spark = engine or (
        None
        if config.spark.engine == "local"
        else SparkEngine(config.spark, storage_options=config.table_storage_options())
    )
    if spark is not None:
        spark.leave_jvm_at_exit = True  # the JVM stops itself when this process ends
    if config.source.topic_pattern and (config.route or "{topic}" in config.table_uri()):
        print(
            "ingest maintain: with topic_pattern and routes or a {topic} table, the topics' "
            "tables are not known without the broker, and none is maintained: list the "
            "topics in source.topics",
            file=sys.stderr,
        )
    try:
        passes = maintain_tables(
            config,
            config.source.topics or (),  # a {topic} or routed table: the topics' tables
            delta_spark=None if spark is None else spark.table_maintenance,
        )
    finally:
        if spark is not None:
            spark.stop()
    report = [maintenance_fields(maintenance) for maintenance in passes]
    if args.json:
        import json

        print(json.dumps(report, indent=2, default=str))
    else:
        for fields in report:
            print(" ".join(f"{key}={value}" for key, value in fields.items()))
    return 0


def _config_schema(args: argparse.Namespace) -> int:
    import json

    from ingest.config import config_schema

    print(json.dumps(config_schema(), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ingest", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"ingest {version('ingest')}")
    commands = parser.add_subparsers(dest="command", required=True)

    def with_config(command: argparse.ArgumentParser) -> None:
        command.add_argument("-c", "--config", required=True, help="the TOML config file")
        command.add_argument(
            "--print-config",
            action="store_true",
            help="print the effective config (secrets masked) and exit",
        )

    run = commands.add_parser("run", help="land the topics in the Delta table (consumer group)")
    with_config(run)
    run.add_argument(
        "--until-end",
        action="store_true",
        help="stop at each partition's end offset as of the start, then commit, leave, exit",
    )
    run.set_defaults(handler=_run)

    replay = commands.add_parser(
        "replay", help="land a range of offsets again (no group, committed offsets untouched)"
    )
    with_config(replay)
    replay.add_argument(
        "--from",
        dest="from_",
        required=True,
        help="earliest | OFFSET | P:OFFSET,... | @EPOCH_MS | ISO-8601 time (e.g. 2026-01-01T00:00:00Z)",
    )
    replay.add_argument(
        "--to",
        default=None,
        help="end, exclusive: latest (default: the end at start) | OFFSET | P:OFFSET,... | "
        "@EPOCH_MS | ISO-8601 time",
    )
    replay.add_argument(
        "--partitions",
        default=None,
        help="which partitions: 0,1,5 or topic:3,... (default: every partition of source.topics)",
    )
    replay.add_argument(
        "--overwrite",
        action="store_true",
        help="append mode: rewrite the rows of the range that are already in the table",
    )
    replay.set_defaults(handler=_replay)

    status = commands.add_parser("status", help="offsets, lag and the group, per partition")
    with_config(status)
    status.add_argument("--json", action="store_true", help="print JSON")
    status.set_defaults(handler=_status)

    maintain = commands.add_parser(
        "maintain",
        help="one maintenance pass over the tables: compaction, checkpoint, log retention, VACUUM",
    )
    with_config(maintain)
    maintain.add_argument("--json", action="store_true", help="print JSON")
    maintain.set_defaults(handler=_maintain)

    schema = commands.add_parser(
        "config-schema",
        help="print the config file's JSON Schema (for TOML editors; docs/configuration.md)",
    )
    schema.set_defaults(handler=_config_schema)

    dev_broker = commands.add_parser(
        "broker", help="run the embedded test broker (Tansu) on a loopback port until Ctrl-C"
    )
    dev_broker.add_argument("--port", type=int, default=None, help="default: a free port")
    dev_broker.add_argument("--storage", choices=["memory", "s3"], default="memory")
    dev_broker.set_defaults(handler=_broker)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line (``argv``: ``sys.argv[1:]`` when None); returns the exit code. The
    process ends as the interpreter ends it: the run has closed everything it started
    (``Engine._close``)."""
    args = build_parser().parse_args(argv)
    try:
        code = int(args.handler(args))
    except ConfigError as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        code = 2
    except IngestError as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
