"""The fixed cost of a run: Spark session start and the warm-up job, with JVM options.

    .venv/bin/python scripts/bench/jvm_start.py [--java-options=-XX:...] [--repeat 2]
    .venv/bin/python scripts/bench/jvm_start.py --product   # as `ingest run` starts it
    .venv/bin/python scripts/bench/jvm_start.py --delta both [--product]

``--delta`` (on by default, as every session ingest starts): Delta's jars, SQL extensions
and catalog and S3A (``ingest.spark_env``); ``off`` starts bare pyspark; ``both`` alternates
the two in one run and prints their ratio (``RESULT ... delta_vs_plain=``).

``--product`` starts the session the way the supervisor does: the class-data archive
from ~/.cache/ingest/jvm (recorded by the first such run if missing) and C1 only.

Each repeat is a fresh process (a JVM starts once per process). Prints one line per
repeat and a ``RESULT`` line with the best of each.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

PROBE = """
import os, sys, time
from ingest.config import SparkSection
from ingest.spark_env import session_settings
from ingest.engines.spark.spark_session import ClassDataArchive, start_session
from ingest.engines.spark.job import warm_up
options, product, delta = sys.argv[1], sys.argv[2] == "product", sys.argv[3] == "on"
conf = {"spark.driver.extraJavaOptions": options} if options else {}
section = SparkSection(master="local[2]", conf=conf)
began = time.monotonic()
environment = session_settings() if delta else {}
resolved = time.monotonic() - began
classpath = environment.get("spark.driver.extraClassPath", "")
archive = ClassDataArchive.for_section(section, classpath=classpath) if product else None
began = time.monotonic()
session, _ = start_session(section, archive=archive, light_jit=product, environment=environment)
started = time.monotonic() - began
warm = warm_up(session)
print(f"session_s={started:.2f} warm_up_s={warm:.2f} jars_s={resolved:.2f}")
session.stop()
if archive is not None:
    archive.finish()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--java-options", default="", help="spark.driver.extraJavaOptions")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--product", action="store_true", help="archive + C1, as ingest run")
    parser.add_argument("--delta", choices=["on", "off", "both"], default="on")
    args = parser.parse_args()
    print(f"# load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    kinds = ["off", "on"] if args.delta == "both" else [args.delta]
    sessions: dict[str, list[float]] = {kind: [] for kind in kinds}
    warms: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(args.repeat):
        for kind in kinds:
            argv = [sys.executable, "-c", PROBE, args.java_options]
            argv += ["product" if args.product else "", kind]
            done = subprocess.run(argv, capture_output=True, text=True, check=True)
            # The JVM may add warnings (e.g. while dumping a class-data archive).
            line = [x for x in done.stdout.splitlines() if x.startswith("session_s=")][-1]
            print(f"delta={kind} {line}", flush=True)
            fields = dict(part.split("=") for part in line.split())
            sessions[kind].append(float(fields["session_s"]))
            warms[kind].append(float(fields["warm_up_s"]))
    result = " ".join(
        f"{kind}_session_s={min(sessions[kind]):.2f} {kind}_warm_up_s={min(warms[kind]):.2f}"
        for kind in kinds
    )
    if args.delta == "both":
        ratio = (min(sessions["on"]) + min(warms["on"])) / (
            min(sessions["off"]) + min(warms["off"])
        )
        result += f" delta_vs_plain={ratio:.2f}"
    print(f"RESULT {result}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
