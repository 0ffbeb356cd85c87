"""journald out of reach: laned without journalctl (as on a host where journald cannot be read).
The lanes still start and become ready (by probing), laned says why in /healthz and on
`laned status`, and `GET /lanes/X/logs` answers 503 with the reason instead of an empty log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from bench.common import LanedServe
from tests.helpers import free_port, wait_until
from tests.integration.conftest import Harness
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures


def test_without_journald_lanes_still_start_and_laned_says_why(
    harness: Harness, daemon: Any, tmp_path: Path
) -> None:
    serve = daemon({"a": FAST}, ready=0, ports={"a": free_port()})
    serve.kill()  # the same config and units, started again without journalctl on its PATH
    blind = LanedServe(
        serve.path, serve.api, {**harness.env, "PATH": str(tmp_path / "nothing")}, serve.units
    )
    blind.__enter__()
    try:
        ready = httpx.post(f"{blind.url}/lanes/a/activate", params={"wait": "true"}, timeout=60)
        assert ready.status_code == 200, ready.text
        said = wait_until(
            lambda: httpx.get(f"{blind.url}/healthz", timeout=10).json()["notices"], 10, "a notice"
        )
        assert any("journalctl is not on laned's PATH" in n for n in said), said
        logs = httpx.get(f"{blind.url}/lanes/a/logs", timeout=10)
        assert logs.status_code == 503 and logs.json()["error"]["code"] == "journal-unavailable", (
            logs.text
        )
    finally:
        blind.kill()  # the fixture stops the units, with systemctl on its PATH
    figures(
        "journald-unreachable", lane_ready=True, notice_shown=True, logs_answer=logs.status_code
    )
