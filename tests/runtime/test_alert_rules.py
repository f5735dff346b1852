"""The shipped monitoring (deploy/monitoring/): Prometheus alerting rules, their unit tests,
the Grafana dashboard.

- promtool (Debian's ``prometheus`` package, fetched into the cache by ``debian_tool``; the
  ``promtool`` fixture skips naming why when it cannot be had) checks the rules and runs
  their unit tests (``ingest-alerts.test.yml``: each alert fires on series that should fire
  it, with its labels and annotations, and stays quiet on series that should not).
- Every alert's tests can fail: with its expression made to never fire, or to always fire,
  ``promtool test rules`` fails, naming that alert and no other.
- The dashboard's queries are valid PromQL (promtool checks them as recording rules).
- Every metric name the rules, their unit tests and the dashboard use is one a live
  ``ingest run`` exports: ingest runs against Apache Kafka with ``[metrics] listen``, its
  ``/metrics`` is scraped and parsed, and each selector's name, label matchers and grouping
  labels are looked up in it (job, instance and group are the scrape target's labels);
  promtool's ``check metrics`` lints that scrape.
- A partition that moves to another member leaves no lag or offset gauges on its former
  owner, where they would stop moving and fire the stall and lag alerts.
"""

from __future__ import annotations

import copy
import json
import re
import subprocess
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from ingest.supervisor.modes.group_run import group_run
from ingest.testing import KafkaCluster, ProducedRecord, create_topic, produce
from tests.runtime.promql_refs import References, label_values, references
from tests.runtime.support import ROOT, InProcess, config, wait_until, write_config

MONITORING = ROOT / "deploy" / "monitoring"
RULES = MONITORING / "ingest-alerts.yml"
RULE_TESTS = MONITORING / "ingest-alerts.test.yml"
DASHBOARD = MONITORING / "ingest-dashboard.json"
OPERATIONS = ROOT / "docs" / "operations.md"
# Labels Prometheus puts on every series of a target: not ingest's to export.
TARGET_LABELS = {"job", "instance", "group"}
# What Grafana puts in a query before Prometheus sees it.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__range": "6h", "$__interval": "1m"}


def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load(RULES.read_text())
    return [rule for group in document["groups"] for rule in group["rules"]]


def alerts() -> list[str]:
    return [rule["alert"] for rule in rules()]


def dashboard_panels() -> Iterator[dict[str, Any]]:
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def dashboard_queries() -> list[str]:
    return [target["expr"] for panel in dashboard_panels() for target in panel.get("targets", [])]


def dashboard_variable_queries() -> list[str]:
    variables = json.loads(DASHBOARD.read_text())["templating"]["list"]
    return [v["query"]["query"] for v in variables if v["type"] == "query"]


def run_promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool), *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False
    )


# -- the rules, with promtool -----------------------------------------------------------


def test_promtool_from_debian_runs(promtool: Path) -> None:
    result = run_promtool(promtool, "--version", cwd=MONITORING)
    assert result.returncode == 0, result.stderr
    assert re.match(r"promtool, version \d+\.\d+", result.stdout + result.stderr), result


def test_promtool_checks_the_rules(promtool: Path) -> None:
    result = run_promtool(promtool, "check", "rules", RULES.name, cwd=MONITORING)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules())} rules found" in result.stdout, result.stdout


def test_the_rules_unit_tests_pass(promtool: Path) -> None:
    result = run_promtool(promtool, "test", "rules", RULE_TESTS.name, cwd=MONITORING)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout, result.stdout


def test_each_alert_is_tested_firing_and_quiet() -> None:
    """Each alert has a check where it fires and one where it must not (an empty
    ``exp_alerts``); series in a firing check that are not expected fail it too."""
    document = yaml.safe_load(RULE_TESTS.read_text())
    firing: set[str] = set()
    quiet: set[str] = set()
    for test in document["tests"]:
        for check in test["alert_rule_test"]:
            (firing if check.get("exp_alerts") else quiet).add(check["alertname"])
            for expected in check.get("exp_alerts") or []:
                annotations = expected["exp_annotations"]  # every fired alert's text is checked
                assert set(annotations) == {"summary", "description", "runbook_url"}, check
    assert firing == set(alerts()) and quiet == set(alerts()), (firing, quiet)


