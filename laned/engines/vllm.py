"""vLLM: what laned knows of it, in one place (laned.engines.profile.EngineProfile).

- Its log lines as vLLM really prints them: the startup phases (sources in
  docs/simulator.md), and the settings dumps that name every feature and say nothing of
  where a start is.
- Its /metrics names (vllm/v1/metrics/loggers.py).
- Its API key's variable, VLLM_API_KEY (vllm/envs.py; vllm/entrypoints/serve/middleware/
  register.py takes it where --api-key is not given): laned never puts the key in argv.
"""

from __future__ import annotations

import functools
import re

from laned.core.phases import BAR, CACHE_HIT, Phase, read_with
from laned.engines.profile import EngineProfile, MetricNames

# (pattern, phase or None, note or None), first match wins; sources in docs/simulator.md.
PHASES: list[tuple[re.Pattern[str], Phase | None, str | None]] = [
    (
        re.compile(r"Loading safetensors checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
        Phase.LOADING_WEIGHTS,
        None,
    ),
    (re.compile(r"Loading weights took|Model loading took"), Phase.WEIGHTS_LOADED, None),
    (
        re.compile(r"Directly load the compiled graph\(s\)|Directly load AOT compilation"),
        Phase.TORCH_COMPILE,
        f"{CACHE_HIT} (torch.compile)",
    ),
    (
        re.compile(r"Dynamo bytecode transform time|Compiling a graph for|torch\.compile takes"),
        Phase.TORCH_COMPILE,
        None,
    ),
    # "GPU KV cache size", "CPU KV cache size" (the CPU build): kv_cache_utils.py "%s KV cache size"
    (re.compile(r"Available KV cache memory|\b[A-Z]+ KV cache size: "), Phase.PROFILING, None),
    (re.compile(r"DeepG[Ee][Mm][Mm]" + BAR), Phase.DEEPGEMM, None),
    (re.compile(r"DeepG[Ee][Mm][Mm].*?(\d+)/(\d+)"), Phase.DEEPGEMM, None),
    (re.compile(r"DeepG[Ee][Mm][Mm]|deep_gemm"), Phase.DEEPGEMM, None),
    (
        re.compile(r"Using FlashInfer autotune cache|FlashInfer autotune cache loaded"),
        None,
        f"{CACHE_HIT} (FlashInfer autotune)",
    ),
    (re.compile(r"Skipping FlashInfer autotune"), None, "FlashInfer autotune skipped"),
    (re.compile(r"[Aa]utotun\w*.*?(\d+)/(\d+)"), Phase.AUTOTUNE, None),
    (re.compile(r"[Aa]utotun"), Phase.AUTOTUNE, None),
    (re.compile(r"Capturing CUDA graphs" + BAR), Phase.CUDA_GRAPHS, None),
    (re.compile(r"Capturing CUDA graphs|Graph capturing finished"), Phase.CUDA_GRAPHS, None),
    (
        # The engine is up (vllm/v1/engine/core.py), then the API server starts
        # (vllm/entrypoints/openai/api_server.py; the older line says "API server %d").
        re.compile(
            r"init engine \(profile, create kv cache, warmup model\) took|Supported tasks:"
            r"|Starting vLLM (?:API )?server|Available routes are"
        ),
        Phase.API_SERVER,
        None,
    ),
    (re.compile(r"Application startup complete"), Phase.SERVING, None),
    (re.compile(r"Starting to load model|Loading model"), Phase.LOADING_MODEL, None),
]

# Lines that list the engine's settings (every feature by name, on or off) say nothing of
# where a start is: vLLM's config dump (vllm/v1/engine/core.py, "Initializing a V1 LLM engine
# (v0.32.0) with config: ... enable_flashinfer_autotune=True ...") and the API server's
# "non-default args: {...}" (vllm/entrypoints/serve/utils/api_utils.py).
SETTINGS = re.compile(r"LLM engine \(v[^)]*\) with config: |non-default args: ")


# The engine's samples laned reads (vllm/v1/metrics/loggers.py names them): the KV-cache
# usage as the fullest engine's, `vllm:kv_cache_usage_perc`, else the older
# `vllm:gpu_cache_usage_perc` (vLLM 0.9 and 0.10 export both, with the same value: they are
# never added); the engine steps taken are `vllm:iteration_tokens_total`'s count.
SUMMED = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:generation_tokens_total": "generation_tokens",
    "vllm:prompt_tokens_total": "prompt_tokens",
    "vllm:iteration_tokens_total_count": "steps",
}
KV_USAGE = {"vllm:kv_cache_usage_perc": "kv", "vllm:gpu_cache_usage_perc": "gpu"}

read_line = functools.partial(read_with, PHASES, SETTINGS)

VLLM = EngineProfile(
    name="vllm",
    api_key_env="VLLM_API_KEY",
    metrics=MetricNames(SUMMED, KV_USAGE),
    read_line=read_line,
)
