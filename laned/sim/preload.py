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

Over several nodes (weight_cache/daemon.py's module docstring; preload.py
PreloadSubcommand.cmd; daemon.py plan_local_ranks, WeightCacheDaemon.load_model and
serve_forever), played here as vLLM 0.32 has it:
- `--nnodes N` without `--weight-cache-master-port` is refused ("--weight-cache-master-port is
  required when the daemons span nodes", preload.py cmd), and so is a world (the
  tensor-parallel size) that N does not divide (daemon.py _reject_unsupported_parallelism);
- node r serves the local GPUs i of the world's contiguous block: global rank
  `r * (tp // N) + i` (plan_local_ranks), the fingerprint's tp_rank; its sockets are its own
  GPUs' (CUDA IPC handles are node-local);
- every node's ranks form one group at `--master-addr`:`--weight-cache-master-port` before
  any load (load_model: init_distributed_environment with tcp://ADDR:PORT, outside the
  engine's config, so never the engine's --master-port): node 0 hosts it, the others connect
  to it, retrying. A node waits there for the others; after torch's default process-group
  timeout (10 min for NCCL; LANED_SIM_RENDEZVOUS_TIMEOUT here) the rank fails and the
  launcher ends as for any rank that dies loading ("exited during startup", its exit code);
- the group forms once. Once loaded, a rank runs no collective (serve_forever answers its
  socket only): nothing in the daemon watches the other nodes, so a node's daemon keeps
  serving when another node's dies; and a daemon started anew joins no group that formed
  already (it waits at the rendezvous, then fails): every node's daemon must start again
  together. The simulator's rendezvous protocol is its own (a line `rank R`, then `go`), as
  laned/sim/ranks.py's for the engine.

The simulator plays GPUs by name: local GPU i is `GPU-laned-sim-i`. Its messages carry only
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
    "[--nnodes N --node-rank R --master-addr A --weight-cache-master-port P] "
    "[--weight-cache-socket-dir D] [--weight-cache-health-port P] [vLLM engine flags]"
)
VALUE_ERRORS = ("must load from disk", "required when the daemons span", "must evenly divide")
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
    nnodes: int = 1  # --nnodes, --node-rank, --master-addr: the engine's own, reused
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int | None = None  # --weight-cache-master-port: the group's rendezvous
    rendezvous_timeout: float = 600.0  # torch's default process-group timeout for NCCL

    @property
    def world(self) -> int:
        """Every node's ranks together: the tensor-parallel size."""
        tp = self.flags.get("--tensor-parallel-size") or self.flags.get("-tp") or "1"
        return int(tp) if tp.isdigit() else 1

    @property
    def ranks(self) -> int:
        """This node's ranks, one per local GPU (daemon.py plan_local_ranks)."""
        return self.world // max(self.nnodes, 1)

    @property
    def base(self) -> int:
        """The global rank of this node's first GPU: node_rank * (tp // nnodes)."""
        return self.node_rank * self.ranks


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
    master = values.pop("--weight-cache-master-port", "")
    daemon.master_port = int(master) if master else None
    values.pop("--weight-cache-draft-master-port", "")
    daemon.nnodes = int(values.get("--nnodes") or 1)
    daemon.node_rank = int(values.get("--node-rank") or 0)
    daemon.master_addr = values.get("--master-addr") or "127.0.0.1"
    daemon.flags = values
    if daemon.nnodes > 1 and daemon.master_port is None:
        # preload.py PreloadSubcommand.cmd: a ValueError before anything starts.
        raise EngineError("--weight-cache-master-port is required when the daemons span nodes", USAGE)  # fmt: skip
    if daemon.world % max(daemon.nnodes, 1):
        # daemon.py _reject_unsupported_parallelism
        raise EngineError(f"--nnodes ({daemon.nnodes}) must evenly divide the daemon world size ({daemon.world})", USAGE)  # fmt: skip
    daemon.rendezvous_timeout = float(env.get("LANED_SIM_RENDEZVOUS_TIMEOUT") or 600.0)
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
    group = Group(daemon) if daemon.nnodes > 1 else None
    if group is not None:
        formed = await group.form(stop)
        if formed is None:
            return await _terminated(health)
        if not formed:
            log("ERROR", "preload.py:300", "Weight cache daemon rank(s) exited during startup (exitcodes=[1]); shutting down.")  # fmt: skip
            if health is not None:
                await health.close()
            return 1
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
    each = daemon.weights_gib / daemon.world
    servers = []
    for local in range(daemon.ranks):
        rank = daemon.base + local  # the global rank: the fingerprint's tp_rank
        log("INFO", "daemon.py:277", f"Weight cache target daemon rank {rank} loaded model ({each:.2f} GiB allocated, {each:.2f} GiB reserved)")  # fmt: skip
        _private_dir(directory, strict=daemon.socket_dir is None)
        path = socket_path(directory, local)  # this node's GPU i (CUDA IPC is node-local)
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
    log("INFO", "preload.py:321", f"===== Weight cache daemon READY: node {daemon.node_rank}/{daemon.nnodes} serving {daemon.ranks} local rank(s) x 1 role(s) in {daemon.socket_dir or 'the default socket dir'} =====")  # fmt: skip
    await stop.wait()  # no collective from here on: the other nodes' daemons are not watched
    if group is not None:
        group.close()
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
            held = daemon.weights_gib / daemon.world if daemon.held else 0.0
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


