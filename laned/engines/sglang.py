"""SGLang (`python -m sglang.launch_server`): what laned knows of it, in one place. Read from
its source, PyPI's sglang 0.5.23 (paths below are under sglang/); its CPU build was not run
here (docs/simulator.md says why), so the simulator's SGLang face plays it from this reading.

- The flags laned adds: --port, --served-model-name, --enable-metrics (no /metrics without
  it: srt/arg_groups/fields/serving.py), the sampling defaults as
  --preferred-sampling-params (JSON), and for a lane that sleeps --enable-memory-saver and
  --enable-weights-cpu-backup (srt/arg_groups/fields/exec_.py).
- Its API key: SGLang reads no variable for it, only --api-key
  (srt/arg_groups/fields/serving.py), which would put it in argv; it also reads options from
  a YAML file named by --config (srt/server_args.py, srt/utils/server_args_config_parser.py),
  so laned's wrapper writes `api-key: "..."` into a 0600 file of its own and passes
  --config. The secrets file defines it as SGLANG_API_KEY (laned's name, not SGLang's).
- Its other flags whose value is a secret (SECRET_FLAGS): --admin-api-key and
  --ssl-keyfile-password (srt/arg_groups/fields/serving.py), for which it reads no variable
  either; laned's key file carries the API key alone, so laned refuses them. Its parser is
  argparse's (srt/server_args.py `prepare_server_args`: allow_abbrev on, `_` not read as `-`).
- Readiness: /health answers 503 while the server starts (ServerStatus.Starting), 200 once
  up (srt/entrypoints/http_server.py `health_generate`); /v1/models lists the served name.
- Its log lines: "Load weight begin", the shard bar "Loading safetensors checkpoint shards"
  (srt/model_loader/weight_utils.py), "Load weight end", "KV Cache is allocated" /
  "Memory pool end" (srt/mem_cache/kv_cache_configurator.py), "Capture ... CUDA graph
  begin" (srt/model_executor/model_runner_components/cuda_graph_setup.py), "Uvicorn running
  on", "The server is fired up and ready to roll!" (srt/entrypoints/http_server.py).
- Its /metrics (srt/observability/metrics_collector.py): sglang:num_running_reqs,
  num_queue_reqs, prompt_tokens_total and generation_tokens_total (counted as a request
  finishes), token_usage (the KV pool's use), and realtime_tokens_total (tokens processed,
  updated each log interval while requests run: the progress the stall rule reads).
- How it sleeps: POST /release_memory_occupation and /resume_memory_occupation (every tag:
  weights, KV cache, CUDA graphs; srt/entrypoints/http_server.py), only with
  --enable-memory-saver; the weights survive only with --enable-weights-cpu-backup
  (srt/managers/scheduler_components/weight_updater.py), which is vLLM's level 1. Level 2
  (weights dropped, read again from disk after the resume) is not laned's yet. It has no
  route that says whether it sleeps: laned's record and the GPU memory say. Those routes
  take the API key where one is set (AuthLevel.ADMIN_OPTIONAL, srt/utils/auth.py).
- How it dies: a child that fails sends its parent SIGQUIT, whose handler kills the process
  tree, itself last, with SIGKILL (srt/managers/tokenizer_manager.py
  `running_phase_sigquit_handler`, srt/utils/common.py `kill_process_tree`): the wrapper
  sees status 137, or 0 where the kill of itself fails and `sys.exit(0)` runs.
- Its tokenizer: POST /tokenize as vLLM's (a prompt or chat messages; `count`:
  srt/entrypoints/openai/protocol.py TokenizeRequest, TokenizeResponse).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence

from laned.config.model import LaneConfig
from laned.config.names import CACHE_MOUNT
from laned.core.phases import BAR, Phase, read_with
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
from laned.errors import Finding

PHASES: list[tuple[re.Pattern[str], Phase | None, str | None]] = [
    (re.compile(r"Loading safetensors checkpoint shards" + BAR), Phase.LOADING_WEIGHTS, None),
    (re.compile(r"Load weight begin"), Phase.LOADING_WEIGHTS, None),
    (re.compile(r"Load weight end"), Phase.WEIGHTS_LOADED, None),
    (re.compile(r"KV Cache is allocated|Memory pool end"), Phase.PROFILING, None),
    (re.compile(r"DeepG[Ee][Mm][Mm]|deep_gemm"), Phase.DEEPGEMM, None),
    (re.compile(r"Capture .*(?:CUDA graph|cuda graph).* begin"), Phase.CUDA_GRAPHS, None),
    (re.compile(r"Uvicorn running on"), Phase.API_SERVER, None),
    (re.compile(r"The server is fired up and ready to roll"), Phase.SERVING, None),
    (re.compile(r"Init torch distributed begin"), Phase.LOADING_MODEL, None),
]
# "server_args=ServerArgs(...)" names every feature: it says nothing of where a start is.
SETTINGS = re.compile(r"server_args=ServerArgs\(")

SUMMED = {
    "sglang:num_running_reqs": "running",
    "sglang:num_queue_reqs": "waiting",
    "sglang:generation_tokens_total": "generation_tokens",
    "sglang:prompt_tokens_total": "prompt_tokens",
    "sglang:realtime_tokens_total": "steps",
}
USAGE = {"sglang:token_usage": "kv"}

KEY_FLAG, KEY_NAME = "--config", "api-key"


def model_of(words: Sequence[str], env: Mapping[str, str] = {}) -> Model | None:
    """The model an SGLang command names: --model-path, or its alias --model, the last given
    (srt/arg_groups/fields/model.py `model_path`, aliases=["--model"]; argparse keeps the
    last), else the word right after `sglang serve` (cli/serve.py
    `_normalize_positional_model_path` makes it --model-path). Without --served-model-name it
    serves it by that path (srt/arg_groups/serving_hook.py: served_model_name = model_path)."""
    words = list(words)
    flag = last_given(words, ("--model-path", "--model"))
    named, how = (flag[1], f"its {flag[0]}") if flag else (None, "")
    command = program_words(words)
    if named is None and "serve" in command[:-1]:
        named, how = command[command.index("serve") + 1], "the model `sglang serve` names"
    if named is None:
        return None
    return Model(named, named, f"SGLang serves it by {how}, as written")


# srt/arg_groups/fields/parallel.py: the sizes that set how many GPUs SGLang takes, by their
# option strings. `--tp` and `--dp`, as SGLang's own docs write them, are argparse
# abbreviations (srt/server_args.py `prepare_server_args`: allow_abbrev on) that only
# --tp-size and --dp-size start with in 0.5.23's fields; `--pp` is not one (--pp-size,
# --pp-max-micro-batch-size and --pp-async-batch-depth share it).
TP = ("--tp-size", "--tensor-parallel-size", "--tp")
PP = ("--pp-size", "--pipeline-parallel-size")
DP = ("--dp-size", "--data-parallel-size", "--dp")
ATTN_DP = ("--attn-dp-size", "--attention-data-parallel-size")
DP_ATTENTION = ("--enable-dp-attention",)
NNODES = ("--nnodes",)


def gpus_of(words: Sequence[str], env: Mapping[str, str] = {}) -> Gpus:
    """The GPUs one host gives SGLang, by its own arithmetic: each data-parallel replica is one
    tensor × pipeline group (srt/managers/data_parallel_controller.py `launch_dp_schedulers`
    steps base_gpu_id by tp_size × pp_size per replica); with data-parallel attention the
    attention DP groups run inside that one group (`launch_dp_attention_schedulers`;
    srt/runtime_context.py `num_dp_ranks_of`: "DP attention does not run inside replicas"),
    and the older spelling `--dp-size N --enable-dp-attention` means --attn-dp-size N with one
    replica (srt/arg_groups/parallel_hook.py `handle_deprecated_dp_attention`). Expert
    parallel (--ep-size), attention context parallel and decode context parallel run inside
    tensor parallel and add none. Over --nnodes hosts each takes its share
    (srt/arg_groups/validation_hook.py: (tp_size × pp_size) % nnodes == 0)."""
    tp, pp = size(last_value(words, TP)), size(last_value(words, PP))
    dp, attn_dp = size(last_value(words, DP)), size(last_value(words, ATTN_DP))
    nnodes = max(size(last_value(words, NNODES)), 1)
    if given(words, DP_ATTENTION) and attn_dp == 1:
        attn_dp, dp = dp, 1
    group = f"tensor {tp} × pipeline {pp}"
    if attn_dp > 1:
        how = f"SGLang: {group} (data-parallel attention: its {attn_dp} groups run inside it)"
        total = tp * pp
    else:
        how = f"SGLang: {dp} data-parallel replicas × {group}" if dp > 1 else f"SGLang: {group}"
        total = dp * tp * pp
    over = f", over {nnodes} hosts" if nnodes > 1 else ""
    return Gpus(max(total // nnodes, 1), how + over)


def recognises(words: Sequence[str]) -> bool:
    """A command or image that names SGLang (`python -m sglang.launch_server`,
    lmsysorg/sglang images, `sglang serve`)."""
    return any("sglang" in word.lower() for word in words)


def serve_lines(spec: LaneConfig, base: str) -> list[Line]:
    """The flags laned adds to an SGLang lane's command, each with its reason."""
    lines = json_sampling_line(
        spec,
        f"{base}.sampling: defaults for requests that send none",
        "--preferred-sampling-params",
    )
    lines += [port_line(spec, base), served_line(spec, base, "--served-model-name")]
    if "--enable-metrics" not in spec.engine_args():
        lines.append(
            (
                "set by laned: SGLang serves /metrics only with --enable-metrics, and laned "
                "reads its load and progress there",
                ["--enable-metrics"],
            )
        )
    if spec.sleep_level:
        lines.append(
            (
                f"set by laned from {base}.sleep_level = 1: a swap away releases its GPU memory "
                "(/release_memory_occupation), the weights kept in host memory",
                ["--enable-memory-saver", "--enable-weights-cpu-backup"],
            )
        )
    return lines


