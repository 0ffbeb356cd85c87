"""Reads while swapping: 1,000 `GET /lanes` a second or more (wrk, 4 connections, each pausing
2 ms between requests) while lanes are swapped back and forth. Every swap and every read is
answered; the swaps' time under the load, against the same swaps without it, is a figure
(asserted on nothing but completion: a noisy machine says nothing about speed)."""

from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx

from tests.helpers import free_port
from tests.reliability.conftest import figures

SWAPS = 6


def swaps(url: str, first: str) -> list[float]:
    took, lane = [], first
    for _ in range(SWAPS):
        lane = "b" if lane == "a" else "a"
        start = time.monotonic()
        reply = httpx.post(f"{url}/lanes/{lane}/activate", params={"wait": "true"}, timeout=120)
        assert reply.status_code == 200, reply.text
        took.append(time.monotonic() - start)
    return took


def test_swaps_under_a_thousand_reads_a_second(daemon: Any, tmp_path: Path) -> None:
    port = free_port()
    serve = daemon(
        {"a": 'restart_sec = "200ms"\n', "b": 'restart_sec = "200ms"\n'},
        daemon_toml='default_lane = "a"\n',
        ports={"a": port, "b": port},
    )
    quiet = swaps(serve.url, "a")  # ends on a (an even number of swaps)
    script = tmp_path / "pace.lua"
    script.write_text("function delay()\n  return 2\nend\n")
    seconds = int(sum(quiet) * 1.5) + 5
    load = subprocess.Popen(
        ["wrk", "-t2", "-c4", f"-d{seconds}s", "-s", str(script), f"{serve.url}/lanes"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    loaded = swaps(serve.url, "a")
    out, _ = load.communicate(timeout=seconds + 30)
    assert load.returncode == 0, out
    rate = float(out.split("Requests/sec:")[1].split()[0])
    assert "Non-2xx" not in out and "Socket errors" not in out, out
    ratio = statistics.median(loaded) / statistics.median(quiet)
    figures("swaps-under-reads", swaps_each=SWAPS, reads_per_s=round(rate), swap_s_quiet=round(statistics.median(quiet), 3),
            swap_s_loaded=round(statistics.median(loaded), 3), ratio=round(ratio, 2))  # fmt: skip
