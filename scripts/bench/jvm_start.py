"""The fixed cost of a run: Spark session start and the warm-up job, with JVM options.

    .venv/bin/python scripts/bench/jvm_start.py [--java-options=-XX:...] [--repeat 2]
    .venv/bin/python scripts/bench/jvm_start.py --product   # as `ingest run` starts it

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
from ingest.supervisor.sparksession import ClassDataArchive, start_session
from spark_jobs.job import warm_up
options, product = sys.argv[1], sys.argv[2] == "product"
conf = {"spark.driver.extraJavaOptions": options} if options else {}
section = SparkSection(master="local[2]", conf=conf)
archive = ClassDataArchive.for_section(section) if product else None
began = time.monotonic()
session = start_session(section, archive=archive, light_jit=product)
started = time.monotonic() - began
warm = warm_up(session)
print(f"session_s={started:.2f} warm_up_s={warm:.2f}")
session.stop()
if archive is not None:
    archive.finish()
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--java-options", default="", help="spark.driver.extraJavaOptions")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--product", action="store_true", help="archive + C1, as ingest run")
    args = parser.parse_args()
    print(f"# load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    sessions, warms = [], []
    for _ in range(args.repeat):
        done = subprocess.run(
            [sys.executable, "-c", PROBE, args.java_options, "product" if args.product else ""],
            capture_output=True,
            text=True,
            check=True,
        )
        # The JVM may add warnings (e.g. while dumping a class-data archive).
        line = [x for x in done.stdout.splitlines() if x.startswith("session_s=")][-1]
        print(line, flush=True)
        fields = dict(part.split("=") for part in line.split())
        sessions.append(float(fields["session_s"]))
        warms.append(float(fields["warm_up_s"]))
    print(f"RESULT session_s={min(sessions):.2f} warm_up_s={min(warms):.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