class Group:
    """The daemons' own group over several nodes (daemon.py load_model: one world of every
    node's ranks at tcp://master_addr:weight_cache_master_port), formed once."""

    def __init__(self, daemon: Daemon) -> None:
        self.daemon = daemon
        self.joined: set[int] = set()
        self.formed = asyncio.Event()
        self.server: asyncio.base_events.Server | None = None
        self.writers: list[asyncio.StreamWriter] = []

    async def form(self, stop: asyncio.Event) -> bool | None:
        """Wait until every node has joined: True; False after the timeout (the rank fails);
        None when stopped first."""
        d = self.daemon
        where = f"{d.master_addr}:{d.master_port}"
        log("INFO", "parallel_state.py:1", f"world_size={d.world} rank={d.base} distributed_init_method=tcp://{where}", WORKER)  # fmt: skip
        waiting = self._host() if d.node_rank == 0 else self._join(stop)  # node 0 hosts the store
        task = asyncio.ensure_future(waiting)
        stopper = asyncio.ensure_future(stop.wait())
        done, _ = await asyncio.wait(
            {task, stopper}, timeout=d.rendezvous_timeout, return_when=asyncio.FIRST_COMPLETED
        )
        stopper.cancel()
        if task in done and task.result():
            log("INFO", "parallel_state.py:1", f"weight cache group of {d.nnodes} nodes formed at {where}", WORKER)  # fmt: skip
            return True
        task.cancel()
        if stop.is_set():
            self.close()
            return None
        log("ERROR", "daemon.py:277", f"torch.distributed.DistStoreError: Timed out after {d.rendezvous_timeout:g} seconds waiting for the weight cache group at {where}", WORKER)  # fmt: skip
        self.close()
        return False

    async def _host(self) -> bool:
        d = self.daemon
        # The store stays up with rank 0 (held by its group): a node that connects after
        # the group formed gets no answer, and waits.
        self.server = await asyncio.start_server(self._joined, host=None, port=d.master_port)
        await self.formed.wait()
        return True

    async def _joined(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode(errors="replace").split()
        self.writers.append(writer)
        if self.formed.is_set() or len(line) != 2 or line[0] != "rank":
            return  # formed once: a late node is never let in
        self.joined.add(int(line[1]) if line[1].isdigit() else -1)
        if len(self.joined) >= self.daemon.nnodes - 1:
            for joined in self.writers:
                joined.write(b"go\n")
            self.formed.set()

    async def _join(self, stop: asyncio.Event) -> bool:
        d = self.daemon
        while not stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(d.master_addr, d.master_port)
            except OSError:
                await asyncio.sleep(0.2)  # torch's TCPStore client retries until its timeout
                continue
            self.writers.append(writer)
            writer.write(f"rank {d.node_rank}\n".encode())
            if await reader.readline() == b"go\n":
                return True
            writer.close()  # the host went away before the group formed: try again
            await asyncio.sleep(0.2)
        return False

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for writer in self.writers:
            writer.close()


def main(args: Sequence[str], env: Mapping[str, str]) -> int:
    """`laned sim preload ...`: bad arguments exit 2 (as argparse does), the rest as vLLM."""
    try:
        daemon = parse(args, env)
    except EngineError as exc:
        print(f"laned sim preload: {exc}", file=sys.stderr)
        # vLLM's own refusals are ValueErrors (status 1); argparse's, status 2.
        return 1 if any(said in exc.message for said in VALUE_ERRORS) else 2
    log("INFO", "utils.py:1", f"non-default args: {{'model': {daemon.model!r}}}")
    return asyncio.run(run_daemon(daemon))
