"""A real Prometheus beside the real-vLLM story (tests/vllm/test_real_vllm.py): it scrapes
laned (job `laned`) and the engines laned's /sd names (job `engines`) every second, and at
the end every query of docs/grafana/laned.json is run over the story's span; each must
return series, but those whose feature this host cannot show (said with the reason)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import ROOT, free_port, wait_until

DASHBOARD = ROOT / "docs" / "grafana" / "laned.json"
# Metrics of features this CPU host cannot show: their panels are left out, with the reason.
CANNOT = {
    "laned_gpu_gate_wait_seconds": "the GPU-memory gate needs NVML; this host has no GPU",
    "laned_sleep_mode_duration_seconds": "vLLM's CPU build cannot sleep (platforms/interface.py)",
    "laned_peer_up": "needs a lane over several hosts",
}
VARIABLES = {"$job": ".*", "$instance": ".*", "$lane": ".*", "$model_name": ".*"}


class Prometheus:
    """`prometheus` on a free port, scraping laned at `laned` (host:port) and its /sd."""

    def __init__(self, tmp: Path, laned: str) -> None:
        binary = shutil.which("prometheus")
        assert binary, "prometheus is missing (apt-get install prometheus; scripts/install does)"
        self.port = free_port()
        self.tmp = tmp
        (tmp / "prometheus.yml").write_text(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            "scrape_configs:\n"
            f"  - job_name: laned\n    static_configs: [{{targets: ['{laned}']}}]\n"
            f"  - job_name: engines\n    http_sd_configs: [{{url: 'http://{laned}/sd', refresh_interval: 1s}}]\n"
        )  # fmt: skip
        self.log = (tmp / "prometheus.log").open("w")
        self.process = subprocess.Popen(
            [binary, f"--config.file={tmp / 'prometheus.yml'}", f"--storage.tsdb.path={tmp / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}"],
            stdout=self.log, stderr=self.log,
        )  # fmt: skip
        self.began = time.time()
        wait_until(lambda: self.ready(), 60, "prometheus to answer")

    def ready(self) -> bool:
        try:
            return httpx.get(f"http://127.0.0.1:{self.port}/-/ready", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def series(self, expr: str) -> list[dict[str, Any]]:
        """`expr` over the span since Prometheus started, a point every 2 s."""
        reply = httpx.get(
            f"http://127.0.0.1:{self.port}/api/v1/query_range",
            params={"query": expr, "start": self.began, "end": time.time(), "step": 2},
            timeout=30,
        )
        body = reply.json()
        assert body.get("status") == "success", (expr, body)
        return list(body["data"]["result"])

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(20)
        self.log.close()


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) of every target, the variables as Grafana's "All" (`.*`) and
    $__rate_interval as 4 scrapes would make it; and each variable's own query."""
    dashboard = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"].replace("$__rate_interval", "4s")
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((panel["title"], expr))
    for variable in dashboard["templating"]["list"]:
        found = re.fullmatch(r"label_values\((.+), (\w+)\)", variable.get("definition", ""))
        if found:
            expr = found.group(1)
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            out.append((f"variable {variable['name']}", expr))
    return out


def empty_queries(prometheus: Prometheus) -> tuple[list[str], list[str]]:
    """(the queries that returned no series, those left out with their reason)."""
    empty, left_out = [], []
    for title, expr in dashboard_queries():
        why = next((why for metric, why in CANNOT.items() if metric in expr), None)
        if why is not None:
            left_out.append(f"{title}: {why}")
        elif not prometheus.series(expr):
            empty.append(f"{title}: {expr}")
    return empty, left_out
