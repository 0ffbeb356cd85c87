#!/usr/bin/env python3
"""A lane over two hosts killed, ready again: from disk (no weight cache) against from each
host's weight-cache daemon, and when a daemon dies (prints figures, writes JSON, asserts
nothing). Two laned in two network namespaces with a veth pair, each with its own user
manager, as tests/integration/test_two_hosts.py sets them up (root, iproute2, nsenter):

    sudo .venv/bin/python bench/two_hosts.py [--rounds 3] [--startup 8] [--json F]

The simulator plays both ranks and both hosts' daemons (laned/sim/ranks.py,
laned/sim/preload.py). Each round SIGUSR1s the worker's engine (it dies with status 0; the
head's dies with it) and times from the kill until both hosts' laned put the lane `ready`
again, by their own events (one clock: the hosts share a machine). `w` reads its weights at
every start; `wc` maps them from its host's daemon. Last, the worker's daemon is SIGKILLed:
both hosts' daemons start again (their group forms once) and the start is a cold one. The
simulator's start lasts --startup seconds, half of them the weight phase; the daemon's load,
the same half.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.helpers import wait_until
from tests.integration.test_two_hosts import (
    Host,
    can_run,
    config,
    kill_worker_engine,
    machines,
    ready_after,
    start_laned,
    state,
)

MASTER = 29655  # w's engine rendezvous; wc's is + 10, its daemons' + 20 (config())


def both_ready(a: Host, b: Host, lane: str) -> bool:
    return state(a, lane) == "ready" and state(b, lane) == "ready"


def engine_rounds(a: Host, b: Host, lane: str, master: int, rounds: int) -> list[float]:
    """Kill the worker's engine `rounds` times; seconds until both ranks were ready again."""
    out = []
    for _ in range(rounds):
        restarts = b.lane(lane)["restarts"]
        since = time.time()
        kill_worker_engine(master)
        wait_until(lambda n=restarts: b.lane(lane)["restarts"] > n and both_ready(a, b, lane), 120, "ready")  # type: ignore[misc]  # fmt: skip
        out.append(round(ready_after((a, b), lane, since), 3))
        time.sleep(1.5)  # the head's next look at its worker
    return out


def bench(rounds: int, startup: float) -> dict[str, Any]:
    results: dict[str, Any] = {"startup_s": startup, "rounds": rounds}
    with machines() as (a, b), tempfile.TemporaryDirectory() as tmp:
        for host in (a, b):
            path = config(Path(tmp), host, MASTER, startup=startup, cached=startup)
            start_laned(host, path, Path(tmp) / f"{host.name}.log")
        try:
            for lane, master, name in (
                ("w", MASTER, "engine_death_from_disk"),
                ("wc", MASTER + 10, "engine_death_from_cache"),
            ):
                since = time.time()
                assert a.api("POST", f"/lanes/{lane}/activate")["status"] == 202
                wait_until(lambda lane=lane: both_ready(a, b, lane), 120, f"{lane} ready")  # type: ignore[misc]
                results[f"{lane}_activation_s"] = round(ready_after((a, b), lane, since), 3)
                time.sleep(1.5)
                rows = engine_rounds(a, b, lane, master, rounds)
                results[name] = {"rounds": rows, "median_s": statistics.median(rows)}
                print(f"{name}: {results[name]}", flush=True)
            restarts = a.lane("wc")["restarts"]
            since = time.time()
            unit = b.lane("wc")["weight_cache"]["unit"]
            b.run("systemctl", "--user", "kill", "--signal=SIGKILL", unit)
            wait_until(lambda: a.lane("wc")["restarts"] > restarts and both_ready(a, b, "wc"), 120, "wc again")  # fmt: skip
            results["daemon_death_cold_s"] = round(ready_after((a, b), "wc", since), 3)
            results["head_last_starts_s"] = a.lane("wc")["last_starts"]
            print(f"daemon_death_cold_s: {results['daemon_death_cold_s']}", flush=True)
        finally:
            for host in (a, b):
                if host.laned is not None:
                    host.laned.terminate()
                    host.laned.wait(30)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--startup", type=float, default=8.0, help="the simulator's cold start, s")
    parser.add_argument("--json")
    args = parser.parse_args()
    if not can_run():
        sys.exit("bench/two_hosts.py: network namespaces need root, iproute2 and nsenter")
    results = bench(args.rounds, args.startup)
    results["date"] = time.strftime("%Y-%m-%d")
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