def mutated(rules_text: str, alert: str, expr: str) -> str:
    document = yaml.safe_load(rules_text)
    changed = copy.deepcopy(document)
    (rule,) = [r for g in changed["groups"] for r in g["rules"] if r.get("alert") == alert]
    rule["expr"] = expr
    return yaml.safe_dump(changed, sort_keys=False)


def test_each_alerts_tests_fail_when_it_never_or_always_fires(
    promtool: Path, tmp_path: Path
) -> None:
    """The unit tests are not vacuous: an alert whose expression is replaced by one that
    never fires (``vector(1) < 0``) or always fires (``vector(1)``) fails them, and only
    the checks of that alert fail. (Each run holds the unit tests that check that alert.)"""
    text = RULES.read_text()
    unit_tests = yaml.safe_load(RULE_TESTS.read_text())
    cases = [
        (alert, kind, expr)
        for alert in alerts()
        for kind, expr in (("never", "vector(1) < 0"), ("always", "vector(1)"))
    ]

    def run(case: tuple[str, str, str]) -> tuple[str, str, subprocess.CompletedProcess[str]]:
        alert, kind, expr = case
        folder = tmp_path / f"{alert}-{kind}"
        folder.mkdir()
        (folder / RULES.name).write_text(mutated(text, alert, expr))
        mine = [
            test
            for test in unit_tests["tests"]
            if any(check["alertname"] == alert for check in test["alert_rule_test"])
        ]
        document = dict(unit_tests, tests=mine)
        (folder / RULE_TESTS.name).write_text(yaml.safe_dump(document, sort_keys=False))
        return alert, kind, run_promtool(promtool, "test", "rules", RULE_TESTS.name, cwd=folder)

    with ThreadPoolExecutor(max_workers=2) as pool:
        outcomes = list(pool.map(run, cases))
    for alert, kind, result in outcomes:
        output = result.stdout + result.stderr
        assert result.returncode != 0, f"{alert} made to {kind} fire passed its tests"
        failed = set(re.findall(r"alertname: (\w+)", output))
        assert failed == {alert}, (alert, kind, output[-3000:])


def test_each_alert_has_a_severity_annotations_and_a_runbook_in_the_docs() -> None:
    docs = OPERATIONS.read_text()
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", heading.strip().lower()).replace(" ", "-")
        for heading in re.findall(r"^#+ (.+)$", docs, re.MULTILINE)
    }
    for rule in rules():
        name = rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, name
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page == "docs/operations.md" and anchor == name.lower(), name
        assert anchor in anchors, f"docs/operations.md has no heading {name}"
        # The doc's section shows the expression as shipped.
        assert rule["expr"] in docs, f"docs/operations.md does not show {name}'s expression"
        description = annotations["description"]
        assert "$labels.instance" in description and "$labels.group" in description, name
        labels = set(references(rule["expr"]).grouping) | metric_labels_in(rule["expr"])
        if {"topic", "partition"} <= labels:
            assert "$labels.topic" in description and "$labels.partition" in description


def metric_labels_in(expr: str) -> set[str]:
    """The per-partition labels when the expression reads a per-partition series."""
    names = references(expr).names
    per_partition = {
        "ingest_partition_lag",
        "ingest_partition_committed_offset",
        "ingest_partition_failed",
    }
    return {"topic", "partition"} if names & per_partition else set()


# -- the dashboard ----------------------------------------------------------------------


def test_the_dashboard_has_its_sections_and_well_formed_panels() -> None:
    board = json.loads(DASHBOARD.read_text())
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ["Group overview", "Lag", "Throughput", "Health", "Dead letters"]
    panels = list(dashboard_panels())
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids repeat"
    names = {v["name"] for v in board["templating"]["list"]}
    assert names == {"datasource", "job", "group", "instance"}
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["targets"], panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}", panel["title"]
            for variable in ("$job", "$group", "$instance"):
                assert variable in target["expr"], (panel["title"], target["expr"])


