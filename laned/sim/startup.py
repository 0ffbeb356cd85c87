"""The simulated cold start: vLLM's startup log, in its order and its shapes.

Sources (vLLM's own files, as of the versions laned runs):
- the shard bar: `vllm/model_executor/model_loader/weight_utils.py` (`_BAR_FORMAT` ends every
  redraw with a newline, tqdm still starts it with `\\r`);
- torch.compile: `vllm/compilation/backends.py` ("Dynamo bytecode transform time", "Compiling a
  graph for compile range", "Directly load the compiled graph(s) ... from the cache"),
  `vllm/compilation/monitor.py` ("torch.compile takes X s in total");
- memory: `vllm/v1/worker/gpu_worker.py` ("Available KV cache memory"), `kv_cache_utils.py`;
- kernel warmup: `vllm/model_executor/warmup/deep_gemm_warmup.py` (one tqdm bar per weight
  shape, "DeepGemm(fp8_gemm_nt) warmup (W=torch.Size([...]))"), `kernel_warmup.py` (FlashInfer
  autotune: "Skipping FlashInfer autotune because it is disabled.", or its cache file);
- CUDA graphs: `gpu_model_runner.py` (a default tqdm bar, redrawn with `\\r`, a newline only
  at its close, then "Graph capturing finished in N secs");
- `vllm/v1/engine/core.py`: "init engine (profile, create kv cache, warmup model) took X seconds".
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable

from laned.sim import gpu
from laned.sim.settings import Settings

Pause = Callable[[float], Awaitable[bool]]
DEEPGEMM_SHAPES = ("[4096, 7168]", "[7168, 2048]", "[32, 4096, 7168]")


def log(level: str, where: str, message: str) -> None:
    """Write one line the way vLLM's logger does: `INFO 12-02 10:00:00 [file.py:12] message`."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [{where}] {message}", file=sys.stderr, flush=True)


def _clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes:02d}:{secs:02d}"


def _bar(done: int, total: int) -> str:
    filled = done * 10 // max(total, 1)
    return "█" * filled + " " * (10 - filled)


def tqdm_text(desc: str, done: int, total: int, elapsed: float) -> str:
    """tqdm's default line: `desc:  40%|████      | 4/10 [00:02<00:03,  2.00it/s]`."""
    rate = done / elapsed if elapsed > 0 else 0.0
    left = (total - done) / rate if rate > 0 else 0.0
    return (
        f"{desc}: {done * 100 // max(total, 1):3d}%|{_bar(done, total)}| {done}/{total} "
        f"[{_clock(elapsed)}<{_clock(left)}, {rate:5.2f}it/s]"
    )


async def tqdm_bar(desc: str, total: int, seconds: float, pause: Pause) -> bool:
    """A default tqdm bar: redrawn with `\\r`, a newline only when it closes."""
    started = time.monotonic()
    for done in range(total + 1):
        print("\r" + tqdm_text(desc, done, total, time.monotonic() - started), end="",
              file=sys.stderr, flush=True)  # fmt: skip
        if done < total and not await pause(seconds / total):
            print(file=sys.stderr, flush=True)
            return False
    print(file=sys.stderr, flush=True)
    return True


def _cached(s: Settings) -> str | None:
    """Where this lane's compile cache marker lives (VLLM_CACHE_ROOT), if it has one."""
    return os.path.join(s.cache_root, "laned-sim-kernels.json") if s.cache_root else None


async def load_weights(s: Settings, pause: Pause) -> bool:
    """The weights, with vLLM's shard bar (none for loaders that print none)."""
    seconds = s.startup * 0.5
    log("INFO", "model_runner.py:1", f"Starting to load model {s.model}...")
    if s.load_format in ("fastsafetensors", "runai_streamer"):
        if not await pause(seconds):  # these loaders print no shard bar
            return False
    else:
        shards, started = 8, time.monotonic()
        for i in range(shards + 1):
            elapsed = time.monotonic() - started
            print(
                f"\rLoading safetensors checkpoint shards: {i * 100 // shards:3d}% Completed | "
                f"{i}/{shards} [{_clock(elapsed)}<{_clock(seconds - elapsed)}, "
                f"{seconds / shards:.2f}s/it]",
                file=sys.stderr,
                flush=True,
            )
            if i < shards and not await pause(seconds / shards):
                return False
            if s.fail_at_start is not None and i == shards // 2:
                log("ERROR", "core.py:700", "EngineCore failed to start.")
                log("ERROR", "core.py:700", "RuntimeError: simulated startup failure (LANED_SIM_FAIL_AT_START)")  # fmt: skip
                sys.stderr.flush()
                os._exit(s.fail_at_start)
    log("INFO", "default_loader.py:262", f"Loading weights took {seconds:.2f} seconds")
    log("INFO", "gpu_model_runner.py:1", f"Model loading took 42.17 GiB and {seconds:.2f} seconds")
    return True


