#!/usr/bin/env python3
"""Do concurrent streams' SSE events come together, one per stream at each engine step, or
spread over the step? Real vLLM beside the simulator (prints JSON lines, writes JSON; asserts
nothing):

    .venv/bin/python bench/step_bursts.py [--vllm-python .venv-vllm/bin/python]
        [--model .venv-vllm/tiny-llama] [--streams 4] [--tokens 60] [--json FILE]

Each engine is started on its own (no laned), one warm request is sent, then `--streams`
completions of `--tokens` tokens at once; every event's arrival is stamped. A burst is a run of
events less than 2 ms apart. vLLM's output handler pushes one step's outputs to every running
request in one pass (vllm/v1/engine/async_llm.py), so its events come `--streams` to a burst;
a proxy in front of it wakes once a burst. The simulator's decode clock (laned/sim/steps.py)
is checked against that here. Real vLLM runs on CPU 0 (taskset), as in tests/vllm.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, free_port

GAP = 0.002  # seconds between two events of different bursts


def bursts(arrivals: list[float]) -> int:
    """How many runs of events less than GAP apart."""
    arrivals = sorted(arrivals)
    return sum(1 for i, t in enumerate(arrivals) if i == 0 or t - arrivals[i - 1] > GAP)


async def stamped(port: int, streams: int, tokens: int) -> list[float]:
    """The arrival of every event of `streams` streams sent at once (after one warm request)."""
    arrivals: list[float] = []
    body = {"model": "m", "prompt": "hello", "max_tokens": tokens, "ignore_eos": True, "stream": True}  # fmt: skip

    async def one(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", "/v1/completions", json=body) as answer:
            async for line in answer.aiter_lines():
                if line.startswith("data: {"):
                    arrivals.append(time.monotonic())

    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
        await one(client)
        arrivals.clear()
        await asyncio.gather(*(one(client) for _ in range(streams)))
    return arrivals


def measure(name: str, command: list[str], env: dict[str, str], port: int, args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.5)
        else:
            raise TimeoutError(f"{name} did not come up on port {port}")
        arrivals = asyncio.run(stamped(port, args.streams, args.tokens))
    finally:
        process.terminate()
        process.wait(60)
    count = bursts(arrivals)
    return {"engine": name, "events": len(arrivals), "bursts": count, "events_per_burst": round(len(arrivals) / count, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", default=str(ROOT / ".venv-vllm/bin/python"))
    parser.add_argument("--model", default=str(ROOT / ".venv-vllm/tiny-llama"))
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=60)
    parser.add_argument("--sim-tps", type=float, default=30.0, help="the simulator's decode rate")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    quiet = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_CPU_OMP_THREADS_BIND": "0"}  # fmt: skip
    rows = []
    port = free_port()
    vllm = ["taskset", "-c", "0", args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", args.model,
            "--dtype", "float32", "--enforce-eager", "--max-model-len", "2048", "--port", str(port), "--served-model-name", "m"]  # fmt: skip
    rows.append(measure("vllm", vllm, {**os.environ, **quiet}, port, args))
    print(json.dumps(rows[-1]), flush=True)
    port = free_port()
    sim = [sys.executable, "-m", "laned", "sim", "serve", args.model, "--port", str(port), "--served-model-name", "m"]  # fmt: skip
    rows.append(measure("sim", sim, {**os.environ, "LANED_SIM_DECODE_TPS": f"{args.sim_tps:g}"}, port, args))  # fmt: skip
    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        meta = {"cores": os.cpu_count(), "date": time.strftime("%Y-%m-%d"), "args": {k: v for k, v in vars(args).items() if k != "json"}}  # fmt: skip
        args.json.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
