"""Spark SQL against the test's Hive metastore, from a process of its own: the session's
catalog is a static setting, so the suite's shared Spark session (an in-memory catalog)
cannot be pointed at it.

    python -m tests.delta.catalog_probe <metastore uri> <warehouse> <statement>...

prints one JSON list per statement: its rows, each a dict.
"""

from __future__ import annotations

import json
import sys

from ingest.testing.spark import local_spark_session


def main(argv: list[str]) -> int:
    uri, warehouse, *statements = argv
    spark = local_spark_session(
        master="local[1]",
        extra_conf={
            "spark.sql.catalogImplementation": "hive",
            "spark.hadoop.hive.metastore.uris": uri,
            "spark.sql.warehouse.dir": warehouse,
        },
    )
    answers = [[row.asDict() for row in spark.sql(s).collect()] for s in statements]
    print("PROBE " + json.dumps(answers, default=str))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
