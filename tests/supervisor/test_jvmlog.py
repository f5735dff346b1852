"""The Spark JVM's output into the log: lines joined into records, levels from log4j."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from ingest.engines.spark.jvmlog import JvmLineAssembler, JvmOutputRelay, JvmRecord


def assemble(lines: list[str]) -> list[JvmRecord]:
    assembler = JvmLineAssembler()
    records = [r for line in lines for r in assembler.feed(line)]
    return records + assembler.flush()


def test_a_log4j_line_gives_its_level_and_logger() -> None:
    assert assemble(["26/11/22 02:49:15 WARN Utils: Your hostname resolves to 127.0.0.1\n"]) == [
        JvmRecord(logging.WARNING, "Utils", "Your hostname resolves to 127.0.0.1")
    ]


def test_a_stack_trace_stays_with_its_header_until_the_next_header() -> None:
    records = assemble(
        [
            "26/11/22 02:58:03 ERROR Executor: Exception in task 0.0 in stage 3.0 (TID 3)",
            "org.apache.spark.SparkRuntimeException: boom",
            "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.raiseError(X.scala:3082)",
            "26/11/22 02:58:03 WARN TaskSetManager: Lost task 0.0 in stage 3.0 (TID 3)",
        ]
    )
    assert records == [
        JvmRecord(
            logging.ERROR,
            "Executor",
            "Exception in task 0.0 in stage 3.0 (TID 3)\n"
            "org.apache.spark.SparkRuntimeException: boom\n"
            "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.raiseError(X.scala:3082)",
        ),
        JvmRecord(logging.WARNING, "TaskSetManager", "Lost task 0.0 in stage 3.0 (TID 3)"),
    ]


@pytest.mark.parametrize(
    ("first", "level"),
    [
        ("WARNING: An illegal reflective access operation has occurred", logging.WARNING),
        ("Traceback (most recent call last):", logging.ERROR),
        ('Exception in thread "main" java.lang.OutOfMemoryError', logging.ERROR),
        ("Using Spark's default log4j profile", logging.INFO),
    ],
)
def test_lines_without_a_header_are_the_jvms_at_the_level_their_words_say(
    first: str, level: int
) -> None:
    assert assemble([first, "  more"]) == [JvmRecord(level, "jvm", f"{first}\n  more")]


def test_a_jvm_that_cannot_start_says_so_in_errors_each_its_own_record() -> None:
    records = assemble(
        [
            "Unrecognized VM option 'NoSuchOption'",
            "Error: Could not create the Java Virtual Machine.",
            "Error: A fatal exception has occurred. Program will exit.",
        ]
    )
    assert [(r.level, r.source) for r in records] == [(logging.ERROR, "jvm")] * 3


def test_a_python_traceback_after_a_log4j_line_is_a_record_of_its_own() -> None:
    records = assemble(
        [
            "26/11/22 02:58:03 WARN TaskSetManager: Lost task 0.0",
            "Traceback (most recent call last):",
            '  File "x.py", line 1, in <module>',
            "ValueError: boom",
            "next line",
        ]
    )
    assert records == [
        JvmRecord(logging.WARNING, "TaskSetManager", "Lost task 0.0"),
        JvmRecord(
            logging.ERROR,
            "jvm",
            'Traceback (most recent call last):\n  File "x.py", line 1, in <module>\n'
            "ValueError: boom",
        ),
        JvmRecord(logging.INFO, "jvm", "next line"),
    ]


def test_warnings_every_local_jvm_gives_are_info() -> None:
    records = assemble(
        [
            "WARNING: Using incubator modules: jdk.incubator.vector",
            "26/11/22 02:49:16 WARN NativeCodeLoader: Unable to load native-hadoop library for",
            "26/11/22 02:49:16 WARN MemoryStore: Not enough space to cache rdd_1_0 in memory!",
        ]
    )
    assert [r.level for r in records] == [logging.INFO, logging.INFO, logging.WARNING]


def test_blank_lines_alone_make_no_record() -> None:
    assert assemble(["", "\n", "   "]) == []


def test_every_log4j_level_maps_to_a_logging_level() -> None:
    levels = {
        name: assemble([f"26/11/22 02:49:15 {name} X: m"])[0].level
        for name in ("TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL")
    }
    assert levels == {
        "TRACE": logging.DEBUG,
        "DEBUG": logging.DEBUG,
        "INFO": logging.INFO,
        "WARN": logging.WARNING,
        "ERROR": logging.ERROR,
        "FATAL": logging.CRITICAL,
    }


def test_the_relay_logs_a_real_processs_output_and_ends_with_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    script = (
        "import sys, time\n"
        "print('26/11/22 02:49:15 WARN Utils: on stdout', flush=True)\n"
        "sys.stderr.write('26/11/22 02:49:15 ERROR Executor: failed\\n\\tat X.y(X.java:1)\\n')\n"
        "sys.stderr.flush(); time.sleep(0.3)\n"  # quiet: the record is complete
        "sys.stderr.write('no newline at the end')\n"
    )
    caplog.set_level(logging.DEBUG, logger="spark")
    relay = JvmOutputRelay()
    try:
        child = subprocess.Popen(
            [sys.executable, "-c", script], stdout=relay.write_fd, stderr=subprocess.STDOUT
        )
    finally:
        relay.launched()
    assert child.wait(30) == 0
    assert relay.join(10)  # the pipe's write end died with the child
    got = [
        (r.name, r.levelno, r.getMessage()) for r in caplog.records if r.name.startswith("spark")
    ]
    assert got == [
        ("spark.Utils", logging.WARNING, "on stdout"),
        ("spark.Executor", logging.ERROR, "failed\n\tat X.y(X.java:1)"),
        ("spark.jvm", logging.INFO, "no newline at the end"),
    ]


def test_a_jvm_that_does_not_start_is_an_error_that_quotes_its_output() -> None:
    """In a process of its own: this one may already hold a Spark session."""
    script = (
        "from ingest.config import SparkSection\n"
        "from ingest.errors import SinkError\n"
        "from ingest.engines.spark.spark_session import start_session\n"
        "bad = {'spark.driver.extraJavaOptions': '-XX:MaxHeapFreeRatio=notanumber'}\n"
        "try:\n"
        "    start_session(SparkSection(master='local[1]', conf=bad))\n"
        "except SinkError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the Spark JVM did not start" in done.stdout
    assert "MaxHeapFreeRatio=notanumber" in done.stdout  # the JVM's own words, quoted
