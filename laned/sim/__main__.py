"""`laned sim serve MODEL [vLLM flags]` (also `python -m laned.sim serve ...`, and `vllm` in the image);
`laned sim sglang --model-path MODEL [SGLang flags]` plays SGLang (laned/sim/sglang.py);
`laned sim preload --model MODEL [vLLM flags]` plays vLLM's weight-cache daemon, which
`serve ... --load-format ipc_cache` maps its weights from (laned/sim/preload.py).

Startup is paced like vLLM's: the port is bound at once but refuses connections while the
engine "loads", and the log shows vLLM's own lines in their shapes (laned/sim/startup.py). Tuning comes from the environment so
that units and containers can set it: LANED_SIM_STARTUP (seconds, default 3),
LANED_SIM_DECODE_TPS (50), LANED_SIM_PREFILL_TPS (5000), LANED_SIM_FAIL_AT_START
(an exit code to die with during startup), LANED_SIM_JIT (seconds of FlashInfer autotune
and DeepGEMM JIT at a cold start, default 0; skipped when VLLM_CACHE_ROOT already holds
the results of an earlier start, as a persistent compile cache makes it),
LANED_SIM_SHUTDOWN (seconds between closing the port and exiting after SIGTERM, default 0:
a real engine spends them ending its engine-core processes and releasing GPU memory),
LANED_SIM_HOLD_GPU_GIB (GiB of GPU 0 taken with torch at load and held until exit, for GPU
hosts, LANED_SIM_GPU_LINGER seconds longer than the engine with it; laned/sim/gpu.py),
LANED_SIM_TIMELINE (a file of milestone stamps, for the benches),
LANED_SIM_LEGACY_METRICS (also vllm:gpu_cache_usage_perc), LANED_SIM_OLD_API_LINE (the
pre-0.11 "Starting vLLM API server 0 on" line), LANED_SIM_WEIGHTS_GIB (what a sleep moves
or drops, default 1), LANED_SIM_READ_WEIGHTS (the weight phase reads the model directory's
weight files for real, and lasts as long as that takes) and LANED_SIM_RELOAD_GIBPS
(reload_weights' read rate, default 2;
laned/sim/sleep.py), and vLLM's own VLLM_KEEP_ALIVE_ON_ENGINE_DEATH and
VLLM_SERVER_DEV_MODE. docs/simulator.md maps each behaviour to vLLM's source.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from laned.config.durations import parse_count
from laned.errors import EngineError
from laned.sim import generation, preload, ranks, sglang, startup, timeline, weightwire
from laned.sim.engine import VERSION, Engine
from laned.sim.http import Server, bind_socket
from laned.sim.settings import Settings, split_flags
from laned.sim.startup import log

# vLLM flags that take no value: anything else unknown that is followed by a word takes it.
_SWITCHES = {
    "--enforce-eager",
    "--enable-auto-tool-choice",
    "--trust-remote-code",
    "--disable-log-requests",
    "--headless",
    "--enable-sleep-mode",
}
USAGE = "usage: laned sim serve MODEL [--host H] [--port P] [--served-model-name N] [--api-key K] [vLLM flags]"


def _int(text: str, flag: str) -> int:
    try:
        return parse_count(text)
    except ValueError:
        raise EngineError(f"{flag}: {text!r} is not a whole number", USAGE) from None


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    value = env.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise EngineError(
            f"{name}={value!r} is not a number", f"set {name} to a number such as {default:g}"
        ) from None
    if number < 0 or (number == 0 and name.endswith("_TPS")):
        raise EngineError(
            f"{name}={value!r} must be positive", f"set {name} to a number such as {default:g}"
        )
    return number


def _flag(env: Mapping[str, str], name: str) -> bool:
    """An environment switch: set to anything but "" or "0"."""
    return env.get(name, "") not in ("", "0")


def _json(text: str, flag: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        raise EngineError(f"{flag}: {text!r} is not valid JSON", USAGE) from None
    if not isinstance(value, dict):
        raise EngineError(f"{flag}: expected a JSON object", USAGE)
    return value


def parse_args(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    """Parse vLLM-style arguments and LANED_SIM_* tuning into Settings."""
    args = list(argv)
    if args[:1] == ["preload"]:
        raise EngineError("`preload` is run by main()", USAGE)
    if args[:1] == ["sglang"]:
        return _tune(sglang.parse(args[1:], env, Settings(model="")), env)
    if not args or args[0] != "serve":
        raise EngineError("expected the `serve` (vLLM) or `sglang` subcommand", USAGE)
    args = args[1:]
    if not args or args[0].startswith("-"):
        raise EngineError("expected the model path or name after `serve`", USAGE)
    settings = Settings(model=args[0])
    values = split_flags(args[1:], _SWITCHES, USAGE)
    known: dict[str, Callable[[str], None]] = {
        "--host": lambda v: setattr(settings, "host", v),
        "--port": lambda v: setattr(settings, "port", _int(v, "--port")),
        "--served-model-name": lambda v: setattr(settings, "served_model_name", v),
        "--api-key": lambda v: setattr(settings, "api_key", v),
        "--max-model-len": lambda v: setattr(settings, "max_model_len", _int(v, "--max-model-len")),
        "--max-num-seqs": lambda v: setattr(settings, "max_num_seqs", _int(v, "--max-num-seqs")),
        "--gpu-memory-utilization": lambda v: setattr(settings, "gpu_share", float(v)),
        "--max-num-batched-tokens": lambda v: setattr(
            settings, "max_num_batched_tokens", _int(v, "--max-num-batched-tokens")
        ),
        "--generation-config": lambda v: setattr(settings, "generation_config", v or "auto"),
        "--override-generation-config": lambda v: setattr(
            settings, "override_generation_config", _json(v, "--override-generation-config")
        ),
        "--default-chat-template-kwargs": lambda v: setattr(
            settings, "chat_template_kwargs", _json(v, "--default-chat-template-kwargs")
        ),
        "--reasoning-parser": lambda v: setattr(settings, "reasoning_parser", v or None),
        "--enable-auto-tool-choice": lambda v: setattr(settings, "auto_tool_choice", True),
        "--enforce-eager": lambda v: setattr(settings, "enforce_eager", True),
        "--load-format": lambda v: setattr(settings, "load_format", v),
        "--model-loader-extra-config": lambda v: setattr(
            settings, "loader_config", _json(v, "--model-loader-extra-config")
        ),
        "--shutdown-timeout": lambda v: setattr(
            settings, "shutdown_timeout", float(_int(v, "--shutdown-timeout"))
        ),
        "--no-enable-flashinfer-autotune": lambda v: setattr(
            settings, "flashinfer_autotune", False
        ),
        "--nnodes": lambda v: setattr(settings, "nnodes", _int(v, "--nnodes")),
        "--node-rank": lambda v: setattr(settings, "node_rank", _int(v, "--node-rank")),
        "--master-addr": lambda v: setattr(settings, "master_addr", v),
        "--master-port": lambda v: setattr(settings, "master_port", _int(v, "--master-port")),
        "--headless": lambda v: setattr(settings, "headless", True),
        "--enable-sleep-mode": lambda v: setattr(settings, "enable_sleep_mode", True),
        "--speculative-config": lambda v: setattr(
            settings,
            "num_spec_tokens",
            int(_json(v, "--speculative-config").get("num_speculative_tokens", 0)),
        ),
    }
    for flag, value in values.items():
        if flag in weightwire.KEY_FLAGS:
            settings.weight_flags[flag] = value
        if flag in known:
            known[flag](value)
        else:  # the fingerprint's flags too: they change nothing else in the simulator
            settings.unknown.append(flag)
    if settings.api_key is None and env.get("VLLM_API_KEY"):
        settings.api_key = env["VLLM_API_KEY"]
    if not 0 < settings.port < 65536:
        raise EngineError(f"--port {settings.port} is out of range", USAGE)
    if not 0 <= settings.node_rank < max(settings.nnodes, 1):
        raise EngineError(
            f"--node-rank {settings.node_rank} is not below --nnodes {settings.nnodes}", USAGE
        )
    if settings.max_model_len < 16:
        raise EngineError(
            f"--max-model-len {settings.max_model_len} is too small", "use at least 16"
        )
    # vllm/envs.py: bool(int(os.getenv("VLLM_SERVER_DEV_MODE", "0"))), so "true" fails there too.
    settings.dev_mode = bool(_int(env.get("VLLM_SERVER_DEV_MODE") or "0", "VLLM_SERVER_DEV_MODE"))
    settings.keep_alive_on_engine_death = _flag(env, "VLLM_KEEP_ALIVE_ON_ENGINE_DEATH")
    settings.cache_root = env.get("VLLM_CACHE_ROOT") or None
    return _tune(settings, env)


def _tune(settings: Settings, env: Mapping[str, str]) -> Settings:
    """What both faces take from the environment: LANED_SIM_* tuning."""
    settings.generation = generation.effective(
        settings.model, settings.generation_config, settings.override_generation_config
    )
    settings.startup = _float(env, "LANED_SIM_STARTUP", 3.0)
    settings.decode_tps = _float(env, "LANED_SIM_DECODE_TPS", 50.0)
    settings.prefill_tps = _float(env, "LANED_SIM_PREFILL_TPS", 5000.0)
    settings.jit = _float(env, "LANED_SIM_JIT", 0.0)
    settings.shutdown = _float(env, "LANED_SIM_SHUTDOWN", 0.0)
    settings.hold_gpu_gib = _float(env, "LANED_SIM_HOLD_GPU_GIB", 0.0)
    settings.gpu_linger = _float(env, "LANED_SIM_GPU_LINGER", 0.0)
    settings.sim_gpus = env.get("LANED_SIM_GPUS") or None
    settings.visible = env.get("CUDA_VISIBLE_DEVICES")
    settings.legacy_metrics = _flag(env, "LANED_SIM_LEGACY_METRICS")
    settings.old_api_line = _flag(env, "LANED_SIM_OLD_API_LINE")
    settings.weights_gib = _float(env, "LANED_SIM_WEIGHTS_GIB", 1.0)
    settings.reload_gibps = _float(env, "LANED_SIM_RELOAD_GIBPS", 2.0)
    settings.read_weights = _flag(env, "LANED_SIM_READ_WEIGHTS")
    fail = env.get("LANED_SIM_FAIL_AT_START")
    if fail:
        settings.fail_at_start = _int(fail, "LANED_SIM_FAIL_AT_START")
    return settings


async def serve(settings: Settings) -> int:
    """Run the engine until SIGTERM/SIGINT (exit 0) or a fault ends it."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    def on_signal() -> None:
        timeline.mark("sigterm")
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    pid = os.getpid()
    if settings.face == "sglang":
        return await _serve_sglang(settings, stop, pid)
    if settings.nnodes > 1 and (settings.node_rank > 0 or settings.headless):
        return await ranks.serve_worker(settings, stop)
    log("INFO", "api_server.py:1", f"vLLM API server version {VERSION}")
    shown = {
        "model": settings.model,
        "host": settings.host,
        "port": settings.port,
        "served_model_name": settings.name,
        "max_model_len": settings.max_model_len,
    }
    log("INFO", "utils.py:1", f"non-default args: {shown}")
    for flag in settings.unknown:
        log("INFO", "sim.py:1", f"accepted vLLM flag {flag} (no effect in the simulator)")
    if settings.generation.defaults:
        # vllm/entrypoints/openai/serving_chat.py says where the defaults came from.
        log(
            "INFO",
            "serving_chat.py:1",
            f"Using default chat sampling params from {settings.generation.source}: "
            f"{settings.generation.defaults}",
        )
    # vLLM binds its socket before the engine starts and listens only once it is up
    # (create_server_socket in vllm/entrypoints/openai/api_server.py): a port taken by a
    # listener without SO_REUSEPORT fails at once, not after a 20-minute cold start.
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        log("ERROR", "api_server.py:1", f"[Errno {exc.errno}] error while attempting to bind on address ('{settings.host}', {settings.port}): {exc.strerror}")  # fmt: skip
        return 1
    rendezvous = ranks.Rendezvous(settings) if settings.nnodes > 1 else None
    if rendezvous is not None and not await rendezvous.gather(stop):
        sock.close()
        return 0
    if not await startup.cold_start(settings, stop):
        log("INFO", "launcher.py:1", "Shutting down during startup.")
        sock.close()
        return 0
    startup.api_server_lines(settings)

    closing: list[asyncio.Task[None]] = []

    def exit_now(code: int, linger: float = 0.0) -> None:
        log("INFO", "launcher.py:1", "Shutting down FastAPI HTTP server.")
        if linger > 0:
            # A shutdown that hangs: the port and its connections close, the process stays,
            # deaf to SIGTERM, for `linger` s (an API server whose engine-core teardown hangs).
            closing.append(loop.create_task(server.close()))
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.remove_signal_handler(sig)
                signal.signal(sig, signal.SIG_IGN)
            loop.call_later(linger, exit_now, code)
            return
        sys.stderr.flush()
        timeline.mark("exit")
        os._exit(code)

    engine = Engine(settings, exit_now, rendezvous.command if rendezvous is not None else None)
    if rendezvous is not None:
        rendezvous.watch(lambda why: engine.die(why) if not stop.is_set() else None)
    server = Server(engine.handle)
    # uvicorn (server.py, lifespan/on.py) logs these three lines, then listens.
    print(f"INFO:     Started server process [{pid}]", file=sys.stderr, flush=True)
    print("INFO:     Waiting for application startup.", file=sys.stderr, flush=True)
    print("INFO:     Application startup complete.", file=sys.stderr, flush=True)
    await server.start(sock)
    timeline.mark("listen")
    await stop.wait()
    # vLLM 0.32's order (vllm/entrypoints/launchers/launcher.py, seen on the CPU build): the
    # engine client stops first — with --shutdown-timeout N it drains requests in flight for
    # up to N s while the port still listens and new requests fail (500); the default (0)
    # aborts them — and only then does uvicorn shut down.
    timeout = settings.shutdown_timeout
    log("INFO", "launcher.py:254", "[shutdown] API server: shutdown triggered")
    mode = "drain" if timeout > 0 else "abort"
    log("INFO", "launcher.py:270", f"[shutdown] API server: stopping engine client mode={mode} timeout={timeout:g}s")  # fmt: skip
    if timeout > 0:
        engine.closing = True
        deadline = loop.time() + timeout
        while engine.metrics.running + engine.metrics.waiting > 0 and loop.time() < deadline:
            await asyncio.sleep(0.05)
    log("INFO", "launcher.py:282", "[shutdown] API server: signalling HTTP server shutdown")
    print("INFO:     Shutting down", file=sys.stderr, flush=True)
    await server.close()
    if settings.shutdown > 0:
        # The port is closed; the engine itself takes a while to end (engine-core processes,
        # GPU memory): a unit stopping this engine stays `deactivating` meanwhile.
        log("INFO", "core_client.py:1", "Shutting down engine core")
        await asyncio.sleep(settings.shutdown)
    print("INFO:     Application shutdown complete.", file=sys.stderr, flush=True)
    print(f"INFO:     Finished server process [{pid}]", file=sys.stderr, flush=True)
    return 0


