#!/usr/bin/env python3
"""Where a swap's time goes: laned's share beside the engine's own start and beside the floor
(prints tables, writes JSON, asserts nothing).

    scripts/harness up && scripts/build-sim-image && .venv/bin/python bench/swap.py
        [--swaps 20] [--kinds exec,container,mixed] [--startup 1] [--smoke] [--json FILE]

Two lanes of one group on one port, the simulated engine (exec lanes: a host process; container
lanes: the simulator image under podman; mixed: exec lanes, `a` on the simulator's SGLang face
and `b` on its vLLM face), swapped back and forth. The engine writes its own
milestones with sub-millisecond stamps (LANED_SIM_TIMELINE: process created, main(), port
listening, SIGTERM, exit; laned/sim/timeline.py) and laned's events carry theirs, so each swap
splits into

    request -> `stopping` | stop job (`stopping` -> `inactive`; the old engine's SIGTERM ->
    exit is its own) | gate (`inactive` -> `starting`: container gone, GPU memory, port) |
    start job (`starting` -> engine process created) | engine's own start (process ->
    listening) | listening -> `ready` | `ready` -> the API's answer

and laned's overhead = activate -> `ready` minus the engine's own parts (the new engine's
process -> listening, the old one's SIGTERM -> exit). The same units are swapped without
laned for the floor:

- systemd: one StartUnit job over D-Bus (the unit's Conflicts= stops the other lane in the
  same transaction), then the port watched every millisecond and /v1/models asked;
- by hand: `systemctl --user stop A; systemctl --user start B`, then `curl /health` once a
  second until it answers, as a person types it.

The lanes probe as they do deep in a long cold start (start_interval_min = 5 s, its
default maximum): `ready` then comes from the engine's "Application startup complete" line in
the journal, not from a lucky probe of a short simulated start.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, LanedServe, free_port, harness_env, pct, sim_lane
from laned.adapters import rendered
from laned.adapters.systemd import Systemd
from laned.validation.load import parse_config

PROBE = 'probe = { start_interval_min = "5s", start_interval_max = "5s" }\n'
IMAGE = "localhost/laned-sim:latest"


@dataclass
class Bench:
    """Two lanes `a` and `b` of one group, their config and their engines' timelines."""

    kind: str
    tmp: Path
    env: dict[str, str]
    startup: float
    port: int = field(default_factory=free_port)
    api: int = field(default_factory=free_port)

    def __post_init__(self) -> None:
        self.tag = f"benchswap{os.getpid()}{self.kind[0]}"
        self.units = [f"{self.tag}-{lane}.service" for lane in ("a", "b")]
        self.unit_dir = Path(self.env["XDG_CONFIG_HOME"]) / "systemd" / "user"
        self.path = self.tmp / "laned.toml"
        self.path.write_text(self.config_text())

    def config_text(self) -> str:
        text = (
            f'[daemon]\nunit_dir = "{self.unit_dir}"\nbin_dir = "{self.tmp}/bin"\n'
            f'state_dir = "{self.tmp}/state"\nlisten = "127.0.0.1:{self.api}"\n'
        )
        for lane, unit in zip(("a", "b"), self.units, strict=True):
            extra = f'group = "g"\n{PROBE}'
            if self.kind in ("exec", "mixed"):
                env = f'LANED_SIM_TIMELINE = "{self.tmp}/{lane}.jsonl"\n'
                table = sim_lane(lane, unit, self.port, extra, env, model=str(self.tmp))
                if self.kind == "mixed" and lane == "a":  # SGLang's face (laned/sim/sglang.py)
                    table = table.replace(
                        f'"serve", "{self.tmp}"]', f'"sglang", "--model-path", "{self.tmp}"]'
                    ).replace(f"[lanes.{lane}.exec]", f'engine = "sglang"\n[lanes.{lane}.exec]')
                text += table
                text = text.replace(
                    'LANED_SIM_STARTUP = "1"', f'LANED_SIM_STARTUP = "{self.startup:g}"'
                )
                continue
            text += (
                f'[lanes.{lane}]\nunit = "{unit}"\nport = {self.port}\nserved_model_name = "{lane}"\n{extra}'
                f'env = {{ LANED_SIM_STARTUP = "{self.startup:g}", LANED_SIM_TIMELINE = "/timeline/{lane}.jsonl" }}\n'
                f'[lanes.{lane}.container]\nimage = "{IMAGE}"\nname = "{self.tag}-{lane}"\n'
                f'entrypoint = "vllm"\ncommand = ["serve", "/models/{lane}"]\nnetwork = "host"\n'
                f'volumes = ["{self.tmp}:/timeline"]\n'
            )  # fmt: skip
        return text

    def timeline(self, lane: str, since: float) -> dict[str, float]:
        """The lane's engine milestones at or after `since` (the last of each kind)."""
        path = self.tmp / f"{lane}.jsonl"
        marks: dict[str, float] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                row = json.loads(line)
                if row["at"] >= since - 0.05 or row["what"] == "process":
                    marks[row["what"]] = row["at"]
        return marks

    def watch_exit(self, lane: str) -> ExitWatch | None:
        """Watch the lane's engine process end (exec lanes: the pid is the host's)."""
        return ExitWatch(self.pid(lane)) if self.kind in ("exec", "mixed") else None

    def pid(self, lane: str) -> int:
        rows = (self.tmp / f"{lane}.jsonl").read_text().splitlines()
        return int(json.loads(rows[-1])["pid"])

    def engine_parts(
        self, old: str, new: str, t0: float, gone: ExitWatch | None
    ) -> dict[str, float]:
        """The engines' own parts of a swap begun at t0: the old one's SIGTERM -> process gone
        (exec lanes; container lanes: -> its last line of Python), the new one's process ->
        listening, and the stamps themselves."""
        before, after = self.timeline(old, t0), self.timeline(new, t0)
        return {
            "old_sigterm": before["sigterm"],
            "old_exit": gone.wait() if gone is not None else before["exit"],
            "new_process": after["process"],
            "new_main": after["main"],
            "new_listen": after["listen"],
        }