async def torch_compile(s: Settings, pause: Pause) -> bool:
    """torch.compile, or its graphs loaded from VLLM_CACHE_ROOT after an earlier start."""
    if s.enforce_eager:
        return await pause(s.startup * 0.1)
    marker = _cached(s)
    hit = marker is not None and os.path.exists(marker)
    seconds = s.startup * (0.02 if hit else 0.1)
    log("INFO", "backends.py:1", f"Dynamo bytecode transform time: {seconds / 2:.2f} s")
    if not await pause(seconds):
        return False
    shape = f"compile range (1, {s.max_num_batched_tokens})"
    if hit:
        log("INFO", "backends.py:1", f"Directly load the compiled graph(s) for {shape} from the cache, took {seconds / 2:.3f} s")  # fmt: skip
    else:
        log("INFO", "backends.py:1", f"Compiling a graph for {shape} takes {seconds / 2:.2f} s")
    log("INFO", "monitor.py:34", f"torch.compile takes {seconds:.2f} s in total")
    return True


def profile(s: Settings) -> None:
    """The memory profile: what the KV cache gets."""
    kv_gib = s.kv_capacity * 2 / 1024**2
    log("INFO", "gpu_worker.py:276", f"Available KV cache memory: {kv_gib:.2f} GiB")
    log("INFO", "kv_cache_utils.py:1", f"GPU KV cache size: {s.kv_capacity:,} tokens")
    log("INFO", "kv_cache_utils.py:1", f"Maximum concurrency for {s.max_model_len:,} tokens per request: {s.kv_capacity / s.max_model_len:.2f}x")  # fmt: skip


async def kernel_warmup(s: Settings, pause: Pause) -> bool:
    """DeepGEMM warmup (a bar per weight shape) and FlashInfer autotune, or their caches."""
    if s.jit <= 0:
        return True
    marker = _cached(s)
    hit = marker is not None and os.path.exists(marker)
    for shape in DEEPGEMM_SHAPES:  # runs every start; its JIT kernels come from the cache
        seconds = s.jit * (0.01 if hit else 0.1)
        desc = f"DeepGemm(fp8_gemm_nt) warmup (W=torch.Size({shape}))"
        if not await tqdm_bar(desc, 64, seconds, pause):
            return False
    if not s.flashinfer_autotune:
        log("INFO", "kernel_warmup.py:1", "Skipping FlashInfer autotune because it is disabled.")
    elif hit:
        log("INFO", "kernel_warmup.py:1", f"Using FlashInfer autotune cache file: {s.cache_root}/flashinfer_autotune.json")  # fmt: skip
    else:
        log("INFO", "autotuner.py:1", "flashinfer.jit: [Autotuner]: Autotuning process starts")
        if not await pause(s.jit * 0.6):
            return False
        log("INFO", "autotuner.py:1", "flashinfer.jit: [Autotuner]: Autotuning process ends")
    if marker and not hit:
        os.makedirs(os.path.dirname(marker), exist_ok=True)
        with open(marker, "w", encoding="utf-8") as handle:
            json.dump({"model": s.model, "tuned": True}, handle)
    return True


async def cuda_graphs(s: Settings, pause: Pause) -> bool:
    """CUDA-graph capture: a default tqdm bar (none with --enforce-eager)."""
    seconds = s.startup * 0.3
    if s.enforce_eager:
        return await pause(seconds)
    desc = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"
    if not await tqdm_bar(desc, 10, seconds, pause):
        return False
    log("INFO", "gpu_model_runner.py:1", f"Graph capturing finished in {seconds:.0f} secs, took 0.52 GiB")  # fmt: skip
    return True


async def cold_start(s: Settings, stop: asyncio.Event) -> bool:
    """vLLM's startup over LANED_SIM_STARTUP seconds (plus LANED_SIM_JIT); False when told to stop."""

    async def pause(seconds: float) -> bool:
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(seconds, 0))
            return False
        except asyncio.TimeoutError:
            return True

    started = time.monotonic()
    gpu.hold(s.hold_gpu_gib, s.gpu_linger)
    if not await load_weights(s, pause) or not await torch_compile(s, pause):
        return False
    profile(s)
    if not await pause(s.startup * 0.1) or not await kernel_warmup(s, pause):
        return False
    if not await cuda_graphs(s, pause):
        return False
    took = time.monotonic() - started
    log("INFO", "core.py:1", f"init engine (profile, create kv cache, warmup model) took {took:.2f} seconds")  # fmt: skip
    return True


def api_server_lines(s: Settings) -> None:
    """What the API server logs before uvicorn serves (vllm/entrypoints/openai/api_server.py)."""
    log("INFO", "api_server.py:1", "Supported tasks: ['generate']")
    address = f"http://{s.host}:{s.port}"
    if s.old_api_line:  # before vLLM 0.11: one line per API server process
        log("INFO", "api_server.py:1", f"Starting vLLM API server 0 on {address}")
    else:
        log("INFO", "api_server.py:1", f"Starting vLLM server on {address}")
    log("INFO", "launcher.py:1", "Available routes are:")
    for path, methods in (("/health", "GET"), ("/v1/models", "GET"), ("/v1/chat/completions", "POST"), ("/v1/completions", "POST"), ("/metrics", "GET")):  # fmt: skip
        log("INFO", "launcher.py:1", f"Route: {path}, Methods: {methods}")