def test_the_dashboard_queries_are_valid_promql(promtool: Path, tmp_path: Path) -> None:
    recording = []
    for number, expr in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(variable, value)
        expr = re.sub(r"\$\w+", ".*", expr)  # $job, $group, $instance: "All"
        recording.append({"record": f"dashboard:query_{number}", "expr": expr})
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": recording}]}))
    result = run_promtool(promtool, "check", "rules", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(recording)} rules found" in result.stdout


def test_the_promql_reader_finds_names_labels_and_groupings() -> None:
    """The reader the live check below relies on: it must find every name (else that
    check passes on nothing)."""
    found = references(
        'histogram_quantile(0.9, sum by (stage, le) (rate(a_bucket{stage="commit", '
        'job=~"$job"}[$__rate_interval]))) > 30 and on (instance) b offset 5m '
        '/ ignoring(x) {__name__="c", d!~"e.*"} unless count_values("v", f)'
    )
    assert found.names == {"a_bucket", "b", "c", "f"}
    assert found.grouping == {"stage", "le", "instance", "x"}
    by_name = {s.name: s.matchers for s in found.selectors}
    assert by_name["a_bucket"] == (("stage", "=", "commit"), ("job", "=~", "$job"))
    assert by_name["c"] == (("d", "!~", "e.*"),)
    selector, label = label_values('label_values(m{job=~"$job"}, instance)')
    assert selector.names == {"m"} and label == "instance"
    for rule in rules():
        assert references(rule["expr"]).names, rule["alert"]
    for expr in dashboard_queries():
        assert references(expr).names, expr


# -- against a live scrape --------------------------------------------------------------

Scraped = Mapping[str, list[dict[str, str]]]


def scrape(address: str) -> tuple[str, dict[str, list[dict[str, str]]], dict[str, str]]:
    """The exposition text, each sample name's label sets, and each family's type."""
    text = urllib.request.urlopen(f"http://{address}/metrics", timeout=10).read().decode()
    samples: dict[str, list[dict[str, str]]] = {}
    kinds: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append(dict(sample.labels))
            kinds[sample.name] = family.type
    return text, samples, kinds


def unexported(found: References, samples: Scraped, kinds: Mapping[str, str]) -> list[str]:
    """What ``found`` uses that the scrape does not hold."""
    missing: list[str] = []
    labels_seen: set[str] = set(TARGET_LABELS)
    for selector in found.selectors:
        if selector.name not in samples:
            missing.append(f"metric {selector.name}")
            continue
        kind = kinds[selector.name]
        if selector.name.endswith(("_bucket", "_sum", "_count")) and kind != "histogram":
            missing.append(f"{selector.name} is a {kind}, not a histogram")
        label_sets = samples[selector.name]
        labels_seen |= {label for labels in label_sets for label in labels}
        for label, operator, value in selector.matchers:
            if label in TARGET_LABELS:
                continue
            values = {labels[label] for labels in label_sets if label in labels}
            if not values:
                missing.append(f"label {label} on {selector.name}")
            elif operator == "=" and value not in values:
                missing.append(f'{selector.name}{{{label}="{value}"}} (has {sorted(values)})')
            elif (
                operator == "=~"
                and "$" not in value
                and not any(re.fullmatch(value, v) for v in values)
            ):
                missing.append(f'{selector.name}{{{label}=~"{value}"}}')
    missing += [f"grouping label {label}" for label in found.grouping - labels_seen]
    return missing