class ExitWatch:
    """When a process ends, to the microsecond (a pidfd, in a thread)."""

    def __init__(self, pid: int) -> None:
        self.fd = os.pidfd_open(pid)
        self.at = 0.0
        self.thread = threading.Thread(target=self._wait, daemon=True)
        self.thread.start()

    def _wait(self) -> None:
        select.select([self.fd], [], [])
        self.at = time.time()
        os.close(self.fd)

    def wait(self) -> float:
        self.thread.join(30)
        return self.at


def accepts(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def own(parts: dict[str, float]) -> float:
    """The engines' own time in a swap: the old one's exit, the new one's start."""
    return (parts["old_exit"] - parts["old_sigterm"]) + (parts["new_listen"] - parts["new_process"])


# --- laned --------------------------------------------------------------------------------


def transition_at(events: list[dict[str, Any]], since: float, lane: str, to: str) -> float:
    """When the lane's first transition to `to` at or after `since` happened."""
    return next(
        float(e["at"]) for e in events
        if e["lane"] == lane and e["to"] == to and e["kind"] == "transition" and e["at"] >= since
    )  # fmt: skip


def laned_swaps(bench: Bench, swaps: int) -> tuple[list[dict[str, float]], dict[str, float]]:
    """`swaps` swaps, and the first one apart (b's first start: laned knows no earlier cold
    start of it to watch the port closely near its end)."""
    rows = []
    with (
        LanedServe(bench.path, bench.api, bench.env, bench.units) as laned,
        httpx.Client(base_url=laned.url, timeout=180) as client,
    ):
        client.post("/lanes/a/activate", params={"wait": "true"}).raise_for_status()
        for i in range(swaps + 1):
            new, old = ("b", "a") if i % 2 == 0 else ("a", "b")
            gone = bench.watch_exit(old)
            t0 = time.time()
            reply = client.post(f"/lanes/{new}/activate", params={"wait": "true"})
            answered = time.time()
            reply.raise_for_status()
            events = client.get("/events", params={"limit": 60}).json()["events"]
            at = functools.partial(transition_at, events, t0)

            parts = bench.engine_parts(old, new, t0, gone)
            ready = at(new, "ready")
            rows.append(
                {
                    "total": ready - t0,
                    "answered": answered - t0,
                    "overhead": ready - t0 - own(parts),
                    "request_to_stopping": at(old, "stopping") - t0,
                    "stop_job": at(old, "inactive") - at(old, "stopping"),
                    "old_engine_exit": parts["old_exit"] - parts["old_sigterm"],
                    "gate": at(new, "starting") - at(old, "inactive"),
                    "start_job": parts["new_process"] - at(new, "starting"),
                    "engine_start": parts["new_listen"] - parts["new_process"],
                    "listen_to_ready": ready - parts["new_listen"],
                    "ready_to_answer": answered - ready,
                }
            )
    return rows[1:], rows[0]


# --- the floor: the same units without laned -----------------------------------------------


async def systemd_swaps(bench: Bench, swaps: int) -> list[dict[str, float]]:
    """StartUnit over D-Bus (Conflicts= stops the other), the port watched each millisecond."""
    systemd = Systemd(bench.env["DBUS_SESSION_BUS_ADDRESS"])
    await systemd.connect()
    rows = []
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            await systemd.start_unit(bench.units[0])
            await wait_models(client, bench.port)
            for i in range(swaps):
                new, old = ("b", "a") if i % 2 == 0 else ("a", "b")
                gone = bench.watch_exit(old)
                t0 = time.time()
                await systemd.start_unit(bench.units[1 if new == "b" else 0])
                job_done = time.time()
                while not accepts(bench.port):
                    await asyncio.sleep(0.001)
                listening = time.time()
                await wait_models(client, bench.port, new)
                served = time.time()
                parts = bench.engine_parts(old, new, t0, gone)
                rows.append(
                    {
                        "total": served - t0,
                        "overhead": served - t0 - own(parts),
                        "job": job_done - t0,
                        "engine_start": parts["new_listen"] - parts["new_process"],
                        "listen_seen": listening - parts["new_listen"],
                        "listen_to_models": served - parts["new_listen"],
                    }
                )
    finally:
        for unit in bench.units:
            await systemd.stop_unit(unit)
        systemd.disconnect()
    return rows


async def wait_models(client: httpx.AsyncClient, port: int, name: str | None = None) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            reply = await client.get(f"http://127.0.0.1:{port}/v1/models")
            if reply.status_code == 200 and (name is None or name in reply.text):
                return
        except httpx.HTTPError:
            pass
        await asyncio.sleep(0.001)
    raise TimeoutError(f"port {port}: no /v1/models")


def hand_swaps(bench: Bench, swaps: int) -> list[dict[str, float]]:
    """What a person types: stop, start, then curl /health once a second."""
    script = (
        'systemctl --user stop "$1" && systemctl --user start "$2" && '
        'until curl -sf -o /dev/null "http://127.0.0.1:$3/health"; do sleep 1; done'
    )
    subprocess.run(["systemctl", "--user", "start", bench.units[0]], env=bench.env, check=True)
    asyncio.run(_models(bench.port))
    rows = []
    try:
        for i in range(swaps):
            new, old = ("b", "a") if i % 2 == 0 else ("a", "b")
            units = {"a": bench.units[0], "b": bench.units[1]}
            gone = bench.watch_exit(old)
            t0 = time.time()
            subprocess.run(
                ["bash", "-c", script, "swap", units[old], units[new], str(bench.port)],
                env=bench.env, check=True,
            )  # fmt: skip
            served = time.time()
            parts = bench.engine_parts(old, new, t0, gone)
            rows.append({"total": served - t0, "overhead": served - t0 - own(parts)})
    finally:
        subprocess.run(["systemctl", "--user", "stop", *bench.units], env=bench.env, check=False)
    return rows


async def _models(port: int) -> None:
    async with httpx.AsyncClient(timeout=10) as client:
        await wait_models(client, port)


# --- the run ------------------------------------------------------------------------------


def summary(rows: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {
        key: {
            "p50_ms": pct([r[key] for r in rows], 0.5) * 1e3,
            "p95_ms": pct([r[key] for r in rows], 0.95) * 1e3,
            "max_ms": max(r[key] for r in rows) * 1e3,
        }
        for key in rows[0]
    }


def run_kind(kind: str, swaps: int, startup: float, env: dict[str, str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        bench = Bench(kind, Path(tmp), env, startup)
        config = parse_config(bench.path.read_text(), str(bench.path), {"HOME": tmp})
        rendered.apply(config)
        subprocess.run(["systemctl", "--user", "daemon-reload"], env=env, check=True)
        try:
            out: dict[str, Any] = {
                "systemd": summary(asyncio.run(systemd_swaps(bench, swaps))),
                "by_hand": summary(hand_swaps(bench, max(2, swaps // 4))),
            }
            rows, first = laned_swaps(bench, swaps)
            out["laned"] = summary(rows)
            out["laned_first_start"] = {k: round(v * 1e3, 3) for k, v in first.items()}
        finally:
            subprocess.run(["systemctl", "--user", "stop", *bench.units], env=env, check=False)
            for unit in bench.units:
                (bench.unit_dir / unit).unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], env=env, check=False)
    return out


def show(kind: str, result: dict[str, Any], swaps: int) -> None:
    print(f"\n{kind} lanes, {swaps} swaps each way of measuring (by hand: {max(2, swaps // 4)})")
    print(f"  {'':34} {'p50':>9} {'p95':>9} {'max':>9}")
    for who in ("laned", "systemd", "by_hand"):
        for key, row in result[who].items():
            label = f"{who}: {key.replace('_', ' ')}"
            print(
                f"  {label:34} {row['p50_ms']:7.1f}ms {row['p95_ms']:7.1f}ms {row['max_ms']:7.1f}ms"
            )
    first = result["laned_first_start"]
    print(
        f"  laned, a lane's first start (no cold start known): overhead {first['overhead']:.1f}ms, "
        f"listen to ready {first['listen_to_ready']:.1f}ms"
    )
    print(
        f"  laned total - systemd total (p50): {result['laned']['total']['p50_ms'] - result['systemd']['total']['p50_ms']:+.1f}ms"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--swaps", type=int, default=20)
    parser.add_argument("--kinds", default="exec,container")
    parser.add_argument("--startup", type=float, default=1.0, help="simulated cold start (s)")
    parser.add_argument("--smoke", action="store_true", help="two swaps of exec lanes, for CI")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    swaps, kinds = (2, ["exec"]) if args.smoke else (args.swaps, args.kinds.split(","))
    env = {**os.environ, **harness_env()}
    if "container" in kinds:
        subprocess.run([str(ROOT / "scripts" / "build-sim-image")], env=env, check=True)
    result: dict[str, Any] = {"cores": os.cpu_count(), "smoke": args.smoke, "swaps": swaps,
                              "startup_s": args.startup, "date": time.strftime("%Y-%m-%d")}  # fmt: skip
    for kind in kinds:
        result[kind] = run_kind(kind, swaps, args.startup, env)
        show(kind, result[kind], swaps)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
