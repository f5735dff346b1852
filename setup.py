"""Builds the records kernel (ingest/protocol/recordbatch/_records.c); metadata lives in pyproject.toml."""

import sys

from setuptools import Extension, setup

COMPILE_ARGS = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-Wall", "-Wextra"]

setup(
    ext_modules=[
        Extension(
            "ingest.protocol.recordbatch._records",
            sources=["ingest/protocol/recordbatch/_records.c"],
            extra_compile_args=COMPILE_ARGS,
        )
    ],
    package_data={"ingest.protocol.recordbatch": ["_records.pyi"]},
)
