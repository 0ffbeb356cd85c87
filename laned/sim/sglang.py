"""The simulator's SGLang face: `laned sim sglang --model-path M [SGLang flags]` plays
`python -m sglang.launch_server` over the same engine (pacing, faults, sleep state) as the
vLLM face. Each behaviour from SGLang 0.5.23's source (paths under sglang/, the PyPI wheel),
listed in docs/simulator.md:

- Flags: --model-path (or --model), --host, --port, --served-model-name, --api-key,
  --config FILE (a YAML file of options: `api-key: "..."`, srt/server_args.py,
  srt/utils/server_args_config_parser.py), --context-length, --max-running-requests,
  --enable-metrics, --enable-memory-saver, --enable-weights-cpu-backup,
  --preferred-sampling-params (JSON), --tool-call-parser, --reasoning-parser; others are
  accepted with no effect, as the vLLM face does.
- Startup lines (srt/model_executor/model_runner.py, srt/model_loader/weight_utils.py,
  srt/mem_cache/kv_cache_configurator.py, .../cuda_graph_setup.py, srt/entrypoints/
  http_server.py): "Load weight begin", the shard bar, "Load weight end", "KV Cache is
  allocated", "Memory pool end", "Capture cuda graph begin/end" (none with
  --disable-cuda-graph), then uvicorn's "Uvicorn running on", a warmup request, "The server
  is fired up and ready to roll!". The port listens only once the scheduler is up; /health
  answers 503 until the warmup is done (ServerStatus.Starting), then 200.
- /metrics only with --enable-metrics (else 404), names from srt/observability/
  metrics_collector.py: sglang:num_running_reqs, num_queue_reqs, token_usage,
  gen_throughput, prompt_tokens_total and generation_tokens_total (counted when a request
  finishes: `observe_one_finished_request`), realtime_tokens_total{mode} (tokens processed,
  growing while requests run). /health*, /ready and /metrics take no key
  (srt/utils/auth.py `decide_request_auth`); the rest does where a key is set.
- Memory release and resume (srt/entrypoints/http_server.py, srt/managers/
  scheduler_components/weight_updater.py): POST /release_memory_occupation asserts the
  server is idle (an error answer otherwise), then releases the weights (kept in host
  memory with --enable-weights-cpu-backup; else their memory comes back holding nothing)
  and the KV cache; POST /resume_memory_occupation takes them back. Without
  --enable-memory-saver the adapter is a no-op: both answer 200 and nothing is released.
- Death: a child that fails sends the parent SIGQUIT, whose handler kills the tree and the
  parent itself with SIGKILL (srt/managers/tokenizer_manager.py
  `running_phase_sigquit_handler`, srt/utils/common.py `kill_process_tree`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from laned.errors import EngineError
from laned.sim import gpu
from laned.sim.http import Request, Response
from laned.sim.metrics import Metrics, _labels, _num
from laned.sim.settings import Settings, split_flags
from laned.sim.sleep import Sleep
from laned.sim.startup import Pause, tqdm_bar


class Engine(Protocol):
    """What this face reads and sets of the simulated engine (laned.sim.engine.Engine)."""

    settings: Settings
    metrics: Metrics
    sleep: Sleep
    dead: bool
    stalled: bool
    warmed: bool

    def authorize(self, request: Request) -> Response | None:
        """401 for a request without the engine's key, where it has one."""


USAGE = "usage: laned sim sglang --model-path MODEL [--host H] [--port P] [--served-model-name N] [--config FILE] [SGLang flags]"
SWITCHES = {
    "--enable-metrics",
    "--enable-memory-saver",
    "--enable-weights-cpu-backup",
    "--disable-cuda-graph",
    "--trust-remote-code",
    "--enable-p2p-check",
}
PUBLIC = ("/health", "/ready", "/metrics")  # srt/utils/auth.py: always allowed
MEMORY_ROUTES = ("/release_memory_occupation", "/resume_memory_occupation")


def _config_file(path: str) -> dict[str, str]:
    """The options of a --config YAML file, as far as laned's wrapper writes them
    (`key: "value"` lines)."""
    try:
        with open(path, encoding="utf-8") as handle:
            text = handle.read()
    except OSError as exc:
        raise EngineError(f"--config {path}: {exc.strerror}", USAGE) from None
    out = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() and not key.lstrip().startswith("#"):
            value = value.strip()
            out[key.strip()] = json.loads(value) if value.startswith('"') else value
    return out


