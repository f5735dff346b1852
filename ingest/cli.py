"""The ``ingest`` command line."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from importlib.metadata import version

from ingest.errors import ConfigError, IngestError


def _broker(args: argparse.Namespace) -> int:
    """Runs the embedded test broker in the foreground until interrupted."""
    from ingest.testing import Broker, S3Server

    s3 = S3Server().start() if args.storage == "s3" else None
    broker = Broker(storage=args.storage, s3=s3, port=args.port).start()
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ingest", description=__doc__)
    parser.add_argument("--version", action="version", version=f"ingest {version('ingest')}")
    commands = parser.add_subparsers(dest="command", required=True)
    dev_broker = commands.add_parser(
        "broker", help="run the embedded test broker (Tansu) on a loopback port until Ctrl-C"
    )
    dev_broker.add_argument("--port", type=int, default=None, help="default: a free port")
    dev_broker.add_argument("--storage", choices=["memory", "s3"], default="memory")
    dev_broker.set_defaults(handler=_broker)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except ConfigError as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        return 2
    except IngestError as exc:
        print(f"ingest: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
