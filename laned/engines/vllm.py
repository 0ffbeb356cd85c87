"""vLLM: what laned knows of it, in one place (laned.engines.profile.EngineProfile).

- The flags laned adds: --port, --served-model-name, the sampling defaults as
  --override-generation-config, and for a lane that sleeps --enable-sleep-mode, loopback and
  VLLM_SERVER_DEV_MODE=1 (its sleep routes are dev routes: vllm/entrypoints/serve/dev/).
- How it sleeps: POST /sleep?level=N&mode=wait, POST /wake_up, GET /is_sleeping; after a
  level-2 wake the weights read again (/collective_rpc reload_weights) and the prefix cache
  reset (vLLM #29341); the level it sleeps at in `vllm:engine_sleep_state`.
- Its tokenizer: POST /tokenize counts a prompt or chat messages (template included).
- Its log lines as vLLM really prints them: the startup phases (sources in
  docs/simulator.md), and the settings dumps that name every feature and say nothing of
  where a start is.
- Its /metrics names (vllm/v1/metrics/loggers.py).
- Its API key's variable, VLLM_API_KEY (vllm/envs.py; vllm/entrypoints/serve/middleware/
  register.py takes it where --api-key is not given): laned never puts the key in argv.
"""

from __future__ import annotations

import functools
import io
import pickle
import re
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from laned.config.model import LaneConfig
from laned.config.sleep import LOOPBACK, loopback
from laned.core.phases import BAR, CACHE_HIT, Phase, read_with
from laned.engines.profile import (
    Call,
    EngineProfile,
    FlagProbe,
    Line,
    MetricNames,
    SleepApi,
    Tokenizer,
    WeightCacheApi,
    flag_value,
    json_sampling_line,
    openai_tokenize,
    port_line,
    served_line,
)
from laned.errors import Finding, Severity
from laned.preflight.facts import LaneFacts

WC_MAPPED = "weights mapped from the weight cache"
WC_MISSED = "weight cache missed: weights read from disk"