def findings(spec: LaneConfig, base: str) -> list[Finding]:
    """--config is laned's on an SGLang lane with a secrets file (the key's file)."""
    out = []
    if spec.secrets_path and spec.engine_arg(KEY_FLAG) is not None:
        out.append(
            Finding(
                f"{base}.args",
                f"{KEY_FLAG} is laned's on an SGLang lane with a secrets file: the wrapper "
                "hands SGLang its API key in a config file of its own",
                f"move the options of that file into {base}.args",
            )
        )
    return out


SLEEP = SleepApi(
    levels=(1,),
    sleep=lambda level: Call("POST", "/release_memory_occupation", body={}),
    wake=Call("POST", "/resume_memory_occupation", body={}),
    awake=None,
    after_wake={},
    is_sleeping=None,
    asleep=lambda answer: False,
    level_in_metrics=lambda page: None,
    missing="the engine serves no memory routes: is --enable-memory-saver in its wrapper?",
    unreleased="is --enable-memory-saver in its wrapper? (laned render)",
    platforms="SGLang's needs CUDA: torch_memory_saver",
)


# Runs in the target Python: prints SGLang's version and every option string of the parser
# `python -m sglang.launch_server` builds (srt/server_args.py: `prepare_server_args`).
FLAG_SCRIPT = """
import argparse
import json
from sglang.srt.server_args import ServerArgs
try:
    from sglang.version import __version__ as version
except ImportError:
    version = "unknown"
parser = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(parser)
flags = sorted({o for a in parser._actions for o in a.option_strings})
print(json.dumps({"version": version, "flags": flags, "abbrev": parser.allow_abbrev}))
"""


