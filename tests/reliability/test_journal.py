"""journald out of reach: laned without journalctl (as on a host where journald cannot be read).
The lanes still start and become ready (by probing), laned says why in /healthz and on
`laned status`, and `GET /lanes/X/logs` answers 503 with the reason instead of an empty log."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from bench.common import LanedServe
from laned.adapters import journal
from tests.helpers import alive, free_port, wait_until
from tests.integration.conftest import Harness
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures, harness_up, lane_view, notices


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
        said = wait_until(lambda: notices(blind.url), 10, "a notice")
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


def journald_pids() -> list[int]:
    """The journald processes that live (not a killed one's zombie)."""
    found = subprocess.run(["pgrep", "-x", "systemd-journal"], capture_output=True, text=True)
    return [int(pid) for pid in found.stdout.split() if alive(int(pid))]


def test_journald_killed_under_laned_is_said_and_its_return_seen(
    harness: Harness, daemon: Any
) -> None:
    """journald killed while its socket stays (journalctl still follows its files and sees
    nothing new): /healthz says journald is not running; once it is back the notice goes, and
    the lane (its engine's log stream broke with journald) is ready again."""
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n', ports={"a": free_port()})
    pids = journald_pids()
    assert pids, "no journald to kill"
    try:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        assert Path(journal.SOCKET).exists()  # left behind, nobody answers it
        down = wait_until(
            lambda: [n for n in notices(serve.url) if "journald is not running" in n],
            20,
            "a notice that journald is not running",
        )
        assert journal.SOCKET in down[0] and "systemctl start systemd-journald" in down[0]
        status = subprocess.run(
            [sys.executable, "-m", "laned", "status", "--url", serve.url],
            env=harness.env, capture_output=True, text=True, timeout=30,
        )  # fmt: skip
        assert "journald is not running" in status.stdout + status.stderr, status
    finally:
        harness_up(harness)
    wait_until(lambda: not notices(serve.url), 20, "the notice gone with journald back")
    wait_until(
        lambda: lane_view(serve.url, "a")["state"] == "ready", 60, "lane a ready with journald back"
    )
    restarts = httpx.get(f"{serve.url}/lanes/a", timeout=10).json()["restarts"]
    figures("journald-killed", notice_shown=True, shown_by_laned_status=True, cleared=True,
            lane_restarts=restarts)  # fmt: skip