# (pattern, phase or None, note or None), first match wins; sources in docs/simulator.md.
PHASES: list[tuple[re.Pattern[str], Phase | None, str | None]] = [
    # The weight cache (weight_cache/ipc_loader.py, daemon.py, cli/preload.py): the engine
    # mapped the daemon's weights, or fell back to reading them; the daemon's own start.
    (re.compile(r"Weight cache unusable .*falling back to disk"), None, WC_MISSED),
    (
        re.compile(r"Mapped \d+ tensors from the weight cache daemon"),
        Phase.WEIGHTS_LOADED,
        WC_MAPPED,
    ),
    (
        re.compile(r"Weight cache \w+ daemon rank \d+ loaded model"),
        Phase.WEIGHTS_LOADED,
        "the weight-cache daemon holds the weights",
    ),
    (re.compile(r"Weight cache daemon READY"), None, "the weight-cache daemon is ready"),
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

DEV_MODE = ("VLLM_SERVER_DEV_MODE", "1")
DEV_MODE_WHY = (
    "set by laned for sleep_level: vLLM serves /sleep, /wake_up and /is_sleeping only in "
    "its dev mode"
)


def recognises(words: Sequence[str]) -> bool:
    """A command or image that names vLLM (`vllm serve`, vllm/vllm-openai, a venv's vllm)."""
    return any("vllm" in word.lower() for word in words)


def serve_lines(spec: LaneConfig, base: str) -> list[Line]:
    """The flags laned adds to a vLLM lane's command, each with its reason."""
    lines = json_sampling_line(
        spec,
        f"{base}.sampling: defaults for requests that send none (the seed's word-salad "
        "fix), merged over the model's generation_config.json, whose stop ids stay",
        "--override-generation-config",
    )
    lines += [port_line(spec, base), served_line(spec, base, "--served-model-name")]
    if not spec.sleep_level:
        return lines
    lines.append(
        (
            f"set by laned from {base}.sleep_level = {spec.sleep_level}: a swap away puts the "
            "engine to sleep (its process, compile caches and graphs stay) instead of stopping it",
            ["--enable-sleep-mode"],
        )
    )
    if spec.engine_arg("--host") is None:
        lines.append(
            (
                "set by laned: the sleep routes are vLLM's dev mode, which must not be "
                "reachable from other hosts (laned's OpenAI endpoint serves them the model)",
                ["--host", LOOPBACK],
            )
        )
    return lines


def env(spec: LaneConfig) -> list[tuple[str, str, str]]:
    """VLLM_SERVER_DEV_MODE=1 for a lane that sleeps (unless its own env sets it)."""
    if spec.sleep_level and DEV_MODE[0] not in spec.env:
        return [(*DEV_MODE, DEV_MODE_WHY)]
    return []


def _field(key: str, want: object) -> Any:
    return lambda answer: isinstance(answer, dict) and answer.get(key) == want


def level_in_metrics(page: str) -> int | None:
    """The level vLLM sleeps at, from `vllm:engine_sleep_state` (`weights_offloaded` 1 is
    level 1, `discard_all` 1 level 2); None when the page does not say."""
    for line in page.splitlines():
        if line.startswith("vllm:engine_sleep_state{") and line.rstrip().endswith(" 1.0"):
            for state, level in (('"weights_offloaded"', 1), ('"discard_all"', 2)):
                if f"sleep_state={state}" in line:
                    return level
    return None


SLEEP = SleepApi(
    levels=(1, 2),
    # `wait` lets a request still in flight end (laned drained them first; vLLM's default,
    # `abort`, would cut it).
    sleep=lambda level: Call("POST", "/sleep", {"level": level, "mode": "wait"}),
    wake=Call("POST", "/wake_up"),
    awake=_field("status", "awake"),
    after_wake={
        2: (
            Call("POST", "/collective_rpc", body={"method": "reload_weights"}),
            Call("POST", "/reset_prefix_cache"),
        )
    },
    is_sleeping=Call("GET", "/is_sleeping"),
    asleep=_field("is_sleeping", True),
    level_in_metrics=level_in_metrics,
    missing="the engine serves no sleep routes: is VLLM_SERVER_DEV_MODE=1 in its wrapper?",
)


READY_TIMEOUT_DEFAULT = 600  # seconds: vLLM's VLLM_ENGINE_READY_TIMEOUT_S default


def model_in(words: Sequence[str]) -> str | None:
    """The model a vLLM command names: the word after `serve`, else --model's value."""
    words = list(words)
    if "serve" in words and words.index("serve") + 1 < len(words):
        return words[words.index("serve") + 1]
    return flag_value(words, "--model")


def findings(spec: LaneConfig, base: str) -> list[Finding]:
    """vLLM's sleep routes are dev mode's (VLLM_SERVER_DEV_MODE=1), which also serves
    /collective_rpc, /reset_prefix_cache and the rest of vllm/entrypoints/serve/dev/ to anyone
    who reaches the port: a lane that sleeps listens on loopback (laned renders --host
    127.0.0.1 unless the lane sets a host), and a host others can reach is refused unless
    the lane says why (`dev_mode_exposed`)."""
    host = spec.engine_arg("--host")
    if not spec.sleep_level or host is None or loopback(host) or spec.dev_mode_exposed.strip():
        return []
    return [
        Finding(
            f"{base}.args",
            f"--host {host} with sleep_level = {spec.sleep_level}: vLLM's dev mode, "
            "which sleep needs, serves /collective_rpc, /reset_prefix_cache and /sleep to "
            "anyone who reaches that address",
            f"drop --host (laned listens on {LOOPBACK} for a lane that sleeps), or say "
            f'why others may reach it: {base}.dev_mode_exposed = "..."',
        )
    ]


def preflight(lane: str, spec: LaneConfig, facts: LaneFacts) -> list[Finding]:
    """vLLM's own rules for a lane about to start: its engine-ready timeout, and whether
    its generation config keeps the sampling defaults and stop ids."""
    return [*_ready_timeout(f"lanes.{lane}", spec), *_generation_config(lane, spec, facts)]


def _ready_timeout(base: str, spec: LaneConfig) -> Iterator[Finding]:
    """vLLM's engine-ready timeout under a long cold start."""
    ready = spec.env.get("VLLM_ENGINE_READY_TIMEOUT_S")
    if ready is None and spec.start_timeout > READY_TIMEOUT_DEFAULT:
        yield Finding(
            "ready-timeout",
            f"{base}.env.VLLM_ENGINE_READY_TIMEOUT_S is unset: older vLLM (0.16 and earlier at least) and any vLLM with "
            f"--api-server-count > 1, gives up on an engine not ready within "
            f"{READY_TIMEOUT_DEFAULT} s, shorter than start_timeout ({spec.start_timeout:g} s); "
            "a current single API server does not enforce it (vLLM #48031)",
            f'set {base}.env.VLLM_ENGINE_READY_TIMEOUT_S = "{spec.start_timeout:.0f}" (seed 001 sets 3600): harmless where it is not enforced',
            severity=Severity.WARNING,
        )
    elif ready is not None:
        try:
            seconds = float(ready.value)
        except ValueError:
            seconds = -1.0
        if seconds < spec.start_timeout:
            yield Finding(
                "ready-timeout",
                f"{base}.env.VLLM_ENGINE_READY_TIMEOUT_S = {ready.value!r} is shorter than "
                f"start_timeout ({spec.start_timeout:g} s): a vLLM that enforces it (0.16 and earlier at least, or "
                "several API servers) would end a long cold start (vLLM #48031)",
                f'set it to at least "{spec.start_timeout:.0f}"',
                severity=Severity.WARNING,
            )


SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_new_tokens")


def _generation_config(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    """Whether the sampling defaults take effect as written, and the stop ids stay.

    vLLM (vllm/config/model.py) reads the model's generation_config.json — or a
    `--generation-config DIR`'s *instead* — as a diff against Hugging Face's defaults, then
    merges --override-generation-config (laned's `sampling`) over it; the stop ids
    (`eos_token_id`) come from the same file."""
    base = f"lanes.{lane}"
    flag = spec.engine_arg("--generation-config")
    model, chosen = facts.model_generation_config, facts.flag_generation_config
    model_eos = (model or {}).get("eos_token_id")
    if chosen is not None and model_eos and chosen.get("eos_token_id") != model_eos:
        yield Finding(
            "stop-ids",
            f"{base}.args: --generation-config {flag} replaces the model's generation_config.json, "
            f"and its eos_token_id ({chosen.get('eos_token_id')}) is not the model's ({model_eos}): "
            "turns may never stop (vLLM #45591)",
            f"drop --generation-config and set {base}.sampling (laned merges it over the "
            "model's config), or copy the model's eos_token_id into that file",
            severity=Severity.WARNING,
        )
    if spec.sampling is not None and flag in (None, "auto") and model:
        written = spec.sampling.as_json_dict()
        extra = {k: model[k] for k in SAMPLING_KEYS if k in model and k not in written}
        if extra:
            shown = ", ".join(f"{k}={v}" for k, v in extra.items())
            yield Finding(
                "sampling",
                f"the model's generation_config.json also sets {shown}: vLLM applies it under "
                f"{base}.sampling",
                f"set it in {base}.sampling to change it",
                severity=Severity.NOTE,
            )


# --- the weight cache: `vllm preload` (vLLM 0.32) ---------------------------------------------
#
# Read in vllm/entrypoints/cli/preload.py and vllm/model_executor/model_loader/weight_cache/:
# one daemon per GPU loads the model once (the default loader, from disk) and holds the
# post-quantization, TP-sharded weights; an engine started with --load-format ipc_cache maps
# them through CUDA IPC (ipc_loader.py), or falls back to disk with a warning when no daemon
# answers or its fingerprint (protocol.py WeightCacheKey: checkpoint, architecture, TP/PP/DP
# rank, dtype, quantization, revision, vLLM version) differs.

# Flags of `vllm serve` that `vllm preload` refuses: the API server's (preload's parser is
# EngineArgs' alone, preload.py add_cli_args). Read off vLLM 0.32's two parsers: serve's option
# strings less preload's; tests/vllm/test_weight_cache_flags.py reads them again.
SERVER_ONLY = frozenset({
    "--allow-credentials", "--allowed-headers", "--allowed-methods", "--allowed-origins",
    "--anthropic-disabled-thinking-effort", "--api-key", "--api-server-count", "--chat-template",
    "--chat-template-content-format", "--cohere-format", "--cohere-is-reasoning-model", "--config",
    "--data-parallel-supervisor-port", "--default-chat-template-kwargs",
    "--disable-access-log-for-endpoints", "--disable-fastapi-docs", "--disable-uvicorn-access-log",
    "--dp-supervisor-probe-failure-threshold", "--dp-supervisor-probe-interval-s",
    "--dp-supervisor-probe-timeout-s", "--enable-auto-tool-choice", "--enable-flash-late-interaction",
    "--enable-force-include-usage", "--enable-log-deltas", "--enable-log-outputs",
    "--enable-log-requests", "--enable-offline-docs", "--enable-per-request-metrics",
    "--enable-prompt-tokens-details", "--enable-request-id-headers", "--enable-scale-out",
    "--enable-server-load-tracking", "--enable-ssl-refresh", "--enable-tokenizer-info-endpoint",
    "--exclude-tools-when-tool-choice-none", "--fingerprint-mode", "--fingerprint-value", "--grpc",
    "--grpc-port", "--h11-max-header-count", "--h11-max-incomplete-event-size", "--headless",
    "--host", "--log-error-stack", "--lora-modules", "--max-log-len", "--middleware", "--port",
    "--response-role", "--return-tokens-as-token-ids", "--root-path", "--sse-keep-alive-interval",
    "--ssl-ca-certs", "--ssl-cert-reqs", "--ssl-certfile", "--ssl-ciphers", "--ssl-keyfile",
    "--tokens-only", "--tool-call-parser", "--tool-parser-plugin", "--tool-server",
    "--tool-strict-level", "--trust-request-chat-template", "--trust-request-mm-kwargs", "--uds",
    "--uvicorn-log-level",
})  # fmt: skip

# Engine flags that shape the scheduler, the KV cache's size, the memory budget, compilation
# or what requests get, never the weights the daemon holds (none is in its fingerprint or
# builds a layer differently): the daemon does not get them, so changing one restarts the
# engine alone. Anything not named here reaches the daemon too (a change restarts both).
WEIGHTLESS = frozenset({
    "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--gpu-memory-utilization",
    "--kv-cache-memory", "--kv-cache-memory-bytes", "--num-gpu-blocks-override", "--block-size",
    "--enable-prefix-caching", "--no-enable-prefix-caching", "--prefix-caching-hash-algo",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--max-num-partial-prefills",
    "--max-long-partial-prefills", "--long-prefill-token-threshold", "--scheduling-policy",
    "--enforce-eager", "--compilation-config", "--cudagraph-capture-sizes",
    "--max-cudagraph-capture-size", "--served-model-name", "--override-generation-config",
    "--generation-config", "--reasoning-parser", "--disable-log-stats", "--enable-sleep-mode",
    "--shutdown-timeout", "--seed", "--structured-outputs-config", "--async-scheduling",
    "--no-async-scheduling", "--swap-space", "--kv-events-config", "--kv-transfer-config",
    "--otlp-traces-endpoint", "--collect-detailed-traces",
})  # fmt: skip

# Which of the flags above take no value (store_true or its --no- twin): the rest take one.
SWITCHES = frozenset({
    "--enable-auto-tool-choice", "--enable-prefix-caching", "--no-enable-prefix-caching",
    "--enable-chunked-prefill", "--no-enable-chunked-prefill", "--enforce-eager",
    "--disable-log-stats", "--enable-sleep-mode", "--async-scheduling", "--no-async-scheduling",
    "--headless", "--disable-uvicorn-access-log", "--disable-fastapi-docs",
    "--enable-log-requests", "--enable-log-outputs", "--enable-log-deltas",
    "--enable-prompt-tokens-details", "--enable-force-include-usage", "--enable-request-id-headers",
    "--enable-server-load-tracking", "--enable-tokenizer-info-endpoint", "--return-tokens-as-token-ids",
    "--tokens-only", "--trust-request-chat-template", "--allow-credentials", "--grpc",
    "--enable-ssl-refresh", "--enable-offline-docs", "--exclude-tools-when-tool-choice-none",
    "--log-error-stack", "--language-model-only", "--trust-remote-code", "--enable-expert-parallel",
    "--disable-custom-all-reduce", "--skip-tokenizer-init",
})  # fmt: skip

# Quantization methods whose every layer method takes pre-processed weights
# (`supports_pre_processed_weights`, checked by protocol.py check_ipc_quant_support): fp8.py
# (linear and MoE), mxfp4.py (MoE; its linear layers are unquantized), modelopt.py's FP4. The
# others below keep the base class's False (quantization/base_config.py), or are online
# quantization, which the daemon always refuses (daemon.py get_model); any other name (a
# plugin's, such as exl3) is the daemon's to judge at load.
QUANT_HELD = frozenset({"fp8", "mxfp4", "gpt_oss_mxfp4", "modelopt_fp4"})
QUANT_REFUSED = frozenset({
    "awq", "auto_awq", "awq_marlin", "gptq", "auto_gptq", "gptq_marlin", "compressed-tensors",
    "bitsandbytes", "gguf", "experts_int8", "moe_wna16", "torchao", "inc", "fbgemm_fp8",
    "fp_quant", "quark", "humming", "modelopt", "online", "fp8_per_tensor", "fp8_per_block",
    "fp8_per_channel", "int8_per_channel_weight_only", "nvfp4_per_token", "mxfp8",
})  # fmt: skip

WEIGHT_CACHE_DOC = "docs/weight-cache.md"

# The daemon's wire (protocol.py send_msg / recv_msg): an 8-byte big-endian length, then a
# pickle. laned writes plain dicts and reads the answers back as plain data only.
WC_LENGTH = struct.Struct("!Q")
WC_MAX = 1 << 30


def wc_message(message: Any) -> bytes:
    """One message to (or, in the simulator, from) a daemon: its length, then its pickle."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return WC_LENGTH.pack(len(payload)) + payload


class _PlainOnly(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers): a class or function
    named in the stream is refused, so a reply can build nothing."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: plain data only")


def wc_read(payload: bytes) -> Any:
    """A message's pickle, read back as plain data (pickle.UnpicklingError otherwise)."""
    return _PlainOnly(io.BytesIO(payload)).load()


def preload_command(words: Sequence[str]) -> list[str] | None:
    """The daemon's command from the engine's: `... serve MODEL REST` becomes `... preload
    --model MODEL REST` (preload takes the model as --model only); None without `serve MODEL`."""
    words = list(words)
    if "serve" not in words:
        return None
    at = words.index("serve")
    if at + 1 >= len(words) or words[at + 1].startswith("-"):
        return None
    return [*words[:at], "preload", "--model", words[at + 1], *daemon_flags(words[at + 2 :])]


def daemon_flags(words: Sequence[str]) -> list[str]:
    """The engine's flags the daemon gets: all but the API server's and the weightless ones."""
    return [word for word, kept in zip(words, daemon_mask(words), strict=True) if kept]


def daemon_mask(words: Sequence[str]) -> list[bool]:
    """For each of the engine's words, whether the daemon gets it: the API server's flags
    and the weightless ones are dropped with their values (`--flag=V`, or `--flag V` unless
    a switch)."""
    mask = [True] * len(words)
    i = 0
    while i < len(words):
        word = words[i]
        flag = word.split("=", 1)[0].replace("_", "-") if word.startswith("--") else ""
        takes = bool(flag) and "=" not in word and flag not in SWITCHES
        value = takes and i + 1 < len(words) and not words[i + 1].startswith("--")
        step = 2 if value else 1
        if flag in SERVER_ONLY or flag in WEIGHTLESS:
            mask[i : i + step] = [False] * step
        i += step if flag else 1
    return mask


def weight_cache_engine_lines(spec: LaneConfig, base: str, sockets: str) -> list[Line]:
    """What the engine gets to map the daemon's weights (ipc_loader.py: zero-copy, the
    fallback to disk on)."""
    config = '{"socket_dir":"' + sockets + '"}'
    return [
        (
            f"set by laned from {base}.weight_cache: the weights are mapped from the lane's "
            "weight-cache daemon (CUDA IPC, zero-copy), read from disk only if it does not answer",
            ["--load-format", "ipc_cache"],
        ),
        ("the daemon's sockets, one per GPU", ["--model-loader-extra-config", config]),
    ]


def weight_cache_daemon_lines(spec: LaneConfig, base: str, sockets: str) -> list[Line]:
    """The daemon's own flags: its sockets, its rendezvous apart from the engine's, its /health."""
    health, master, draft = spec.weight_cache_ports()
    return [
        ("where the engine finds it: one socket per GPU", ["--weight-cache-socket-dir", sockets]),
        (
            f"from {base}.weight_cache: its own rendezvous, apart from the engine's "
            "--master-port (the daemon holds its group open while it serves)",
            ["--weight-cache-master-port", str(master)],
        ),
        ("its speculative draft's group, if any", ["--weight-cache-draft-master-port", str(draft)]),
        (
            f"from {base}.weight_cache: laned waits for 200 here before it starts the engine",
            ["--weight-cache-health-port", str(health), "--weight-cache-health-host", LOOPBACK],
        ),
    ]


def _quantization(spec: LaneConfig) -> str | None:
    return spec.engine_arg("--quantization") or spec.engine_arg("-q")


def quant_finding(where: str, method: str | None, source: str) -> Finding | None:
    """Whether the daemon can hold weights quantized with `method`: an error where vLLM
    refuses it, a warning where laned cannot tell, None where it can."""
    if method is None or method in QUANT_HELD:
        return None
    if method in QUANT_REFUSED:
        return Finding(
            where,
            f"quantization {method!r} ({source}): vLLM's weight cache cannot hold it (its "
            "layers do not take pre-processed weights: protocol.py check_ipc_quant_support)",
            "remove weight_cache from this lane (it restarts from disk), or serve a "
            f"checkpoint in {', '.join(sorted(QUANT_HELD))} or unquantized",
        )
    return Finding(
        where,
        f"quantization {method!r} ({source}) is not one laned knows the weight cache to hold "
        f"({', '.join(sorted(QUANT_HELD))}, or none): the daemon checks it as it loads and exits "
        "at once if its layers cannot be shared",
        f"watch the daemon's first start (laned logs LANE --weights); see {WEIGHT_CACHE_DOC}",
        Severity.WARNING,
    )


EXPANDABLE = "expandable_segments:True"
EXPANDABLE_WHY = (
    "set by laned for the daemon alone: with expandable segments, torch hands its CUDA IPC "
    "handles over as file descriptors (pidfd_getfd), which an engine in another container or "
    "without ptrace rights cannot take (pytorch/pytorch#165685, #179220), and the engine "
    "would read its weights from disk"
)


def daemon_env(name: str, value: str) -> tuple[str, str] | None:
    """The daemon's own value of one of the lane's variables, and why, where it must differ
    from the engine's: PYTORCH_CUDA_ALLOC_CONF without expandable segments."""
    if name not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") or EXPANDABLE not in value:
        return None
    kept = [part for part in value.split(",") if part.strip() and part.strip() != EXPANDABLE]
    return ",".join(kept) or "expandable_segments:False", EXPANDABLE_WHY


def weight_cache_findings(spec: LaneConfig, base: str) -> list[Finding]:
    """What vLLM refuses of a lane that keeps its weights, seen in the config."""
    if spec.weight_cache is None:
        return []
    where = f"{base}.weight_cache"
    out: list[Finding] = []
    command = spec.exec.command if spec.exec else spec.container.command if spec.container else ()
    if preload_command(list(command)) is None:
        out.append(
            Finding(
                where,
                "the daemon is the engine's own program with `preload --model MODEL` for "
                "`serve MODEL`, and this lane's command has no `serve MODEL`",
                "write the command as `vllm serve MODEL` (exec.command or container.command)",
            )
        )
    if spec.sleep_level:
        out.append(
            Finding(
                where,
                f"cannot go with sleep_level = {spec.sleep_level}: the engine maps the daemon's "
                "memory zero-copy, which vLLM's sleep mode cannot offload (ipc_loader.py)",
                "choose one: sleep_level = 0, or remove weight_cache",
            )
        )
    if spec.gpus == ():
        out.append(
            Finding(
                where,
                "needs the lane's GPUs: vLLM shares the weights through CUDA IPC, on CUDA and "
                "ROCm only (protocol.py check_ipc_platform_support), and gpus = []",
                "remove weight_cache from this lane, or give it its GPUs",
            )
        )
    if spec.container is not None and spec.container.ipc != "host":
        out.append(
            Finding(
                where,
                "the engine's container maps the daemon's GPU memory from another container: "
                f"both need the host's IPC namespace, and container.ipc is {spec.container.ipc!r}",
                'set container.ipc = "host"',
            )
        )
    if spec.nodes:
        out.append(
            Finding(
                where,
                "is not rendered for a lane over several hosts yet (each host would run its "
                "own daemon, with --weight-cache-master-port agreed across them)",
                "remove weight_cache from this lane",
            )
        )
    for flag in ("--load-format", "--model-loader-extra-config"):
        if spec.engine_arg(flag) is not None:
            out.append(
                Finding(
                    f"{base}.args",
                    f"{flag} is laned's to set on a lane with weight_cache "
                    "(--load-format ipc_cache and the daemon's sockets)",
                    f"remove {flag} from the args",
                )
            )
    method = _quantization(spec)
    found = quant_finding(where, method, "--quantization")
    if found is not None:
        out.append(found)
    health, master, draft = spec.weight_cache_ports()
    if max(health, master, draft) > 65535:
        out.append(
            Finding(
                where,
                f"its ports run past 65535 ({health}, {master}, {draft})",
                "set weight_cache.health_port and master_port below 65535",
            )
        )
    master_port = spec.engine_arg("--master-port")
    if master_port is not None and master_port in (str(master), str(draft)):
        out.append(
            Finding(
                where,
                f"the daemon's rendezvous port {master_port} is the engine's --master-port: "
                "the daemon holds it while it serves, and the engine could not start",
                "set weight_cache.master_port to another port",
            )
        )
    return out


def weight_cache_preflight(lane: str, spec: LaneConfig, facts: LaneFacts) -> list[Finding]:
    """What vLLM refuses of a lane that keeps its weights, on this host: a quantization the
    daemon cannot hold (the model's own config.json), a host without CUDA IPC."""
    if spec.weight_cache is None:
        return []
    where = f"lanes.{lane}.weight_cache"
    out: list[Finding] = []
    if _quantization(spec) is None:
        found = quant_finding(where, facts.model_quantization, "the model's config.json")
        if found is not None:
            out.append(found)
    if facts.host.gpus is None:
        out.append(
            Finding(
                where,
                "laned cannot see a CUDA GPU here (" + (facts.host.gpu_note or "no NVML") + "); "
                "vLLM shares the weights through CUDA IPC only and refuses the weight cache "
                "elsewhere (protocol.py check_ipc_platform_support)",
                "fine for the simulator; on a GPU host, check `nvidia-smi`",
                Severity.WARNING,
            )
        )
    return out


WEIGHT_CACHE = WeightCacheApi(
    command=preload_command,
    flags=daemon_mask,
    engine_lines=weight_cache_engine_lines,
    daemon_lines=weight_cache_daemon_lines,
    mapped=WC_MAPPED,
    missed=WC_MISSED,
    env=daemon_env,
    socket_glob="vllm_weight_cache_*[!t].sock",  # the targets' (a draft's ends _draft.sock)
    findings=weight_cache_findings,
    preflight=weight_cache_preflight,
)


# Runs in the target Python: prints vLLM's version and every option string of the parser
# `vllm serve` builds (vllm/entrypoints/cli/serve.py: make_arg_parser). Module paths moved
# between releases; both the 0.32 and the older ones are tried.
FLAG_SCRIPT = """
import json
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
import vllm
parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted({o for a in parser._actions for o in a.option_strings})
version = getattr(vllm, "__version__", "unknown")
try:  # the weight-cache daemon's parser (vllm/entrypoints/cli/preload.py, vLLM 0.32)
    from vllm.entrypoints.cli.preload import PreloadSubcommand
    daemon = FlexibleArgumentParser()
    PreloadSubcommand.add_cli_args(daemon)
    preload = sorted({o for a in daemon._actions for o in a.option_strings})
except ImportError:
    preload = None
print(json.dumps({"version": version, "flags": flags, "abbrev": parser.allow_abbrev,
                  "preload": preload}))
"""

VLLM = EngineProfile(
    name="vllm",
    title="vLLM",
    recognises=recognises,
    api_key_env="VLLM_API_KEY",
    metrics=MetricNames(SUMMED, KV_USAGE),
    read_line=read_line,
    serve_lines=serve_lines,
    env=env,
    sleep=SLEEP,
    sleep_note="level 1 keeps the weights in host RAM, level 2 reads them again",
    tokenizer=Tokenizer(openai_tokenize, lambda answer: int(answer["count"])),
    model_in=model_in,
    preflight=preflight,
    findings=findings,
    owned={"--port": "port", "--served-model-name": "served_model_name"},
    flag_probe=FlagProbe("vllm", script=FLAG_SCRIPT, loose=True),
    default_port=8000,  # vllm/entrypoints/openai/cli_args.py: --port's default
    weight_cache=WEIGHT_CACHE,
    parallel_flags=(
        "--tensor-parallel-size",
        "--pipeline-parallel-size",
        "--data-parallel-size",
    ),
)
