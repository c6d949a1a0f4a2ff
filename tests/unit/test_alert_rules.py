"""The example Prometheus alerting rules are well formed and name only real metrics."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tether import App
from tether.metrics import render

RULES = Path(__file__).parents[2] / "deploy" / "prometheus" / "tether-alerts.yml"
# promtool's unit tests of the rules: series in, alerts expected (or not) out.
RULE_TESTS = RULES.with_name("tether-alerts.test.yml")
DURATION = re.compile(r"^([0-9]+(ms|s|m|h|d|w|y))+$")
METRIC = re.compile(r"\b(tether_[a-z_]+)\b")
SUFFIXES = {"counter": ("", "_total"), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
# Each operator concern has an alert on the metric that measures it.
COVERED = {
    "cancellation failures": "tether_cancellation_failures_total",
    "force kills": "tether_force_kills_total",
    "zombie rescues": "tether_zombies_rescued_total",
    "unserved jobs": "tether_jobs_unserved",
    "heartbeat failures": "tether_heartbeat_failures_total",
    "a queue that stops draining": "tether_job_start_latency_seconds_count",
    "a high cancellation rate": "tether_cancellation_requests_total",
}


def _rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text())
    assert isinstance(doc, dict) and set(doc) == {"groups"}
    rules = []
    for group in doc["groups"]:
        assert set(group) <= {"name", "interval", "rules"} and isinstance(group["name"], str)
        assert isinstance(group["rules"], list) and group["rules"]
        rules += group["rules"]
    return rules


def test_every_rule_has_the_alerting_rule_shape() -> None:
    names = []
    for rule in _rules():
        assert set(rule) <= {"alert", "expr", "for", "keep_firing_for", "labels", "annotations"}
        assert isinstance(rule["alert"], str) and re.fullmatch(
            r"[A-Za-z_][A-Za-z0-9_]*", rule["alert"]
        )
        assert isinstance(rule["expr"], str) and rule["expr"].strip()
        assert rule["expr"].count("(") == rule["expr"].count(")"), rule["alert"]
        if "for" in rule:
            assert DURATION.match(rule["for"]), rule["for"]
        labels, notes = rule.get("labels", {}), rule["annotations"]
        assert labels["severity"] in ("warning", "critical")
        assert all(isinstance(v, str) for v in (*labels.values(), *notes.values()))
        assert {"summary", "description"} <= set(notes)
        names.append(rule["alert"])
    assert len(names) == len(set(names))


async def test_every_metric_the_rules_name_is_one_tether_exposes(sqlite_url: str) -> None:
    app = App(sqlite_url)
    try:
        text = (await render(app)).decode()
    finally:
        await app.close()
    exposed = {
        name + suffix
        for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", text, re.M)
        for suffix in SUFFIXES.get(kind, ("",))
    }
    named = {m for rule in _rules() for m in METRIC.findall(rule["expr"])}
    assert named <= exposed, sorted(named - exposed)
    for concern, metric in COVERED.items():
        assert metric in named, f"no alert covers {concern}"


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_promtool_accepts_the_rules() -> None:
    subprocess.run(["promtool", "check", "rules", str(RULES)], check=True)


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")
def test_the_rules_fire_as_their_promtool_tests_expect() -> None:
    # TetherHighCancellationRate has cases that fire and one that must not.
    subprocess.run(["promtool", "test", "rules", str(RULE_TESTS)], check=True)
