"""vLLM's weight cache, simulated: the daemon (`laned sim preload --model MODEL ...`, as
`vllm preload`) and the engine's side of it (`serve ... --load-format ipc_cache`).

Read in vLLM 0.32 (docs/simulator.md cites each behaviour):
- vllm/entrypoints/cli/preload.py: one daemon rank per GPU, started after the optional
  /health server (503 until every rank is ready, 200 after); `--load-format ipc_cache` for
  the daemon itself refused; a rank that dies while loading ends the launcher with its
  code ("Weight cache daemon rank(s) exited during startup (exitcodes=[...]); shutting
  down."); the READY line; SIGTERM terminates the ranks, and the launcher exits with their
  exit code, -15 (so status 241);
- weight_cache/daemon.py: each rank loads through the default loader (the shard bar),
  logs "Weight cache target daemon rank N loaded model (X GiB allocated, Y GiB reserved)",
  binds its socket only once loaded (0600, in a 0700 directory, under a per-GPU flock),
  "serving on PATH", and answers get_state (its fingerprint compared field by field:
  "mismatch" with the fields), get_memory and release;
- weight_cache/protocol.py: the socket's name (vllm_weight_cache_<md5 of the GPU's uuid>.sock),
  its messages (an 8-byte big-endian length, then a pickle), the fingerprint's fields, its
  checkpoint the hash of the shards' safetensors headers (made once, before the load);
- weight_cache/ipc_loader.py: the engine connects; no socket, a refused connection or a
  fingerprint that differs is a WARNING "Weight cache unusable (...); falling back to disk
  loading" and a load from disk; else "Mapped N tensors from the weight cache daemon
  (zero_copy mode)" (copy mode asks the daemon to release its weights afterwards).

The simulator plays GPUs by name: rank i's GPU is `GPU-laned-sim-i`. Its messages carry only
plain dicts, lists, strings and numbers (pickled, as vLLM's are; read back refusing anything
else). It does not play the daemon's death under a mapping engine: vLLM leaves that undefined
(torch's CUDA IPC needs the producer alive while consumers use its memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import os
import pickle
import signal
import stat
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laned.errors import EngineError
from laned.sim.http import Request, Response, Server, bind_socket
from laned.sim.settings import split_flags
from laned.sim.startup import WORKER, log, pauser, shard_bar
from laned.sim.weightwire import (
    default_socket_dir,
    encode,
    fingerprint,
    gpu_uuid,
    hash_checkpoint,
    read_message,
    socket_path,
)

USAGE = (
    "usage: laned sim preload --model MODEL [--tensor-parallel-size N] "
    "[--weight-cache-socket-dir D] [--weight-cache-health-port P] [vLLM engine flags]"
)
SWITCHES = {"--enforce-eager", "--trust-remote-code", "--enable-expert-parallel"}


# --- the daemon ---------------------------------------------------------------------------


@dataclass
class Daemon:
    """What `vllm preload` was started with."""

    model: str
    flags: dict[str, str] = field(default_factory=dict)
    socket_dir: str | None = None
    health_port: int | None = None
    health_host: str = "0.0.0.0"
    startup: float = 3.0
    weights_gib: float = 1.0
    fail_at_start: int | None = None
    ready: bool = False
    held: bool = True  # released: a get_state answers "Weights were released"
    checkpoint: str | None = None  # hash_checkpoint's, taken before the load

    @property
    def ranks(self) -> int:
        tp = self.flags.get("--tensor-parallel-size") or self.flags.get("-tp") or "1"
        return int(tp) if tp.isdigit() else 1


def parse(args: Sequence[str], env: Mapping[str, str]) -> Daemon:
    """`preload`'s flags (EngineArgs' and its own), and LANED_SIM_* tuning."""
    values = split_flags(args, SWITCHES, USAGE)
    model = values.pop("--model", "")
    if not model:
        raise EngineError("--model is required (preload takes no positional model)", USAGE)
    if values.get("--load-format") == "ipc_cache":
        # preload.py: the daemon itself loads from disk.
        raise EngineError(
            "The weight cache daemon itself must load from disk; use the default --load-format",
            USAGE,
        )
    daemon = Daemon(model=model)
    daemon.socket_dir = values.pop("--weight-cache-socket-dir", "") or None
    port = values.pop("--weight-cache-health-port", "")
    daemon.health_port = int(port) if port else None
    daemon.health_host = values.pop("--weight-cache-health-host", "") or "0.0.0.0"
    for own in ("--weight-cache-master-port", "--weight-cache-draft-master-port"):
        values.pop(own, "")
    daemon.flags = values
    daemon.startup = float(env.get("LANED_SIM_STARTUP") or 3.0)
    daemon.weights_gib = float(env.get("LANED_SIM_WEIGHTS_GIB") or 1.0)
    fail = env.get("LANED_SIM_FAIL_AT_START")
    daemon.fail_at_start = int(fail) if fail else None
    return daemon


def _private_dir(directory: str, strict: bool) -> None:
    """protocol.py ensure_private_socket_dir: made 0700, owned by this user (an explicit
    directory keeps its mode: the operator owns that choice)."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if strict:
        os.chmod(directory, 0o700)
    info = os.lstat(directory)
    if stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid():
        raise EngineError(f"Refusing to use socket directory {directory}", "")


