"""Routing cost benchmark: what a [[route]] by header or by value field adds to a decode.

1M records (``--records``) of ~100-byte JSON values with a ``type`` header, in windows of
65,536 as the decoder runs them. Timed on the same records:

* ``selected`` with a header condition (``ingest.formats.routes``: the last header of the
  name found with Arrow compute, the regular expression run once per distinct value);
* ``selected`` with a field condition (each value parsed by orjson);
* the peer: ingest's own decode of the same values into their columns
  (``ingest.formats.decode.decode``, format json with a DDL schema), which every routed
  record pays anyway.

    .venv/bin/python scripts/bench/route_select.py [--records 1000000] [--repeat 3]

The last line is ``RESULT header_vs_decode=<ratio> field_vs_decode=<ratio>``: the time of
each test as a fraction of the decode's (lower is cheaper).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ingest.ddl import arrow_schema
from ingest.formats.decode import decode, table_spec
from ingest.formats.routes import selected
from ingest.sink.deadletter import HEADERS_TYPE
from ingest.sink.table_config import Condition, RowSelect, TableConfig

WINDOW = 65_536
KINDS = ("view", "click", "order", "refund")
DDL = "id BIGINT, user STRING, kind STRING, amount DOUBLE, ok BOOLEAN"


def windows(count: int) -> list[pa.Table]:
    out = []
    for start in range(0, count, WINDOW):
        n = min(WINDOW, count - start)
        ids = range(start, start + n)
        values = [
            json.dumps(
                {
                    "id": i,
                    "user": f"user-{i % 9973:05d}",
                    "kind": KINDS[i % 4],
                    "amount": i * 0.25,
                    "ok": i % 3 == 0,
                }
            ).encode()
            for i in ids
        ]
        headers = [[{"key": "type", "value": KINDS[i % 4].encode()}] for i in ids]
        out.append(
            pa.table(
                {
                    "topic": pa.array(["t"] * n, pa.string()),
                    "partition": pa.array([0] * n, pa.int32()),
                    "offset": pa.array(list(ids), pa.int64()),
                    "timestamp": pa.array(
                        [dt.datetime(2026, 1, 1, tzinfo=dt.UTC)] * n,
                        pa.timestamp("us", tz="UTC"),
                    ),
                    "timestamp_type": pa.array([0] * n, pa.int32()),
                    "key": pa.array([None] * n, pa.binary()),
                    "value": pa.array(values, pa.binary()),
                    "headers": pa.array(headers, HEADERS_TYPE),
                }
            )
        )
    return out


def best(repeat: int, run: Callable[[], int]) -> tuple[float, int]:
    times, result = [], 0
    for _ in range(repeat):
        started = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - started)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    parts = windows(args.records)
    size = sum(p.column("value").nbytes for p in parts) / args.records
    print(f"{args.records:,} records, {size:.0f} bytes of value each")

    by_header = RowSelect(Condition(header="type", field=None, matches="order|refund"))
    by_field = RowSelect(Condition(header=None, field="kind", matches="order|refund"))
    schema = arrow_schema(DDL)
    assert schema is not None
    spec = table_spec(
        TableConfig(uri="/x", group="g", value_format="json", value_schema=DDL), schema
    )

    def taken(select: RowSelect) -> int:
        return sum(selected(p, select).true_count for p in parts)  # type: ignore[attr-defined]

    def decoded() -> int:
        return sum(decode(p, spec).rows.num_rows for p in parts)

    header_s, header_n = best(args.repeat, lambda: taken(by_header))
    field_s, field_n = best(args.repeat, lambda: taken(by_field))
    decode_s, rows = best(args.repeat, decoded)
    assert header_n == field_n == args.records // 2, (header_n, field_n)
    assert rows == args.records
    print(f"{'':24}{'seconds':>10}{'records/s':>14}")
    for name, spent in (("header test", header_s), ("field test", field_s), ("decode", decode_s)):
        print(f"{name:24}{spent:10.3f}{args.records / spent:14,.0f}")
    print(
        f"RESULT header_vs_decode={header_s / decode_s:.3f} field_vs_decode={field_s / decode_s:.3f}"
    )


if __name__ == "__main__":
    main()
