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
- `vllm/v1/engine/core.py`: "init engine (profile, create kv cache, warmup model) took X s" (0.32; older: "X seconds").
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable

from laned.sim import gpu, weightwire
from laned.sim.settings import Settings

Pause = Callable[[float], Awaitable[bool]]
DEEPGEMM_SHAPES = ("[4096, 7168]", "[7168, 2048]", "[32, 4096, 7168]")


# vLLM's processes prefix their lines with who wrote them (vllm/logger.py; seen in real vLLM
# 0.32: `(APIServer pid=12733) INFO ...`, `(EngineCore pid=13401) ...`, `(Worker pid=14095)
# ...`). The simulator is one process: every role carries its pid.
API_SERVER, ENGINE_CORE, WORKER = "APIServer", "EngineCore", "Worker"


def log(level: str, where: str, message: str, role: str = API_SERVER) -> None:
    """Write one line the way vLLM's logger does:
    `(APIServer pid=N) INFO 12-02 10:00:00 [file.py:12] message`."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    line = f"({role} pid={os.getpid()}) {level} {stamp} [{where}] {message}"
    print(line, file=sys.stderr, flush=True)


def config_dump(s: Settings) -> None:
    """The engine's one-line config dump (vllm/v1/engine/core.py): every feature by name,
    FlashInfer autotune and CUDA graphs included, whatever runs."""
    log(
        "INFO",
        "core.py:133",
        f"Initializing a V1 LLM engine (v0.32.0) with config: model={s.model!r}, "
        f"tokenizer={s.model!r}, dtype=torch.bfloat16, max_seq_len={s.max_model_len}, "
        f"enforce_eager={s.enforce_eager}, kernel_config=KernelConfig("
        f"enable_flashinfer_autotune={s.flashinfer_autotune}, "
        "enable_rocm_segmented_attn_autotune=False), "
        "compilation_config={'mode': 3, 'cudagraph_mode': 'FULL_AND_PIECEWISE', "
        "'use_inductor_graph_partition': False, 'deep_gemm_warmup': 'full'}",
        ENGINE_CORE,
    )


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


def shard_bar(done: int, total: int, elapsed: float, left: float, per_shard: float) -> None:
    """One redraw of the default loader's shard bar (weight_utils.py `_BAR_FORMAT`)."""
    print(
        f"\rLoading safetensors checkpoint shards: {done * 100 // max(total, 1):3d}% Completed | "
        f"{done}/{total} [{_clock(elapsed)}<{_clock(max(left, 0.0))}, {per_shard:.2f}s/it]",
        file=sys.stderr,
        flush=True,
    )


WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")


def _weight_files(model: str) -> list[str]:
    found = []
    for where, _dirs, files in os.walk(model):
        found += [os.path.join(where, n) for n in files if n.endswith(WEIGHT_FILES)]
    return sorted(found)


def _read(path: str) -> int:
    """Read one file through, 16 MiB at a time (blocking): its bytes."""
    total, buffer = 0, bytearray(16 * 2**20)
    with open(path, "rb", buffering=0) as handle:
        while got := handle.readinto(buffer):
            total += got
    return total


async def read_weights(s: Settings, stop: asyncio.Event) -> bool:
    """LANED_SIM_READ_WEIGHTS: the weight phase as vLLM's default loader runs it over local
    safetensors (vllm/model_executor/model_loader/weight_utils.py
    `safetensors_weights_iterator`: the files in sorted order, one shard of the bar each,
    every byte read off the page cache or the disk), so it lasts what the reads take."""
    files = _weight_files(s.model)
    started = time.monotonic()
    log("INFO", "model_runner.py:1", f"Starting to load model {s.model}...", WORKER)
    for i, path in enumerate([*files, None]):
        elapsed = time.monotonic() - started
        shard_bar(i, len(files), elapsed, 0.0, elapsed / max(i, 1))
        if path is not None:
            await asyncio.to_thread(_read, path)
        if stop.is_set():
            return False
    seconds = time.monotonic() - started
    log("INFO", "default_loader.py:262", f"Loading weights took {seconds:.2f} seconds", WORKER)
    return True


