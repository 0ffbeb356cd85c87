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
- Its flags whose value is a secret (SECRET_FLAGS), read from its parser as vLLM 0.32 builds
  it (`make_arg_parser(FlexibleArgumentParser())`: allow_abbrev on, `_` read as `-`).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from laned.config.model import LaneConfig
from laned.config.names import CACHE_MOUNT
from laned.config.secrecy import engine_flag
from laned.config.sleep import LOOPBACK, loopback
from laned.core.facts import LaneFacts
from laned.core.phases import BAR, CACHE_HIT, Phase, read_with
from laned.engines.profile import (
    Caches,
    Call,
    EngineProfile,
    FlagProbe,
    Gpus,
    HealthRule,
    Line,
    MetricNames,
    Model,
    Nodes,
    SecretFlag,
    Share,
    SleepApi,
    Tokenizer,
    given,
    json_sampling_line,
    last_given,
    last_value,
    openai_tokenize,
    port_line,
    program_words,
    served_line,
    size,
)
from laned.engines.vllm_preload import WC_MAPPED, WC_MISSED, WEIGHT_CACHE
from laned.errors import Finding, Severity

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


SLEEP_MARGIN_GIB = 8.0  # host RAM a level-1 sleep leaves free, beyond the weights it pins


PINNED_ROUNDING = 2.0  # torch rounds each pinned host block up to a power of two: at most 2x


def level_now(
    level: int,
    weights_gib: float | None,
    mem_available_gib: float | None,
    pinned: bool = False,
    unified: bool = False,
) -> tuple[int, str]:
    """The level a lane sleeps at now, and why when it is not its own: level 1 pins the
    weights in host RAM (vllm/device_allocator/cumem.py), so it needs MemAvailable, less
    SLEEP_MARGIN_GIB, to hold them; else level 2 (the weights dropped, read again at the
    wake). Unknown sizes leave the lane's level as it is.

    What level 1 pins is more than the weights: cumem.py asks torch for a pinned buffer per
    allocation, and torch's caching host allocator rounds each up to a power of two (on the
    H200, a 40 GiB buffer took 64.9 GiB of MemAvailable): up to PINNED_ROUNDING times the
    weights, the bound laned checks. Those buffers stay with the engine (`pinned`): cumem.py
    drops them at the wake into that cache, which vLLM empties only at shutdown
    (vllm/distributed/parallel_state.py), and the next sleep gets them back without pinning
    anew (a second pin of 40 GiB took 53 µs, the first 34.9 s). An engine that holds them
    sleeps at level 1 again whatever MemAvailable says: they are out of it already.

    On unified memory (`unified`: a GB10's, laned.core.unified) host RAM is the GPU's: the
    copy in pinned host memory takes from the pool what the GPU gives back, and the sleep
    frees nothing for the next lane. Level 2 drops the weights: the only level that frees
    them there (the wake reads them again, from the page cache where they stayed)."""
    if level == 1 and unified:
        return 2, (
            "its GPUs have unified memory, one pool with the host: level 1 would copy the "
            "weights into pinned host memory, the same pool, and free nothing; level 2 drops "
            "them (the wake reads them again from the page cache or the disk)"
        )
    if level != 1 or weights_gib is None or mem_available_gib is None or pinned:
        return level, ""
    need = weights_gib * PINNED_ROUNDING
    room = mem_available_gib - SLEEP_MARGIN_GIB
    if need <= room:
        return 1, ""
    return 2, (
        f"level 1 would pin up to {need:.1f} GiB of host RAM for {weights_gib:.1f} GiB of "
        f"weights (each buffer rounded up to a power of two); {mem_available_gib:.1f} GiB is "
        f"available, less a {SLEEP_MARGIN_GIB:g} GiB margin"
    )


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
    unreleased="is --enable-sleep-mode in its wrapper? (laned render)",
    platforms="vLLM's runs on CUDA, ROCm and XPU only: vllm/platforms/interface.py",
    level_now=level_now,
    # The head's executor sends sleep and wake to every worker over its message queue, the
    # headless nodes' included, and waits for each reply (vllm/v1/executor/abstract.py
    # `sleep`/`wake_up` → multiproc_executor.py `collective_rpc`; a headless node runs only
    # workers: vllm/entrypoints/cli/serve.py `run_headless`).
    across_nodes="vllm/v1/executor/abstract.py sleep/wake_up (collective_rpc to every rank)",
)


READY_TIMEOUT_DEFAULT = 600  # seconds: vLLM's VLLM_ENGINE_READY_TIMEOUT_S default