# SGLang points its kernel caches (Triton, Inductor, CUDA, TileLang, FlashInfer) under
# SGLANG_CACHE_DIR when it is imported, and sets DeepGEMM's DG_JIT_CACHE_DIR from it whatever
# was set before (srt/environ.py `redirect_third_party_caches`, default ~/.cache/sglang;
# srt/layers/deep_gemm_wrapper/compile_utils.py): the one variable that keeps them all.
CACHES = Caches(
    {
        "SGLANG_CACHE_DIR": f"{CACHE_MOUNT}/sglang",
        "TORCH_EXTENSIONS_DIR": f"{CACHE_MOUNT}/torch_extensions",
        "XDG_CACHE_HOME": f"{CACHE_MOUNT}/xdg",  # whatever else follows XDG
    },
    "persistent compile caches (DeepGEMM, FlashInfer, Triton and TileLang JIT, torch.compile, "
    "all under SGLANG_CACHE_DIR): a second cold start reuses the first one's work",
)


def gpu_share(spec: LaneConfig) -> Share:
    """Not a fixed part of the GPU: SGLang sizes its KV pool from the memory free at its start,
    less a slack of (1 - --mem-fraction-static) of what was free before the weights
    (srt/mem_cache/kv_cache_configurator.py `_profile_available_bytes`), and keeps the slack
    for activations and CUDA graphs (srt/arg_groups/memory_hook.py): whatever the fraction,
    it takes what is free on its GPUs when it starts."""
    return (
        None,
        "SGLang takes the memory free on its GPUs at its start, --mem-fraction-static of it",
    )