def test_rules_and_dashboard_use_only_what_a_live_ingest_exports(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path, promtool: Path
) -> None:
    create_topic(broker.bootstrap, topic, partitions=2)
    values = [b'{"id": %d}' % n if n % 50 else b"{not json" for n in range(200)]
    produce(
        broker.bootstrap,
        topic,
        [ProducedRecord(value, partition=n % 2) for n, value in enumerate(values)],
    )
    good = sum(1 for value in values if value.startswith(b'{"'))
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={
            "metrics": {"listen": "127.0.0.1:0"},
            "table.value": {"format": "json", "schema": "id BIGINT"},
        },
    )
    engine = group_run(config(path))
    run = InProcess(engine)
    try:
        wait_until(lambda: engine.metrics_address is not None, 30, "the metrics endpoint")
        wait_until(
            lambda: engine.metrics.value("ingest_rows_written_total") == good, 60, "the rows"
        )
        text, samples, kinds = scrape(str(engine.metrics_address))
    finally:
        run.stop()
    (tmp_path / "scrape.txt").write_text(text)
    # A scrape of a run that landed rows and dead letters on two partitions.
    assert engine.metrics.value("ingest_dead_letters_total") == len(values) - good
    partitions = {labels["partition"] for labels in samples["ingest_partition_lag"]}
    assert partitions == {"0", "1"}, samples["ingest_partition_lag"]

    problems: dict[str, list[str]] = {}
    for rule in rules():
        found = references(rule["expr"])
        missing = unexported(found, samples, kinds)
        used = set(re.findall(r"\$labels\.(\w+)", json.dumps(rule["annotations"])))
        metric = {k for name in found.names for labels in samples.get(name, []) for k in labels}
        missing += [f"$labels.{x}" for x in sorted(used - metric - TARGET_LABELS)]
        if missing:
            problems[rule["alert"]] = missing
    for expr in dashboard_queries():
        missing = unexported(references(expr), samples, kinds)
        if missing:
            problems[expr] = missing
    for query in dashboard_variable_queries():
        found, label = label_values(query)
        missing = unexported(found, samples, kinds)
        if label not in TARGET_LABELS:
            missing.append(f"variable label {label}")
        if missing:
            problems[query] = missing
    # The unit tests' series: names exported, labels the metric's own or the target's.
    for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for item in test["input_series"]:
            name, _, rest = item["series"].partition("{")
            labels = set(re.findall(r"(\w+)=", rest))
            if name not in samples:
                problems.setdefault("unit tests", []).append(f"series {name}")
                continue
            exported = {k for labels_ in samples[name] for k in labels_}
            if labels - exported - TARGET_LABELS:
                problems.setdefault("unit tests", []).append(
                    f"{name} with {sorted(labels - exported - TARGET_LABELS)}"
                )
    assert not problems, problems

    # Prometheus' own linter on the live exposition.
    lint = subprocess.run(
        [str(promtool), "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_a_partition_that_moves_to_another_member_leaves_no_gauges_on_the_first(
    broker: KafkaCluster, topic: str, group: str, tmp_path: Path
) -> None:
    """Its former owner stops reporting its lag and offsets (else IngestPartitionStalled and
    the lag alerts would fire there on a lag that stopped moving); its counters stay."""
    create_topic(broker.bootstrap, topic, partitions=2)
    produce(
        broker.bootstrap,
        topic,
        [ProducedRecord(b'{"id": %d}' % n, partition=n % 2) for n in range(100)],
    )
    path = write_config(
        tmp_path / "run.toml",
        bootstrap=broker.bootstrap,
        topic=topic,
        group=group,
        table=tmp_path / "table",
        sections={"table.value": {"format": "json", "schema": "id BIGINT"}},
    )
    first_engine = group_run(config(path))
    first = InProcess(first_engine)
    second: InProcess | None = None
    try:
        wait_until(lambda: len(first.partitions()) == 2, 30, "the first to own both")
        wait_until(
            lambda: first_engine.metrics.value("ingest_rows_written_total") == 100, 30, "rows"
        )
        joined = second = InProcess(group_run(config(path)))
        wait_until(
            lambda: len(first.partitions()) == 1 and len(joined.partitions()) == 1,
            30,
            "one partition each",
        )
        (kept,) = first.partitions()
        (moved,) = joined.partitions()

        def first_reports() -> set[tuple[str, str]]:
            text = first_engine.metrics.render()
            return {
                (sample.name, sample.labels["partition"])
                for family in text_string_to_metric_families(text)
                for sample in family.samples
                if sample.labels.get("topic") == topic
            }

        wait_until(
            lambda: ("ingest_partition_lag", str(moved)) not in first_reports(),
            10,
            "the first to drop the moved partition's lag",
        )
        reported = first_reports()
        for name in (
            "ingest_partition_lag",
            "ingest_partition_end_offset",
            "ingest_partition_committed_offset",
            "ingest_partition_durable_offset",
            "ingest_partition_failed",
        ):
            assert (name, str(kept)) in reported and (name, str(moved)) not in reported, name
        assert ("ingest_records_consumed_total", str(moved)) in reported  # what it did
    finally:
        first.stop()
        if second is not None:
            second.stop()
