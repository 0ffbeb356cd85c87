#!/usr/bin/env python3
"""laned's own cost where it does not depend on an engine's speed (prints tables, writes JSON,
asserts nothing):

    scripts/harness up && .venv/bin/python bench/cost.py [scrape] [footprint] [scale]
        [--smoke] [--json FILE]

- scrape: an engine's /metrics as big as a real vLLM's (~200 KB: every histogram per engine
  of a data-parallel server), fetched over HTTP and parsed as laned parses it; the cost of
  one scrape and laned's CPU share at the default probe interval (5 s).
- footprint: `laned serve` left idle for a while with 2 lanes and with 50 (one running, the
  simulator): RSS, CPU share, and context switches per second over all its threads (the
  wake-ups: a busy-polling daemon shows thousands).
- scale: rendering and `systemctl --user daemon-reload` with 50 and 200 lanes; `GET /lanes`
  and `laned status` with 200 lanes; and how each grows from 50 to 200.

`--smoke` runs each part briefly, for CI: the figures are then not worth reading.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, LanedServe, free_port, harness_env, sim_lane
from laned.adapters import rendered
from laned.adapters.probes import parse_engine_metrics
from laned.sim.metrics import Metrics
from laned.validation.load import parse_config

PROBE_INTERVAL = 5.0  # probe.interval's default: one scrape per interval per running lane


def median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


# --- scrape ------------------------------------------------------------------------------


def big_metrics_page(target: int = 200_000) -> str:
    """A vLLM /metrics page of about `target` bytes: the simulator's families (vLLM's names)
    for as many engines as it takes, as a data-parallel server labels them."""
    engine = Metrics(model_name="deepseek-v4.1-flash", spec_decode=True, num_spec_tokens=7)
    for name in engine.histograms:
        for value in (0.01, 0.2, 3.0, 40.0):
            engine.observe(name, value)
    page = engine.render()
    helps = [line for line in page.splitlines() if line.startswith("#")]
    samples = [line for line in page.splitlines() if not line.startswith("#")]
    lines = list(helps)
    index = 0
    while sum(len(x) + 1 for x in lines) < target:
        lines += [s.replace('engine="0"', f'engine="{index}"') for s in samples]
        index += 1
    return "\n".join(lines) + "\n"


def bench_scrape(rounds: int) -> dict[str, Any]:
    page = big_metrics_page()
    body = page.encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    parse_cpu, fetch_wall = [], []
    with httpx.Client() as client:
        for _ in range(rounds):
            start = time.perf_counter()
            text = client.get(url).text
            fetch_wall.append(time.perf_counter() - start)
            cpu = time.process_time()
            parse_engine_metrics(text)
            parse_cpu.append(time.process_time() - cpu)
    server.shutdown()
    per_scrape = statistics.median(parse_cpu) + statistics.median(fetch_wall)
    return {
        "page_bytes": len(body),
        "engines_in_page": page.count("vllm:num_requests_running{"),
        "fetch_ms_median": median_ms(fetch_wall),
        "parse_cpu_ms_median": median_ms(parse_cpu),
        "cpu_share_percent_at_5s": per_scrape / PROBE_INTERVAL * 100,
    }


# --- laned serve on a generated config ----------------------------------------------------


def config_text(tmp: Path, lanes: int, running: int, api: int, unit_dir: Path, tag: str) -> str:
    text = (
        f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
        f'listen = "127.0.0.1:{api}"\n' + ('default_lane = "l0"\n' if running else "")
    )
    (tmp / "models").mkdir(exist_ok=True)
    first = free_port()
    while 41000 < first < 41000 + lanes:  # the kernel's pick may be one of the fixed ports
        first = free_port()
    for i in range(lanes):
        # No GPU each: all may run at once (laned.core.placement), but only `running` of them
        # are started. Only l0 ever runs: the others get distinct ports that nothing binds.
        text += sim_lane(
            f"l{i}",
            f"{tag}-l{i}.service",
            first if i == 0 else 41000 + i,
            "gpus = []\n",
            model=str(tmp / "models"),
        )
    return text


class Laned(LanedServe):
    """`laned serve` on a generated config of `lanes` lanes, `running` of them started."""

    def __init__(self, tmp: Path, lanes: int, running: int, env: dict[str, str]) -> None:
        api = free_port()
        unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
        self.tag = f"benchcost{os.getpid()}x{lanes}"
        path = tmp / "laned.toml"
        path.write_text(config_text(tmp, lanes, running, api, unit_dir, self.tag))
        units = [f"{self.tag}-l{i}.service" for i in range(lanes)]
        super().__init__(path, api, env, units, ready=running)


def bench_footprint(seconds: float, env: dict[str, str]) -> dict[str, Any]:
    out = {}
    for lanes in (2, 50):
        with tempfile.TemporaryDirectory() as tmp, Laned(Path(tmp), lanes, 1, env) as laned:
            time.sleep(2)  # let the start settle (first scrapes, the state writer)
            cpu0, _, sw0 = laned.proc()
            start = time.monotonic()
            time.sleep(seconds)  # the measured window: laned is left alone
            cpu1, rss, sw1 = laned.proc()
            wall = time.monotonic() - start
            out[f"{lanes}_lanes"] = {
                "rss_mb": rss / 2**20,
                "cpu_percent": (cpu1 - cpu0) / wall * 100,
                "context_switches_per_s": (sw1 - sw0) / wall,
                "seconds": wall,
            }
    return out


def bench_scale(rounds: int, env: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for lanes in (50, 200):
        with tempfile.TemporaryDirectory() as tmp:
            laned = Laned(Path(tmp), lanes, 0, env)
            config = parse_config(laned.path.read_text(), str(laned.path), {"HOME": tmp})
            renders, reloads = [], []
            for i in range(rounds):
                if i:  # a changed config each round: every unit rewritten
                    config = config.model_copy(
                        update={
                            "lanes": {
                                n: s.model_copy(update={"description": f"r{i}"})
                                for n, s in config.lanes.items()
                            }
                        }
                    )
                start = time.perf_counter()
                rendered.apply(config)
                renders.append(time.perf_counter() - start)
                start = time.perf_counter()
                subprocess.run(["systemctl", "--user", "daemon-reload"], env=env, check=True)
                reloads.append(time.perf_counter() - start)
            row = {"render_ms": median_ms(renders), "daemon_reload_ms": median_ms(reloads)}
            if lanes == 200:
                with laned:
                    url = f"http://127.0.0.1:{laned.api}/lanes"
                    gets = []
                    with httpx.Client(timeout=30) as client:
                        for _ in range(rounds * 4):
                            start = time.perf_counter()
                            client.get(url).raise_for_status()
                            gets.append(time.perf_counter() - start)
                    statuses = []
                    for _ in range(rounds):
                        start = time.perf_counter()
                        subprocess.run(
                            [sys.executable, "-m", "laned", "status", "--url", f"http://127.0.0.1:{laned.api}"],
                            cwd=ROOT, env=env, check=True, capture_output=True,
                        )  # fmt: skip
                        statuses.append(time.perf_counter() - start)
                row |= {"get_lanes_ms": median_ms(gets), "laned_status_ms": median_ms(statuses)}
            else:
                for unit in Path(laned.unit_dir).glob(f"{laned.tag}-*.service"):
                    unit.unlink()
            out[f"{lanes}_lanes"] = row
    for unit in (Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user").glob("benchcost*.service"):
        unit.unlink()
    subprocess.run(["systemctl", "--user", "daemon-reload"], env=env, check=False)
    out["growth_50_to_200"] = {
        key: out["200_lanes"][key] / out["50_lanes"][key]
        for key in ("render_ms", "daemon_reload_ms")
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("parts", nargs="*", default=["scrape", "footprint", "scale"])
    parser.add_argument("--smoke", action="store_true", help="brief runs for CI")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {**os.environ, **harness_env()}
    result: dict[str, Any] = {"cores": os.cpu_count(), "smoke": args.smoke}
    if "scrape" in args.parts:
        result["scrape"] = s = bench_scrape(5 if args.smoke else 50)
        print(f"scrape: a {s['page_bytes'] / 1000:.0f} KB page ({s['engines_in_page']} engines): fetch "
              f"{s['fetch_ms_median']:.2f} ms, parse {s['parse_cpu_ms_median']:.2f} ms CPU; "
              f"{s['cpu_share_percent_at_5s']:.2f} % of a core at one scrape per 5 s")  # fmt: skip
    if "footprint" in args.parts:
        result["footprint"] = f = bench_footprint(3 if args.smoke else 60, env)
        for key, row in f.items():
            print(f"footprint, {key.replace('_', ' ')} (one running), idle {row['seconds']:.0f} s: RSS "
                  f"{row['rss_mb']:.1f} MB, CPU {row['cpu_percent']:.2f} %, "
                  f"{row['context_switches_per_s']:.1f} context switches/s")  # fmt: skip
    if "scale" in args.parts:
        result["scale"] = c = bench_scale(1 if args.smoke else 3, env)
        for key in ("50_lanes", "200_lanes"):
            row = c[key]
            extra = "".join(f", {k.removesuffix('_ms').replace('_', ' ')} {v:.1f} ms" for k, v in row.items() if k.startswith(("get", "laned")))  # fmt: skip
            print(f"scale, {key.replace('_', ' ')}: render {row['render_ms']:.1f} ms, daemon-reload "
                  f"{row['daemon_reload_ms']:.1f} ms{extra}")  # fmt: skip
        g = c["growth_50_to_200"]
        print(
            f"scale, 50 -> 200 lanes (x4): render x{g['render_ms']:.1f}, daemon-reload x{g['daemon_reload_ms']:.1f}"
        )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