API_KEY_ENV = "SGLANG_API_KEY"  # laned's name: SGLang reads no variable for its key
SECRET_FLAGS = (
    # srt/arg_groups/fields/serving.py: `api_key`, `admin_api_key`, `ssl_keyfile_password`,
    # each Optional[str] (one word); laned hands the API key over in its key file (KEY_FLAG).
    # No other flag of 0.5.23 starts with --ap, none but the admin key with --ad, and
    # --ssl-keyfile is a flag of its own: the shortest prefixes argparse takes.
    SecretFlag(("--api-key",), API_KEY_ENV, shortest="--ap"),
    SecretFlag(
        ("--admin-api-key",),
        None,
        shortest="--ad",
        instead="SGLang reads the admin key from argv or its --config file only, and laned's "
        "key file carries the API key alone: leave it out (its admin-optional routes then take "
        "the API key, SGLANG_API_KEY in the lane's secrets file; those that need an admin key "
        "answer 403: srt/utils/auth.py)",
    ),
    SecretFlag(
        ("--ssl-keyfile-password",),
        None,
        shortest="--ssl-keyfile-",
        instead="SGLang reads it from argv or its --config file only: use an SSL key file "
        "without a passphrase (openssl pkey -in KEY -out PLAIN; mode 0600), or leave TLS to a "
        "proxy in front of laned",
    ),
)


# SGLang 0.5.23's GET /health (srt/entrypoints/http_server.py health_generate): 503 while it
# starts (ServerStatus.Starting) or shuts down (gracefully_exit); once up, it generates one
# token (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, on by default) and answers 503 when the
# scheduler gave nothing back for SGLANG_HEALTH_CHECK_TIMEOUT (20 s): ServerStatus.UnHealthy,
# and the server stays up so. laned probes only a serving engine that it is not stopping, so a
# 503 then is that verdict. A child that fails sends the server SIGQUIT and it kills its own
# tree (srt/managers/tokenizer_manager.py running_phase_sigquit_handler, srt/entrypoints/
# engine.py launch_phase_sigquit_handler): its exit follows those lines at once.
HEALTH = HealthRule(
    dead=frozenset({503}),
    why="SGLang's own health check got no token from its scheduler (ServerStatus.UnHealthy); "
    "it stays up so",
    dying=re.compile(
        r"SIGQUIT received\. .*one child failed|Received sigquit from a child process"
        r"|Health check failed\. Server couldn't get a response"
    ),
)


SGLANG = EngineProfile(
    name="sglang",
    title="SGLang",
    recognises=recognises,
    api_key_env=API_KEY_ENV,
    metrics=MetricNames(SUMMED, USAGE),
    read_line=functools.partial(read_with, PHASES, SETTINGS),
    serve_lines=serve_lines,
    sleep=SLEEP,
    sleep_note="its weights come back after a level-2 release only through "
    "/update_weights_from_disk, which laned does not drive",
    tokenizer=Tokenizer(openai_tokenize, lambda answer: int(answer["count"])),
    model_of=model_of,
    gpus_of=gpus_of,
    owned={"--port": "port", "--served-model-name": "served_model_name"},
    flag_probe=FlagProbe("sglang", script=FLAG_SCRIPT),
    default_port=30000,  # srt/arg_groups/fields/serving.py: port's default
    findings=findings,
    key_file=(KEY_FLAG, KEY_NAME),
    gpu_share=gpu_share,
    caches=CACHES,
    secret_flags=SECRET_FLAGS,
    health=HEALTH,
    nodes=Nodes("--nnodes"),
    gate_hints={"reasoning": "check --reasoning-parser", "tools": "check --tool-call-parser"},
    launch="SGLang (`python3 -m sglang.launch_server --model-path M`)",
)