async def _serve_sglang(settings: Settings, stop: asyncio.Event, pid: int) -> int:
    """SGLang's order: load, then listen, then warm up (laned/sim/sglang.py)."""

    pause = startup.pauser(stop)
    sglang.say(f"server_args=ServerArgs(model_path={settings.model!r}, port={settings.port}, ...)")  # fmt: skip
    for flag in settings.unknown:
        sglang.say(f"accepted SGLang flag {flag} (no effect in the simulator)")
    try:
        sock = bind_socket(settings.host, settings.port)
    except OSError as exc:
        print(f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address ('{settings.host}', {settings.port}): {exc.strerror}", file=sys.stderr, flush=True)  # fmt: skip
        return 1
    if not await sglang.cold_start(settings, pause):
        sock.close()
        return 0

    def exit_now(code: int, linger: float = 0.0) -> None:
        sys.stderr.flush()
        os._exit(code)

    engine = Engine(settings, exit_now)
    engine.warmed = False
    server = Server(engine.handle)
    await server.start(sock)
    timeline.mark("listen")
    sglang.listening_lines(settings, pid)
    warm = asyncio.get_running_loop().create_task(sglang.warm_up(engine, settings.startup * 0.1))
    await stop.wait()
    warm.cancel()
    sglang.say("SIGTERM received. signum=None frame=None. Draining requests and shutting down...")
    while engine.metrics.running + engine.metrics.waiting > 0:
        await asyncio.sleep(0.05)
    await server.close()
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: parse, then serve; bad arguments exit 2 with the reason."""
    timeline.mark("main")
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]) or not argv:
        print(USAGE)
        print(__doc__)
        return 0 if argv else 2
    if argv[:1] == ["preload"]:
        return preload.main(argv[1:], os.environ)
    try:
        settings = parse_args(argv, os.environ)
    except EngineError as exc:
        print(f"laned sim: {exc}", file=sys.stderr)
        return 2
    code = asyncio.run(serve(settings))
    timeline.mark("exit")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