async def map_weights(s: Settings, pause: Pause) -> bool | None:
    """--load-format ipc_cache (weight_cache/ipc_loader.py): the weights mapped from the
    weight-cache daemon, in a moment (True), or None: the engine reads them from disk after
    the loader's warning."""
    started = time.monotonic()
    tp = s.weight_flags.get("--tensor-parallel-size") or s.weight_flags.get("-tp") or "1"
    per_node = (int(tp) if tp.isdigit() else 1) // max(s.nnodes, 1)
    mapped, said = await weightwire.map_weights(
        s.model, s.weight_flags, s.loader_config, tp_rank=s.node_rank * per_node
    )
    if not mapped:
        log("WARNING", "ipc_loader.py:213", f"Weight cache unusable ({said}); falling back to disk loading", WORKER)  # fmt: skip
        return None
    if not await pause(
        s.startup * 0.01
    ):  # the mapping: a moment (bench/gpu_ipc.py: the real floor)
        return False
    mode = s.loader_config.get("mode") or "zero_copy"
    log("INFO", "ipc_loader.py:283", f"Mapped {said} tensors from the weight cache daemon ({mode} mode)", WORKER)  # fmt: skip
    took = time.monotonic() - started
    log("INFO", "gpu_model_runner.py:1", f"Model loading took 0.00 GiB and {took:.2f} seconds", WORKER)  # fmt: skip
    return True


async def load_weights(s: Settings, pause: Pause) -> bool:
    """The weights, with vLLM's shard bar (none for loaders that print none); from the
    weight-cache daemon for --load-format ipc_cache where it answers."""
    seconds = s.startup * 0.5
    log("INFO", "model_runner.py:1", f"Starting to load model {s.model}...", WORKER)
    if s.load_format == "ipc_cache":
        mapped = await map_weights(s, pause)
        if mapped is not None:
            return mapped
    if s.load_format in ("fastsafetensors", "runai_streamer"):
        if not await pause(seconds):  # these loaders print no shard bar
            return False
    else:
        shards, started = 8, time.monotonic()
        for i in range(shards + 1):
            elapsed = time.monotonic() - started
            shard_bar(i, shards, elapsed, seconds - elapsed, seconds / shards)
            if i < shards and not await pause(seconds / shards):
                return False
            if s.fail_at_start is not None and i == shards // 2:
                log("ERROR", "core.py:700", "EngineCore failed to start.")
                log("ERROR", "core.py:700", "RuntimeError: simulated startup failure (LANED_SIM_FAIL_AT_START)")  # fmt: skip
                sys.stderr.flush()
                os._exit(s.fail_at_start)
    log("INFO", "default_loader.py:262", f"Loading weights took {seconds:.2f} seconds", WORKER)
    log("INFO", "gpu_model_runner.py:1", f"Model loading took 42.17 GiB and {seconds:.2f} seconds", WORKER)  # fmt: skip
    return True


async def torch_compile(s: Settings, pause: Pause) -> bool:
    """torch.compile, or its graphs loaded from VLLM_CACHE_ROOT after an earlier start."""
    if s.enforce_eager:
        return await pause(s.startup * 0.1)
    marker = _cached(s)
    hit = marker is not None and os.path.exists(marker)
    seconds = s.startup * (0.02 if hit else 0.1)
    log("INFO", "backends.py:1", f"Dynamo bytecode transform time: {seconds / 2:.2f} s", WORKER)
    if not await pause(seconds):
        return False
    shape = f"compile range (1, {s.max_num_batched_tokens})"
    if hit:
        log("INFO", "backends.py:1", f"Directly load the compiled graph(s) for {shape} from the cache, took {seconds / 2:.3f} s", WORKER)  # fmt: skip
    else:
        log("INFO", "backends.py:1", f"Compiling a graph for {shape} takes {seconds / 2:.2f} s", WORKER)  # fmt: skip
    log("INFO", "monitor.py:34", f"torch.compile takes {seconds:.2f} s in total", WORKER)
    return True


