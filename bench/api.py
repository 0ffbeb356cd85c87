#!/usr/bin/env python3
"""laned's API under load, beside the floor, in the same run (prints a table, writes JSON,
asserts nothing):

    scripts/harness up && .venv/bin/python bench/api.py [--seconds 5] [--smoke] [--json FILE]

wrk (`apt install wrk`) drives, at 1, 16 and 64 connections:

- GET /lanes and GET /metrics of `laned serve` (two simulator lanes, one running), beside a
  bare FastAPI app under the same uvicorn settings (httptools, log level warning) that answers
  the same paths with the same bytes, captured from laned just before;
- POST /v1/completions (one token) through laned's OpenAI endpoint, beside the same request
  sent to the engine directly.

Throughput is requests per second; latency is wrk's p50 and p99. The machine's cores are
shared by wrk, the server and (for the proxy) the engine, for both sides alike.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import LanedServe, free_port, harness_env, sim_lane

CONNECTIONS = (1, 16, 64)
COMPLETION = {"model": "a", "prompt": "hello", "max_tokens": 1}
_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def bare_app(port: int, captured: Path) -> None:
    """The floor: FastAPI answering captured bytes for each path, as laned's server runs."""
    import uvicorn
    from fastapi import FastAPI, Response

    app = FastAPI()
    for name, (path, media) in {
        "lanes": ("/lanes", "application/json"),
        "metrics": ("/metrics", "text/plain; version=0.0.4; charset=utf-8"),
    }.items():
        body = (captured / name).read_bytes()

        async def answer(body: bytes = body, media: str = media) -> Response:
            return Response(body, media_type=media)

        app.get(path)(answer)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", timeout_keep_alive=5)


def wrk(url: str, connections: int, seconds: float, script: Path | None = None) -> dict[str, float]:
    """Requests per second and p50/p99 latency (ms) of one wrk run."""
    command = [
        "wrk",
        f"-t{min(connections, 2)}",
        f"-c{connections}",
        f"-d{seconds:g}s",
        "--latency",
    ]
    if script is not None:
        command += ["-s", str(script)]
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    latency = dict(re.findall(r"^\s+(50|99)%\s+([\d.]+\w+)", out, re.M))

    def ms(text: str) -> float:
        number, unit = re.fullmatch(r"([\d.]+)(\w+)", text).groups()  # type: ignore[union-attr]
        return float(number) * _UNITS[unit]

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {
        "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),  # type: ignore[union-attr]
        "p50_ms": ms(latency["50"]),
        "p99_ms": ms(latency["99"]),
        "non_2xx": int(errors.group(1)) if errors else 0,
    }


def compare(laned: dict[str, float], floor: dict[str, float]) -> dict[str, Any]:
    return {
        "laned": laned,
        "floor": floor,
        "throughput_ratio": laned["rps"] / floor["rps"],
        "p99_ratio": laned["p99_ms"] / floor["p99_ms"],
    }


def run(seconds: float, env: dict[str, str], connections: tuple[int, ...] = CONNECTIONS) -> dict[str, Any]:  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        api, engine, bare = free_port(), free_port(), free_port()
        unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
        tag = f"benchapi{os.getpid()}"
        text = (
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            f'listen = "127.0.0.1:{api}"\ndefault_lane = "a"\n'
        )
        for lane, port in (("a", engine), ("b", free_port())):
            text += sim_lane(
                lane, f"{tag}-{lane}.service", port, f'group = "{lane}"\ngpus = []\n',
                'LANED_SIM_DECODE_TPS = "100000"\nLANED_SIM_PREFILL_TPS = "10000000"\n', model=str(tmp),
            )  # fmt: skip
        path = tmp / "laned.toml"
        path.write_text(text)
        script = tmp / "post.lua"
        script.write_text(
            'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
            f"wrk.body = '{json.dumps(COMPLETION)}'\n"
        )
        units = [f"{tag}-a.service", f"{tag}-b.service"]
        out: dict[str, Any] = {}
        with LanedServe(path, api, env, units, ready=1) as laned:
            for name, url in (("lanes", "/lanes"), ("metrics", "/metrics")):
                (tmp / name).write_bytes(httpx.get(laned.url + url).content)
            floor = subprocess.Popen([sys.executable, __file__, "--bare", str(bare), str(tmp)])
            try:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline:
                    try:
                        httpx.get(f"http://127.0.0.1:{bare}/lanes")
                        break
                    except httpx.HTTPError:
                        time.sleep(0.1)
                for c in connections:
                    for name, url in (("GET /lanes", "/lanes"), ("GET /metrics", "/metrics")):
                        out[f"{name} c={c}"] = compare(
                            wrk(laned.url + url, c, seconds), wrk(f"http://127.0.0.1:{bare}{url}", c, seconds)
                        )  # fmt: skip
                    out[f"POST /v1/completions c={c}"] = compare(
                        wrk(laned.url + "/v1/completions", c, seconds, script),
                        wrk(f"http://127.0.0.1:{engine}/v1/completions", c, seconds, script),
                    )
            finally:
                floor.terminate()
                floor.wait(10)
    return out


def main() -> None:
    if sys.argv[1:2] == ["--bare"]:
        bare_app(int(sys.argv[2]), Path(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="each wrk run")
    parser.add_argument("--smoke", action="store_true", help="1 s runs at 16 connections, for CI")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    env = {**os.environ, **harness_env()}
    result = run(1.0, env, (16,)) if args.smoke else run(args.seconds, env)
    print(
        f"{'':30} {'laned rps':>10} {'floor rps':>10} {'ratio':>6}   {'laned p99':>9} {'floor p99':>9} {'ratio':>6}"
    )
    for name, row in result.items():
        print(f"{name:30} {row['laned']['rps']:10.0f} {row['floor']['rps']:10.0f} {row['throughput_ratio']:6.2f}   "
              f"{row['laned']['p99_ms']:7.2f}ms {row['floor']['p99_ms']:7.2f}ms {row['p99_ratio']:6.2f}")  # fmt: skip
    if args.json:
        meta = {"cores": os.cpu_count(), "smoke": args.smoke, "date": time.strftime("%Y-%m-%d")}
        args.json.write_text(json.dumps({**meta, "runs": result}, indent=2) + "\n")


if __name__ == "__main__":
    main()