# The words that run vLLM itself, before its own: a program, never a model.
PROGRAMS = re.compile(r"^(?:.*/)?(?:vllm|python[0-9.]*|serve)$")


def model_of(words: Sequence[str], env: Mapping[str, str] = {}) -> Model | None:
    """The model a vLLM command names, as `vllm serve` reads it: --model's value wherever it
    stands (vllm/utils/argparse_utils.py FlexibleArgumentParser.parse_args moves `--model M`
    in front as the positional), else the positional `model_tag` (vllm/entrypoints/launchers/
    cli_args.py make_arg_parser; vllm/entrypoints/cli/serve.py `cmd` takes it over --model):
    the word after `serve`, or in an image whose entrypoint is `vllm serve` (vllm/vllm-openai:
    docker/Dockerfile's ENTRYPOINT ["vllm", "serve"]) the first word after the image. It
    serves it by that name (vllm/config/model.py `get_served_model_name`)."""
    words = list(words)
    flag = last_given(words, ("--model",), underscores=True)
    named, how = (flag[1], "its --model") if flag else (None, "")
    command = program_words(words)
    if named is None and "serve" in command[:-1]:
        named, how = command[command.index("serve") + 1], "the model `serve` names"
    elif named is None and len(command) == 1 and not PROGRAMS.match(command[0]):
        named, how = command[0], "the model named after the image (its entrypoint: vllm serve)"
    if named is None:
        return None
    return Model(named, named, f"vLLM serves it by {how}, as written")


# vllm/engine/arg_utils.py EngineArgs.add_cli_args, the ParallelConfig group: the sizes that
# set how many GPUs `vllm serve` takes, by their option strings.
TP = ("--tensor-parallel-size", "-tp")
PP = ("--pipeline-parallel-size", "-pp")
PCP = ("--prefill-context-parallel-size", "-pcp")
DP = ("--data-parallel-size", "-dp")
DP_LOCAL = ("--data-parallel-size-local", "-dpl")
DP_RANK = ("--data-parallel-rank", "-dpn")
EXTERNAL_LB = ("--data-parallel-external-lb", "-dpe")
NNODES = ("--nnodes", "-n")


