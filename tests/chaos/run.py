"""``scripts/chaos``: rerun fault-injection cases by seed.

    scripts/chaos --list
    scripts/chaos kill-worker --seed 3            one run
    scripts/chaos kill-worker --seed 0 --runs 10  seeds 0..9
    scripts/chaos all --seed 0 --runs 10          every case
    scripts/chaos host-cut --seed 0 --runs 10     a case on namespace hosts (root)

``all`` is every case: those on one machine's loopback, then the host cases
(tests/chaos/host_cases.py) on network-namespace hosts made for them, where namespaces can
be made (root, iproute2); elsewhere it says why it leaves the host cases out.

Prints one line per run and a Markdown summary; exits 1 if any run was not exact.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path

from ingest.testing import KafkaCluster, S3Server
from tests.chaos.cases import CASES, ChaosEnv, Outcome
from tests.chaos.host_cases import HOST_CASES, HostSite, start_site


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/chaos",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("case", nargs="?", help="a case name, or 'all'")
    parser.add_argument("--seed", type=int, default=0, help="the first seed (default 0)")
    parser.add_argument("--runs", type=int, default=1, help="how many seeds from --seed")
    parser.add_argument("--list", action="store_true", help="list the cases and exit")
    parser.add_argument("--work", type=Path, default=None, help="keep run directories here")
    args = parser.parse_args(argv)
    if args.list or not args.case:
        for name, case in {**CASES, **HOST_CASES}.items():
            print(f"{name:22} {(case.__doc__ or '').split(chr(10))[0]}")
        return 0
    names = [*CASES, *HOST_CASES] if args.case == "all" else [args.case]
    unknown = [n for n in names if n not in CASES and n not in HOST_CASES]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; see --list")
    if args.case == "all":
        from ingest.testing import netns

        why = netns.unavailable()
        if why is not None:
            print(f"host cases left out ({', '.join(HOST_CASES)}): {why}", flush=True)
            names = [n for n in names if n not in HOST_CASES]
    work = args.work or Path(tempfile.mkdtemp(prefix="ingest-chaos-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"work directory: {work}", flush=True)
    outcomes: list[Outcome] = []
    seeds = range(args.seed, args.seed + args.runs)
    loopback = [n for n in names if n in CASES]
    if loopback:
        outcomes += _loopback_runs(loopback, seeds, work)
    on_hosts = [n for n in names if n in HOST_CASES]
    if on_hosts:
        site: HostSite = start_site()
        try:
            for name in on_hosts:
                for seed in seeds:
                    outcomes.append(_host_run(name, site, work, seed))
        finally:
            site.stop()
    return _summary(names, outcomes)


def _loopback_runs(names: list[str], seeds: range, work: Path) -> list[Outcome]:
    """The cases on loopback: one broker for all, S3 and a 3-node cluster when asked."""
    from ingest.testing.spark import local_spark_session

    s3: list[S3Server] = []
    three: list[KafkaCluster] = []

    def start_s3() -> S3Server:
        s3.append(S3Server().start())
        return s3[0]

    def start_cluster() -> KafkaCluster:
        three.append(KafkaCluster(3).start())
        return three[0]

    outcomes: list[Outcome] = []
    with KafkaCluster() as broker:
        env = ChaosEnv(work, broker, local_spark_session, start_s3, start_cluster)
        try:
            for name in names:
                for seed in seeds:
                    began = time.monotonic()
                    try:
                        outcome = CASES[name](env, seed)
                    except Exception as exc:
                        outcome = Outcome(name, seed, "(the case could not run)")
                        outcome.seconds = time.monotonic() - began
                        outcome.notes.append(f"{type(exc).__name__}: {str(exc)[:500]}")
                        traceback.print_exc()
                    outcomes.append(outcome)
                    print(outcome.line(), flush=True)
        finally:
            for server in s3:
                server.cleanup()
            for cluster in three:
                cluster.cleanup()
    return outcomes


def _host_run(name: str, site: HostSite, work: Path, seed: int) -> Outcome:
    began = time.monotonic()
    try:
        outcome = HOST_CASES[name](site, work, seed)
    except Exception as exc:
        outcome = Outcome(name, seed, "(the case could not run)")
        outcome.seconds = time.monotonic() - began
        outcome.notes.append(f"{type(exc).__name__}: {str(exc)[:500]}")
        traceback.print_exc()
    print(outcome.line(), flush=True)
    return outcome


def _summary(names: list[str], outcomes: list[Outcome]) -> int:
    print(
        "\n| case | runs | exact | not exact | with problems | seconds per run |"
        "\n|---|---|---|---|---|---|"
    )
    for name in names:
        mine = [o for o in outcomes if o.case == name]
        good = sum(o.exact for o in mine)
        troubled = sum(bool(o.problems) for o in mine)
        mean = sum(o.seconds for o in mine) / max(len(mine), 1)
        print(f"| {name} | {len(mine)} | {good} | {len(mine) - good} | {troubled} | {mean:.0f} |")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