def parse(args: Sequence[str], env: Mapping[str, str], settings: Settings) -> Settings:
    """SGLang's flags into `settings` (whose LANED_SIM_* tuning the caller reads)."""
    values = split_flags(args, SWITCHES, USAGE)
    if "--config" in values:
        for key, value in _config_file(values.pop("--config")).items():
            values.setdefault("--" + key.replace("_", "-"), value)
    settings.face = "sglang"
    settings.gpu_share = None  # of what is free at its start (laned/sim/gpu.py)
    settings.model = values.pop("--model-path", "") or values.pop("--model", "")
    if not settings.model:
        raise EngineError("--model-path is required", USAGE)
    settings.host = "127.0.0.1"  # SGLang's default (srt/arg_groups/fields/serving.py)
    settings.port = 30000
    known = {
        "--host": lambda v: setattr(settings, "host", v),
        "--port": lambda v: setattr(settings, "port", int(v)),
        "--served-model-name": lambda v: setattr(settings, "served_model_name", v),
        "--api-key": lambda v: setattr(settings, "api_key", v),
        "--context-length": lambda v: setattr(settings, "max_model_len", int(v)),
        "--max-running-requests": lambda v: setattr(settings, "max_num_seqs", int(v)),
        "--enable-metrics": lambda v: setattr(settings, "enable_metrics", True),
        "--enable-memory-saver": lambda v: setattr(settings, "enable_sleep_mode", True),
        "--enable-weights-cpu-backup": lambda v: setattr(settings, "weights_cpu_backup", True),
        "--disable-cuda-graph": lambda v: setattr(settings, "enforce_eager", True),
        "--mem-fraction-static": lambda v: setattr(settings, "mem_fraction", float(v)),
        "--reasoning-parser": lambda v: setattr(settings, "reasoning_parser", v or None),
        "--tool-call-parser": lambda v: setattr(settings, "auto_tool_choice", True),
        "--preferred-sampling-params": lambda v: setattr(
            settings, "override_generation_config", json.loads(v)
        ),
    }
    for flag, value in values.items():
        try:
            if flag in known:
                known[flag](value)
            else:
                settings.unknown.append(flag)
        except ValueError:
            raise EngineError(f"{flag}: {value!r} is not a valid value", USAGE) from None
    settings.enable_metrics = settings.enable_metrics is True
    # srt/environ.py: SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION = EnvBool(True);
    # srt/entrypoints/http_server.py: HEALTH_CHECK_TIMEOUT = int(os.getenv(..., 20)).
    generation = env.get("SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION", "true").lower()
    settings.health_generation = generation in ("1", "true", "yes", "on", "y")
    with contextlib.suppress(ValueError):
        settings.health_timeout = int(env.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
    return settings


# --- startup ------------------------------------------------------------------------------


def say(message: str, prefix: str = "") -> None:
    """A line in SGLang's format: `[2026-12-05 21:01:27 TP0] message` (srt/utils/common.py
    `configure_logger`: "[%(asctime)s{prefix}] %(message)s")."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    print(f"[{stamp}{prefix}] {message}", file=sys.stderr, flush=True)


def _log(message: str) -> None:
    say(message, " TP0")


async def cold_start(s: Settings, pause: Pause) -> bool:
    """SGLang's startup lines over LANED_SIM_STARTUP seconds; False when told to stop."""
    _log("Init torch distributed begin.")
    if not await pause(s.startup * 0.05):
        return False
    if s.sim_gpus:  # the pool sized from what is free (srt/mem_cache/kv_cache_configurator.py)
        s.sim_held = gpu.sim_take(s.sim_gpus, s.visible, None, s.mem_fraction)
    _log("Load weight begin. avail mem=94.12 GB")
    if not await tqdm_bar("Loading safetensors checkpoint shards", 8, s.startup * 0.45, pause):
        return False
    _log(f"Load weight end. type=LlamaForCausalLM, dtype=torch.bfloat16, avail mem={94.12 - s.weights_gib:.2f} GB, mem usage={s.weights_gib:.2f} GB.")  # fmt: skip
    if not await pause(s.startup * 0.1):
        return False
    _log(f"KV Cache is allocated. #tokens: {s.kv_capacity}, K size: 1.00 GB, V size: 1.00 GB")
    _log("Memory pool end. avail mem=8.00 GB")
    if not s.enforce_eager:
        _log("Capture cuda graph begin. This can take up to several minutes. avail mem=8.00 GB")
        if not await pause(s.startup * 0.3):
            return False
        _log("Capture cuda graph end. Time elapsed: 1.00 s. mem usage=0.50 GB. avail mem=7.50 GB.")
    return True


def listening_lines(s: Settings, pid: int) -> None:
    """uvicorn's lines as SGLang's server starts (srt/entrypoints/http_server.py)."""
    print(f"INFO:     Started server process [{pid}]", file=sys.stderr, flush=True)
    print(f"INFO:     Uvicorn running on http://{s.host}:{s.port} (Press CTRL+C to quit)", file=sys.stderr, flush=True)  # fmt: skip


async def warm_up(engine: Engine, seconds: float) -> None:
    """The warmup request SGLang sends itself once it listens; /health is 503 until then."""
    await asyncio.sleep(seconds)
    say("The server is fired up and ready to roll!")
    engine.warmed = True


# --- routes -------------------------------------------------------------------------------


async def route(engine: Engine, request: Request) -> Response | None:
    """What SGLang answers differently from the vLLM face; None: the common handling."""
    s, path = engine.settings, request.path
    if path.startswith("/health"):
        return await _health(engine, path)
    if path == "/metrics":
        if not s.enable_metrics:
            return Response.json({"detail": "Not Found"}, 404)
        return Response.text(render_metrics(engine.metrics, s))
    if not path.startswith(PUBLIC) and path not in ("/sim/fault", "/sim/state"):
        denied = engine.authorize(request)
        if denied is not None:
            return denied
    if path in MEMORY_ROUTES:
        return await _memory(engine, path)
    return None


async def _health(engine: Engine, path: str) -> Response:
    """GET /health, /health_generate (srt/entrypoints/http_server.py health_generate): 503
    while it starts; then, generating one token, 200 as soon as the scheduler answers, or 503
    after HEALTH_CHECK_TIMEOUT without an answer (a wedged scheduler: ServerStatus.UnHealthy,
    and it stays up so). /health without generation answers 200 whatever runs."""
    if engine.dead:
        # A child failed: the server kills its own tree from its SIGQUIT handler at once, no
        # request answered in between (die: the simulator's half second is for the fault's
        # own answer to go out). No answer, then, until the kill ends the connection.
        await asyncio.Event().wait()
    if not engine.warmed:
        return Response(503, b"", "application/json")
    generates = path == "/health_generate" or engine.settings.health_generation
    if not generates or not engine.stalled:
        return Response(200, b"", "application/json")
    tic = time.strftime("%H:%M:%S")
    await asyncio.sleep(engine.settings.health_timeout)
    say(
        "Health check failed. Server couldn't get a response from detokenizer for last "
        f"{engine.settings.health_timeout:g} seconds. tic start time: {tic}. "
        f"last_heartbeat time: {tic}"
    )
    return Response(503, b"", "application/json")


async def _memory(engine: Engine, path: str) -> Response:
    s, sleep = engine.settings, engine.sleep
    if path == MEMORY_ROUTES[0]:
        if engine.metrics.running + engine.metrics.waiting > 0:
            # weight_updater.py asserts the server is idle; the handler answers the error.
            message = "release_memory_occupation should be called only when server is idle."
            return Response.json({"error": {"message": message}}, 400)
        if s.enable_sleep_mode:  # without the memory saver, its adapter does nothing
            await sleep._sleep(1 if s.weights_cpu_backup else 2, "wait")
        return Response(200, b"", "application/json")
    if s.enable_sleep_mode and sleep.asleep:
        await sleep._wake(None)
    return Response(200, b"", "application/json")


def die() -> None:
    """A child failed: SIGQUIT to the parent, which kills its tree and itself (SIGKILL)."""
    say("SIGQUIT received. signum=None, frame=None. It usually means one child failed.")
    say(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=True, pid={os.getpid()}")  # fmt: skip
    asyncio.get_running_loop().call_later(0.5, os.kill, os.getpid(), signal.SIGKILL)


# --- /metrics -----------------------------------------------------------------------------


def render_metrics(m: Metrics, s: Settings) -> str:
    """SGLang's names over the engine's numbers."""
    base = {"model_name": s.name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0"}
    out: list[str] = []

    def family(name: str, kind: str, help_text: str, samples: list[tuple[str, dict[str, str], float]]) -> None:  # fmt: skip
        out.append(f"# HELP sglang:{name} {help_text}")
        out.append(f"# TYPE sglang:{name} {kind}")
        out.extend(f"sglang:{n}{_labels(labels)} {_num(v)}" for n, labels, v in samples)

    family("num_running_reqs", "gauge", "The number of running requests.", [("num_running_reqs", base, m.running)])  # fmt: skip
    family("num_queue_reqs", "gauge", "The number of requests in the waiting queue.", [("num_queue_reqs", base, m.waiting)])  # fmt: skip
    family("token_usage", "gauge", "The token usage.", [("token_usage", base, m.kv_usage)])
    family("gen_throughput", "gauge", "The generation throughput (token/s).", [("gen_throughput", base, s.decode_tps if m.running else 0.0)])  # fmt: skip
    steps = m.histograms["iteration_tokens_total"]
    prompts, generated = (
        m.histograms["request_prompt_tokens"],
        m.histograms["request_generation_tokens"],
    )
    family("prompt_tokens_total", "counter", "Number of prefill tokens processed.", [("prompt_tokens_total", base, prompts.total)])  # fmt: skip
    family("generation_tokens_total", "counter", "Number of generation tokens processed.", [("generation_tokens_total", base, generated.total)])  # fmt: skip
    family("num_requests_total", "counter", "Number of requests processed.", [("num_requests_total", base, generated.count)])  # fmt: skip
    family(
        "realtime_tokens_total",
        "counter",
        "Total number of tokens processed (updated on each log interval). mode: prefill_compute, prefill_cache, decode.",
        [("realtime_tokens_total", {**base, "mode": "decode"}, steps.total)],
    )
    return "\n".join(out) + "\n"


def models_entry(s: Settings, created: float) -> dict[str, Any]:
    """Its /v1/models entry (srt/entrypoints/http_server.py: ModelCard with max_model_len)."""
    return {
        "id": s.name,
        "object": "model",
        "created": int(created or time.time()),
        "owned_by": "sglang",
        "root": s.model,
        "max_model_len": s.max_model_len,
    }
