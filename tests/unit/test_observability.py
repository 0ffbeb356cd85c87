"""The surfaces Prometheus and Grafana read: the dashboard names only metrics that laned or
vLLM (as the simulator exports them) really have, and the alert rules pass promtool's check
and its unit tests (series that fire each alert and series that must not)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any, ClassVar

from laned.api.metrics import LanedMetrics
from laned.sim.metrics import Metrics
from tests.helpers import ROOT

DASHBOARD = ROOT / "docs" / "grafana" / "laned.json"
RULES = ROOT / "docs" / "prometheus" / "laned-rules.yml"
RULE_TESTS = ROOT / "tests" / "prometheus" / "laned-rules.test.yml"
NAME = re.compile(r"\b(laned_[a-z0-9_]+|vllm:[a-z0-9_:]+)")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "gauge": ("",),
    "info": ("_info",),
}


class NoLanes:
    """A LaneSource with no lane: every family still says its name and type."""

    statuses: ClassVar[dict[str, Any]] = {}

    def engine_summary(self, lane: str) -> None:
        return None

    def proxy_counts(self, lane: str) -> dict[str, int]:
        return {"in_flight": 0, "queued": 0}

    def rank_view(self, lane: str) -> None:
        return None


def series_names(exposition: str) -> set[str]:
    """Every series name an exposition's families can have (counter x -> x_total, ...)."""
    names = set()
    for line in exposition.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            base = name.removesuffix("_total") if kind == "counter" else name
            names |= {base + suffix for suffix in SUFFIXES.get(kind, ("",))}
    return names


def exported() -> set[str]:
    laned = LanedMetrics()
    laned.attach(NoLanes())  # type: ignore[arg-type]
    engine = Metrics(model_name="m", spec_decode=True, num_spec_tokens=2)
    return series_names(laned.render().decode()) | series_names(engine.render())


def test_the_dashboard_names_only_metrics_that_exist() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    known = exported()
    queries = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert len(queries) >= 18
    used = {name for query in queries for name in NAME.findall(query)}
    assert used - known == set(), f"queries name metrics nobody exports: {sorted(used - known)}"
    # And the dashboard covers what the issue asks for.
    for needed in (
        "laned_lane_state", "laned_swap_duration_seconds_bucket", "laned_lane_startup_phase_seconds",
        "laned_lane_restarts_total", "laned_engine_exits_total", "laned_lane_stalls_total",
        "laned_check_passed", "vllm:generation_tokens_total", "vllm:num_requests_running",
        "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:time_to_first_token_seconds_bucket",
    ):  # fmt: skip
        assert needed in used, needed
    lane_variable = dashboard["templating"]["list"][1]
    assert NAME.findall(lane_variable["definition"])[0] in known


def test_the_alert_rules_name_only_metrics_that_exist() -> None:
    known = exported()
    used = set(NAME.findall(RULES.read_text()))
    assert used and used - known == set(), sorted(used - known)


def test_promtool_checks_the_rules_and_runs_their_tests() -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (apt-get install prometheus)"
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "SUCCESS: 9 rules found" in check.stdout
    tests = subprocess.run(
        [promtool, "test", "rules", str(RULE_TESTS)], capture_output=True, text=True
    )
    assert tests.returncode == 0, tests.stdout + tests.stderr