def profile(s: Settings) -> None:
    """The memory profile: what the KV cache gets."""
    kv_gib = s.kv_capacity * 2 / 1024**2
    log("INFO", "gpu_worker.py:276", f"Available KV cache memory: {kv_gib:.2f} GiB", WORKER)
    log("INFO", "kv_cache_utils.py:2327", f"GPU KV cache size: {s.kv_capacity:,} tokens, Maximum concurrency for {s.max_model_len:,} tokens per request: {s.kv_capacity / s.max_model_len:.2f}x", ENGINE_CORE)  # fmt: skip


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
        log("INFO", "kernel_warmup.py:1", "Skipping FlashInfer autotune because it is disabled.", WORKER)  # fmt: skip
    elif hit:
        log("INFO", "kernel_warmup.py:1", f"Using FlashInfer autotune cache file: {s.cache_root}/flashinfer_autotune.json", WORKER)  # fmt: skip
    else:
        log("INFO", "autotuner.py:1", "flashinfer.jit: [Autotuner]: Autotuning process starts", WORKER)  # fmt: skip
        if not await pause(s.jit * 0.6):
            return False
        log("INFO", "autotuner.py:1", "flashinfer.jit: [Autotuner]: Autotuning process ends", WORKER)  # fmt: skip
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
    log("INFO", "gpu_model_runner.py:1", f"Graph capturing finished in {seconds:.0f} secs, took 0.52 GiB", WORKER)  # fmt: skip
    return True


def pauser(stop: asyncio.Event) -> Pause:
    """A pause of some seconds that ends early, answering False, once `stop` is set."""

    async def pause(seconds: float) -> bool:
        try:
            await asyncio.wait_for(stop.wait(), timeout=max(seconds, 0))
            return False
        except asyncio.TimeoutError:
            return True

    return pause


def take_sim_gpus(s: Settings) -> None:
    """The worker's memory on a simulated host, as vLLM's worker takes it before the weights
    (vllm/v1/worker/gpu_worker.py `init_device` → utils.py `request_memory`); its refusal
    ends the engine core and the API server as vLLM's do (vllm/v1/engine/utils.py)."""
    assert s.sim_gpus is not None
    try:
        s.sim_held = gpu.sim_take(s.sim_gpus, s.visible, s.gpu_share)
    except ValueError as exc:
        log("ERROR", "core.py:1", "EngineCore failed to start.", ENGINE_CORE)
        log("ERROR", "core.py:1", f"ValueError: {exc}", ENGINE_CORE)
        log("ERROR", "utils.py:1", "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore_DP0': 1}")  # fmt: skip
        sys.stderr.flush()
        os._exit(1)


async def cold_start(s: Settings, stop: asyncio.Event) -> bool:
    """vLLM's startup over LANED_SIM_STARTUP seconds (plus LANED_SIM_JIT); False when told to stop."""

    pause = pauser(stop)
    started = time.monotonic()
    config_dump(s)
    if s.sim_gpus:
        take_sim_gpus(s)
    gpu.hold(s.hold_gpu_gib, s.gpu_linger)
    weights = read_weights(s, stop) if s.read_weights else load_weights(s, pause)
    if not await weights or not await torch_compile(s, pause):
        return False
    profile(s)
    if not await pause(s.startup * 0.1) or not await kernel_warmup(s, pause):
        return False
    if not await cuda_graphs(s, pause):
        return False
    took = time.monotonic() - started
    log("INFO", "core.py:1", f"init engine (profile, create kv cache, warmup model) took {took:.2f} s", ENGINE_CORE)  # fmt: skip
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