def gpus_of(words: Sequence[str], env: Mapping[str, str] = {}) -> Gpus:
    """The GPUs one host gives `vllm serve`, by vLLM 0.32's arithmetic: a replica takes tensor
    × pipeline × prefill-context parallel GPUs (vllm/config/parallel.py ParallelConfig
    `__post_init__`: world_size), over `nnodes_within_dp` hosts when it spans several; a host
    runs --data-parallel-size-local replicas, else one for an external load balancer's rank
    (--data-parallel-rank), else on several hosts its share of them, else all
    --data-parallel-size of them (vllm/engine/arg_utils.py EngineArgs.create_engine_config,
    the data-parallel launch options). Expert parallel (--enable-expert-parallel) and decode
    context parallel (inside tensor parallel) add none; --headless runs the same engines
    without the API server."""

    def value(names: tuple[str, str]) -> str | None:
        return last_value(words, names, underscores=True)

    tp, pp, pcp = size(value(TP)), size(value(PP)), size(value(PCP))
    dp, nnodes = size(value(DP)), size(value(NNODES))
    replica = tp * pp * pcp
    local = value(DP_LOCAL)
    if value(DP_RANK) is not None or given(words, EXTERNAL_LB, underscores=True):
        here = 1
    elif local is not None and local.isdigit():
        here = int(local)
    elif nnodes > 1:
        here = max(dp * replica // nnodes // replica, 1)
    else:
        here = dp
    if here == 0:
        return Gpus(0, "vLLM's --data-parallel-size-local 0: this host runs the API server alone")
    span = 1 if nnodes == 1 else max(nnodes // max(dp // here, 1), 1)
    each = max(replica // span, 1)
    sizes = f"tensor {tp} × pipeline {pp}" + (f" × prefill context {pcp}" if pcp > 1 else "")
    sizes += f", over {span} hosts" if span > 1 else ""
    how = f"vLLM: {sizes}" if here == 1 else f"vLLM: {here} data-parallel ranks here × ({sizes})"
    return Gpus(here * each, how)


def findings(spec: LaneConfig, base: str) -> list[Finding]:
    """What vLLM would refuse or expose, seen in the config: its dev mode on a reachable
    host, a --gpu-memory-utilization it refuses, engram-disk mode under CUDA graphs."""
    return [*_dev_mode(spec, base), *_utilization(spec, base), *_engram_eager(spec, base)]


ENGRAM_DISK = "DSV41_ENGRAM_DISK"


def _engram_disk(spec: LaneConfig) -> str | None:
    """Seed 000's engram-disk switch, when on. Only the EXL3 pack's own variable: its plugin's
    NVMe reads cannot be captured in CUDA graphs. Other builds differ: seed 001's
    VLLM_MOET_ENGRAM_DISK=1 runs with CUDA graphs and pins its KV offload region."""
    var = spec.env.get(ENGRAM_DISK)
    return ENGRAM_DISK if var is not None and var.value == "1" else None


def _engram_eager(spec: LaneConfig, base: str) -> list[Finding]:
    """Engram-disk mode needs --enforce-eager, given anywhere the engine's flags are: `args`,
    a rank's, its command."""
    disk = _engram_disk(spec)
    if disk is None:
        return []
    words = [a.flag for a in spec.args] + [a.flag for r in spec.rank.values() for a in r.args]
    words += spec.command_words()
    if any(engine_flag(word) == "--enforce-eager" for word in words):
        return []
    return [
        Finding(
            f"{base}.args",
            f"{disk}=1 needs --enforce-eager",
            "CUDA graphs cannot capture the NVMe reads of engram-disk mode; add --enforce-eager",
        )
    ]


def pins_nothing(spec: LaneConfig) -> tuple[str, str] | None:
    """Engram-disk mode without --kv-offloading-size pins no host memory: --cap-add IPC_LOCK
    serves nothing there."""
    disk = _engram_disk(spec)
    if disk is None or spec.engine_arg("--kv-offloading-size") is not None:
        return None
    return f"{disk}=1", "engram-disk mode pins nothing (the pinned mode is unused)"


def generation_config(spec: LaneConfig) -> str | None:
    """--generation-config: `auto` (the model's generation_config.json), `vllm` (vLLM's own
    defaults) or a directory whose generation_config.json is read instead."""
    return spec.engine_arg("--generation-config")


def shutdown(spec: LaneConfig) -> float | None:
    """--shutdown-timeout: the seconds vLLM drains its requests for at a SIGTERM, and ~10 s
    more for its engine core and workers to exit and free their memory."""
    text = spec.engine_arg("--shutdown-timeout")
    try:
        return None if text is None else float(text) + 10
    except ValueError:
        return None


def _utilization(spec: LaneConfig, base: str) -> list[Finding]:
    """--gpu-memory-utilization must be a number in (0, 1] (vllm/config/cache.py,
    `Field(gt=0, le=1)`): vLLM refuses anything else at its start, and laned places the
    lane by it."""
    text = spec.engine_arg("--gpu-memory-utilization")
    share, _rule = gpu_share(spec)  # None: not a number
    if text is None or (share is not None and 0 < share <= 1):
        return []
    return [
        Finding(
            f"{base}.{spec.flag_key('--gpu-memory-utilization')}",
            f"--gpu-memory-utilization {text!r}: vLLM takes a part of each GPU's memory "
            "above 0 and at most 1 (vllm/config/cache.py), and refuses this at its start",
            "write it as a fraction, e.g. --gpu-memory-utilization 0.9",
        )
    ]


def _dev_mode(spec: LaneConfig, base: str) -> list[Finding]:
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
            f"{base}.{spec.flag_key('--host')}",
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

GPU_MEMORY_UTILIZATION = 0.92  # vllm/config/cache.py (0.32): gpu_memory_utilization's default


# Seed 001: FlashInfer autotune and DeepGEMM JIT take ~22 minutes at a first start, and
# "nothing is cached across --rm containers".
CACHES = Caches(
    {
        "VLLM_CACHE_ROOT": f"{CACHE_MOUNT}/vllm",  # torch.compile artifacts, vLLM's own caches
        "FLASHINFER_WORKSPACE_BASE": CACHE_MOUNT,  # FlashInfer JIT (it appends .cache/flashinfer)
        "DG_JIT_CACHE_DIR": f"{CACHE_MOUNT}/deep_gemm",  # DeepGEMM's JIT kernels
        "TRITON_CACHE_DIR": f"{CACHE_MOUNT}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_MOUNT}/inductor",
        "TORCH_EXTENSIONS_DIR": f"{CACHE_MOUNT}/torch_extensions",
        "CUDA_CACHE_PATH": f"{CACHE_MOUNT}/nv",  # the driver's PTX JIT cache
        "XDG_CACHE_HOME": f"{CACHE_MOUNT}/xdg",  # whatever else follows XDG
    },
    "persistent compile caches (FlashInfer autotune, DeepGEMM and Triton JIT, torch.compile): "
    "a second cold start reuses the first one's work",
)


def gpu_share(spec: LaneConfig) -> Share:
    """vLLM takes --gpu-memory-utilization × each GPU's memory whatever its model needs, and
    refuses to start unless that much is free ("Free memory on device ... is less than
    desired GPU memory utilization", vllm/v1/worker/utils.py `request_memory`)."""
    text = spec.engine_arg("--gpu-memory-utilization")
    if text is None:
        return (
            GPU_MEMORY_UTILIZATION,
            f"--gpu-memory-utilization {GPU_MEMORY_UTILIZATION} (vLLM's default)",
        )
    try:
        share = float(text)
    except ValueError:
        return None, f"--gpu-memory-utilization {text!r} is not a number"
    return share, f"--gpu-memory-utilization {share:g}"


API_KEY_ENV = "VLLM_API_KEY"
SECRET_FLAGS = (
    # vllm/entrypoints/launchers/cli_args.py: `api_key: list[str] | None`, nargs "+" (several
    # keys); the server takes VLLM_API_KEY where it is not given. `--api-k` is the shortest
    # prefix no other flag shares (--api-server-count).
    SecretFlag(
        ("--api-key",),
        API_KEY_ENV,
        shortest="--api-k",
        nargs="+",
    ),
    # vllm/engine/arg_utils.py `--hf-token` from vllm/config/model.py `hf_token: bool | str`:
    # nargs "?", alone it reads the token `hf auth login` stored; without it huggingface_hub
    # reads HF_TOKEN. `--hf-t` is the shortest prefix (--hf-config-path, --hf-overrides).
    SecretFlag(
        ("--hf-token",),
        "HF_TOKEN",
        shortest="--hf-t",
        nargs="?",
    ),
)


# vLLM 0.32's GET /health (vllm/entrypoints/serve/instrumentator/health.py): 200, or 503 when
# check_health raises EngineDeadError — its engine core is dead (the core's process monitor,
# vllm/v1/engine/core_client.py monitor_engine_cores, marks it so the moment the core exits).
# The API server lingers until its watchdog's next look, every 5 s
# (vllm/entrypoints/launchers/launcher.py watchdog_loop → terminate_if_errored), then exits 0;
# with VLLM_KEEP_ALIVE_ON_ENGINE_DEATH it stays up answering 503 for good. It listens only once
# its engine is up and answers /health 200 asleep: a 503 is never a start or a sleep. The lines
# it logs as its core dies: core_client.py's monitor, core.py's fatal error, async_llm.py's
# output handler and the EngineDeadError it raises (vllm/v1/engine/exceptions.py).
HEALTH = HealthRule(
    dead=frozenset({503}),
    why="vLLM's engine core is dead (EngineDeadError); its API server would exit 0 at its "
    "watchdog's next look, within 5 s",
    dying=re.compile(
        r"engine core exited unexpectedly|EngineCore encountered a fatal error"
        r"|AsyncLLM output_handler failed|EngineDeadError|Engine core proc \S+ died unexpectedly"
    ),
)


VLLM = EngineProfile(
    name="vllm",
    title="vLLM",
    recognises=recognises,
    api_key_env=API_KEY_ENV,
    metrics=MetricNames(SUMMED, KV_USAGE),
    read_line=read_line,
    serve_lines=serve_lines,
    env=env,
    sleep=SLEEP,
    sleep_note="level 1 keeps the weights in host RAM, level 2 reads them again",
    tokenizer=Tokenizer(openai_tokenize, lambda answer: int(answer["count"])),
    model_of=model_of,
    gpus_of=gpus_of,
    preflight=preflight,
    findings=findings,
    owned={"--port": "port", "--served-model-name": "served_model_name"},
    flag_probe=FlagProbe("vllm", script=FLAG_SCRIPT, loose=True, env={"VLLM_NO_USAGE_STATS": "1"}),
    default_port=8000,  # vllm/entrypoints/openai/cli_args.py: --port's default
    weight_cache=WEIGHT_CACHE,  # laned/engines/vllm_preload.py
    gpu_share=gpu_share,
    share_flag="--gpu-memory-utilization",
    caches=CACHES,
    secret_flags=SECRET_FLAGS,
    health=HEALTH,
    nodes=Nodes(
        "--nnodes", "--headless", "a worker rank: no API server, vLLM's runtime on this host"
    ),
    generation_config=generation_config,
    shutdown=shutdown,
    pins_nothing=pins_nothing,
    gate_hints={
        "reasoning": "check --reasoning-parser",
        "tools": "check --enable-auto-tool-choice and --tool-call-parser",
    },
    launch="vLLM (`vllm serve MODEL`, `--model M`)",
)
