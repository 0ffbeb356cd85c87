"""The user manager restarted under a running laned: re-executed (`systemctl --user
daemon-reexec`), and killed with everything it ran (as systemd, PID 1, takes down a dead
user@.service's processes) and started again. laned keeps answering, says meanwhile that the
manager is out of reach, reconnects, subscribes again, re-adopts the running lane (or starts
the lane that should run again: a new manager runs nothing of the old one's), keeps what the
operator asked for, and says so in the events."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port, wait_until
from tests.integration.conftest import Harness
from tests.integration.lanes import FAST
from tests.reliability.conftest import figures, harness_up, lane_view, notices, unit_property


def descendants(pid: int) -> list[int]:
    """Every process below `pid`, read from /proc while it lives (its orphans are reparented)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_manager(harness: Harness) -> int:
    """SIGKILL the harness's user manager and every process it ran (the user bus, the lanes'
    engines): what PID 1 leaves of a user@.service whose manager died. How many died."""
    manager = int(Path(harness.env["LANED_HARNESS_DIR"], "systemd.pid").read_text())
    doomed = [manager, *descendants(manager)]
    for pid in doomed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return len(doomed)


def said_since(url: str, since: float, kind: str) -> list[str]:
    """The reasons of the events of `kind` since `since` (epoch seconds)."""
    events = httpx.get(f"{url}/events", params={"limit": 500}, timeout=10).json()["events"]
    return [e["reason"] for e in events if e["at"] >= since and e["kind"] == kind]


def test_the_user_manager_reexecuted_then_killed_and_started_again(
    harness: Harness, daemon: Any
) -> None:
    serve = daemon({"a": FAST}, daemon_toml='default_lane = "a"\n', ports={"a": free_port()})
    unit = serve.units[0]
    engine = unit_property(harness, "MainPID", unit)

    # Re-executed: the manager keeps its units; laned re-reads them, keeps the same engine.
    since = time.time()
    harness.systemctl("daemon-reexec")
    reexec = wait_until(
        lambda: said_since(serve.url, since, "manager"), 20, "an event about the re-exec"
    )
    assert len(reexec) == 1, reexec
    assert "the same manager" in reexec[0] and f"{unit} is active (running)" in reexec[0], reexec
    assert lane_view(serve.url, "a")["state"] == "ready"
    assert unit_property(harness, "MainPID", unit) == engine
    assert not said_since(serve.url, since, "transition")  # nothing restarted

    # Killed with what it ran, and started again a while later.
    since, killed = time.time(), time.monotonic()
    try:
        died = kill_manager(harness)
        away = wait_until(
            lambda: [
                n for n in notices(serve.url) if "lost the connection to the user manager" in n
            ],
            20,
            "a notice that the user manager is out of reach",
        )
        refused = httpx.post(f"{serve.url}/lanes/a/restart", timeout=30)
        wait_until(
            lambda: lane_view(serve.url, "a")["state"] != "ready", 20, "the dead engine seen"
        )
    finally:
        harness_up(harness)
    back = wait_until(
        lambda: (v := lane_view(serve.url, "a"))["state"] == "ready" and v,
        60,
        "lane a ready again under the new manager",
    )
    took = time.monotonic() - killed
    assert back["desired"] == "active"
    assert unit_property(harness, "MainPID", unit) not in ("0", engine)
    manager = said_since(serve.url, since, "manager")
    assert any("a new manager" in r and f"{unit} is inactive (dead)" in r for r in manager), manager
    transitions = said_since(serve.url, since, "transition")
    assert any("the user manager that ran it went away" in r for r in transitions), transitions
    assert not notices(serve.url)
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["code"] == "bus-unavailable", refused.text
    figures(
        "user-manager",
        reexec_same_engine=True,
        killed_processes=died,
        notice=away[0][:60],
        restart_while_away=refused.status_code,
        killed_to_ready_s=round(took, 2),
    )