async def run_daemon(daemon: Daemon) -> int:
    """The launcher and its ranks, until SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    pause = pauser(stop)
    health: Server | None = None
    if daemon.health_port is not None:

        async def answer(request: Request) -> Response:
            if request.path == "/health":
                return Response(200 if daemon.ready else 503)
            return Response.json({"detail": "Not Found"}, 404)

        health = Server(answer)
        await health.start(_listening(bind_socket(daemon.health_host, daemon.health_port)))
    directory = daemon.socket_dir or default_socket_dir()
    # daemon.py WeightCacheDaemon.__init__: the fingerprint is made before the load and kept
    # (the headers of the shards as they were then, whatever replaces them later).
    daemon.checkpoint = hash_checkpoint(daemon.model)
    # Each rank: the default loader's shard bar, then the model held.
    started = time.monotonic()
    log("INFO", "model_runner.py:1", f"Starting to load model {daemon.model}...", WORKER)
    seconds, shards = daemon.startup * 0.5, 8
    for i in range(shards + 1):
        elapsed = time.monotonic() - started
        shard_bar(i, shards, elapsed, seconds - elapsed, seconds / shards)
        if i < shards and not await pause(seconds / shards):
            return await _terminated(health)
        if daemon.fail_at_start is not None and i == shards // 2:
            log("ERROR", "preload.py:300", f"Weight cache daemon rank(s) exited during startup (exitcodes=[{daemon.fail_at_start}]); shutting down.")  # fmt: skip
            return daemon.fail_at_start
    each = daemon.weights_gib / daemon.ranks
    servers = []
    for rank in range(daemon.ranks):
        log("INFO", "daemon.py:277", f"Weight cache target daemon rank {rank} loaded model ({each:.2f} GiB allocated, {each:.2f} GiB reserved)")  # fmt: skip
        _private_dir(directory, strict=daemon.socket_dir is None)
        path = socket_path(directory, rank)
        lock = os.open(f"{path}.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            log("ERROR", "daemon.py:340", f"Another weight cache daemon already owns {path}")
            return 1
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = await asyncio.start_unix_server(functools.partial(_serve, daemon, rank), path=path)
        os.chmod(path, 0o600)
        servers.append((server, path))
        log("INFO", "daemon.py:300", f"Weight cache target daemon rank {rank} serving on {path}")  # fmt: skip
    daemon.ready = True
    log("INFO", "preload.py:321", f"===== Weight cache daemon READY: node 0/1 serving {daemon.ranks} local rank(s) x 1 role(s) in {daemon.socket_dir or 'the default socket dir'} =====")  # fmt: skip
    await stop.wait()
    for server, path in servers:
        server.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
    return await _terminated(health)


async def _terminated(health: Server | None) -> int:
    """SIGTERM: the ranks are terminated; the launcher exits with their -15 (status 241)."""
    if health is not None:
        await health.close()
    return 241


def _listening(sock: Any) -> Any:
    sock.listen(128)
    return sock


async def _serve(
    daemon: Daemon, rank: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """One client's request (daemon.py _handle_connection)."""
    try:
        request = await read_message(reader)
        cmd = request.get("cmd") if isinstance(request, dict) else None
        if cmd == "get_state":
            answer = _state(daemon, rank, request.get("cache_config"))
        elif cmd == "get_memory":
            held = daemon.weights_gib / daemon.ranks if daemon.held else 0.0
            answer = {"status": "ok", "memory_bytes": int(held * 2**30)}
        elif cmd == "release":
            daemon.held = False
            log("INFO", "daemon.py:520", f"Weight cache target daemon rank {rank} released cached weights")  # fmt: skip
            answer = {"status": "ok"}
        else:
            answer = {"status": "error", "message": f"Unknown command {cmd!r}"}
        writer.write(encode(answer))
        await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, pickle.UnpicklingError, ValueError):
        log("WARNING", "daemon.py:318", "Client disconnected mid-request")
    finally:
        writer.close()


def _state(daemon: Daemon, rank: int, key: Any) -> dict[str, Any]:
    if not isinstance(key, dict):
        return {"status": "error", "message": "Missing cache_config"}
    mine = {**fingerprint(daemon.model, daemon.flags, daemon.checkpoint), "tp_rank": rank}
    mismatched = [name for name, value in mine.items() if key.get(name) != value]
    if mismatched:
        log("WARNING", "daemon.py:486", f"WeightCacheKey mismatch on fields: {mismatched}")
        return {"status": "mismatch", "fields": mismatched}
    if not daemon.held:
        return {"status": "error", "message": "Weights were released"}
    log("INFO", "daemon.py:505", f"Weight cache target daemon rank {rank} sent 291 tensors (+1 aliases) to engine")  # fmt: skip
    return {"status": "ok", "entries": 291, "gpu_uuid": gpu_uuid(rank)}


def main(args: Sequence[str], env: Mapping[str, str]) -> int:
    """`laned sim preload ...`: bad arguments exit 2 (as argparse does), the rest as vLLM."""
    try:
        daemon = parse(args, env)
    except EngineError as exc:
        print(f"laned sim preload: {exc}", file=sys.stderr)
        return 2 if "must load from disk" not in exc.message else 1
    log("INFO", "utils.py:1", f"non-default args: {{'model': {daemon.model!r}}}")
    return asyncio.run(run_daemon(daemon))
