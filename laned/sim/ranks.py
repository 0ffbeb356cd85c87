"""vLLM's ranks over several nodes, simulated: `--nnodes N --node-rank R --master-addr A
--master-port P [--headless]`.

What vLLM does (the mp executor over several nodes, seed 002's launch): every node runs
the same command; rank 0 hosts the rendezvous at master_addr:master_port (torch.distributed's
TCP store, `tcp://A:P`) and the other ranks connect to it, retrying, before any weights
load; rank 0 serves the API, `--headless` ranks serve none. Once they run, every step is a
collective across the nodes: when one rank goes away the others' collectives fail. The
head's engine then dies (EngineDeadError; its API server fails /health and exits with
status 0, as the one-node engine death does), and a worker exits non-zero.

Not confirmed line by line in vLLM's source: the log lines below are the simulator's own
words (vLLM's rendezvous is quiet while it waits), and how long a rank takes to notice a
peer that went away (NCCL's timeouts, minutes by default) is not simulated: here it is at
once, when the peer's connection closes.

The rendezvous protocol is the simulator's own: a worker connects, says `rank R`, and waits
for `go` (sent once every rank has joined); then each side holds its connection open, and
its end is the peer's death.
"""

from __future__ import annotations

import asyncio
import signal
import sys
from collections.abc import Callable

from laned.sim import gpu, startup
from laned.sim.settings import Settings
from laned.sim.startup import log

WAIT_LOG_EVERY = 10.0  # seconds between "still waiting" lines


class Rendezvous:
    """The head's side: the workers' connections, once every rank has joined."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.peers: dict[int, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self.joined = asyncio.Event()
        self.server: asyncio.base_events.Server | None = None
        self.watchers: list[asyncio.Task[None]] = []
        self.replies: dict[int, asyncio.Queue[str]] = {}  # rank -> its answers to `command`

    async def gather(self, stop: asyncio.Event) -> bool:
        """Wait until every worker rank has connected (False: stopped first)."""
        s = self.settings
        self.server = await asyncio.start_server(self._join, host=None, port=s.master_port)
        log("INFO", "parallel_state.py:1", f"rank 0 of {s.nnodes} nodes: waiting for {s.nnodes - 1} worker node(s) at {s.master_addr}:{s.master_port}")  # fmt: skip
        while not self.joined.is_set():
            waiter = asyncio.ensure_future(self.joined.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait(
                {waiter, stopper}, timeout=WAIT_LOG_EVERY, return_when=asyncio.FIRST_COMPLETED
            )
            waiter.cancel()
            stopper.cancel()
            if stop.is_set():
                self.close()
                return False
            if not self.joined.is_set():
                missing = sorted(set(range(1, s.nnodes)) - set(self.peers))
                log("INFO", "parallel_state.py:1", f"still waiting for node rank(s) {missing} at {s.master_addr}:{s.master_port}")  # fmt: skip
        self.server.close()
        for _, writer in self.peers.values():
            writer.write(b"go\n")
        log("INFO", "parallel_state.py:1", f"all {s.nnodes} nodes joined")
        return True

    async def _join(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        line = (await reader.readline()).decode(errors="replace").split()
        if len(line) != 2 or line[0] != "rank" or not line[1].isdigit():
            writer.close()
            return
        rank = int(line[1])
        peer = writer.get_extra_info("peername")
        self.peers[rank] = (reader, writer)
        log("INFO", "parallel_state.py:1", f"node rank {rank} joined from {peer[0] if peer else '?'}")  # fmt: skip
        if len(self.peers) >= self.settings.nnodes - 1:
            self.joined.set()

    def watch(self, on_death: Callable[[str], None]) -> list[asyncio.Task[None]]:
        """Call `on_death` with the reason when a worker's connection ends; a worker's
        replies to `command` are read here."""

        async def follow(rank: int, reader: asyncio.StreamReader) -> None:
            while line := await reader.readline():
                self.replies.setdefault(rank, asyncio.Queue()).put_nowait(line.decode().strip())
            on_death(f"node rank {rank} went away")

        # Held here: a task nobody references may be collected before it ends.
        self.watchers = [asyncio.ensure_future(follow(r, rd)) for r, (rd, _) in self.peers.items()]
        return self.watchers

    async def command(self, word: str) -> None:
        """A sleep or a wake on every worker rank ("sleep LEVEL", "wake"), back once each has
        answered: vLLM's executor sends it to every rank over its message queue, the remote
        nodes' workers included, and waits for each reply (vllm/v1/executor/abstract.py
        `sleep` and `wake_up` → multiproc_executor.py `collective_rpc`). A rank that went
        away answers nothing: its death ends the engine meanwhile (`watch`)."""
        for _, writer in self.peers.values():
            writer.write(f"{word}\n".encode())
        for rank in self.peers:
            reply = await self.replies.setdefault(rank, asyncio.Queue()).get()
            log("INFO", "multiproc_executor.py:1", f"node rank {rank}: {reply}")

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
        for _, writer in self.peers.values():
            writer.close()


async def serve_worker(settings: Settings, stop: asyncio.Event) -> int:
    """A `--headless` rank: join the head, "load", then hold until the head goes away (exit 1)
    or a stop (exit 0). It serves no API and binds no port of its own."""
    s = settings
    # A headless rank has no /sim/fault endpoint: SIGUSR1 makes it die as vLLM's processes do
    # when their engine dies, with status 0.
    died = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, died.set)
    log("INFO", "serve.py:1", f"headless node rank {s.node_rank} of {s.nnodes}: no API server; the head is {s.master_addr}:{s.master_port}")  # fmt: skip
    if not s.headless:
        log(
            "WARNING",
            "serve.py:1",
            "a node rank above 0 without --headless: running it as a worker",
        )
    last_said = -WAIT_LOG_EVERY
    loop = asyncio.get_running_loop()
    while True:
        try:
            reader, writer = await asyncio.open_connection(s.master_addr, s.master_port)
            break
        except OSError as exc:
            if loop.time() - last_said >= WAIT_LOG_EVERY:
                log("INFO", "parallel_state.py:1", f"waiting for the head at {s.master_addr}:{s.master_port} ({exc.strerror or exc})")  # fmt: skip
                last_said = loop.time()
        try:
            await asyncio.wait_for(stop.wait(), 0.5)
            return 0
        except asyncio.TimeoutError:
            pass
    writer.write(f"rank {s.node_rank}\n".encode())
    go = asyncio.ensure_future(reader.readline())
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({go, stopper}, return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        go.cancel()
        writer.close()
        return 0
    if go.result() != b"go\n":
        log("ERROR", "parallel_state.py:1", "the head went away before every node joined")
        return 1
    log("INFO", "parallel_state.py:1", f"joined the head at {s.master_addr}:{s.master_port}; loading this node's shards")  # fmt: skip
    if s.sim_gpus:  # this node's workers take their memory as the head's do
        startup.take_sim_gpus(s)
    ended = asyncio.ensure_future(_follow_head(s, reader, writer))
    loading = asyncio.ensure_future(_load(s, stop))
    dying = asyncio.ensure_future(died.wait())
    await asyncio.wait({ended, loading, stopper, dying}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and loading.result() and not ended.done() and not died.is_set():
        log("INFO", "gpu_worker.py:1", f"node rank {s.node_rank} ready: serving the head's steps")
        await asyncio.wait({ended, stopper, dying}, return_when=asyncio.FIRST_COMPLETED)
    loading.cancel()
    if died.is_set():
        log("ERROR", "core.py:1", "EngineCore encountered a fatal error (fault injected: SIGUSR1); exiting with status 0")  # fmt: skip
        writer.close()
        sys.stderr.flush()
        return 0
    if stop.is_set():
        writer.close()
        log("INFO", "serve.py:1", "headless worker stopped")
        return 0
    log("ERROR", "multiproc_executor.py:1", f"lost the head at {s.master_addr}:{s.master_port}: its connection closed; exiting")  # fmt: skip
    sys.stderr.flush()
    return 1


async def _load(s: Settings, stop: asyncio.Event) -> bool:
    """This node's shards, as the head loads its own: from disk, or mapped from this host's
    weight-cache daemon with --load-format ipc_cache (laned/sim/startup.py load_weights),
    then the rest of the start; False when stopped first."""
    pause = startup.pauser(stop)
    return await startup.load_weights(s, pause) and await pause(s.startup * 0.5)


async def _follow_head(
    s: Settings, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    """Until the head's connection closes: do each sleep and wake the head sends, as a
    worker does its share of vLLM's collective_rpc (vllm/v1/worker/gpu_worker.py `sleep`:
    level 1 copies this rank's weights to its own host's pinned memory, level 2 drops them;
    both drop the KV cache; `wake_up` takes the memory back), and answer it."""
    while line := await reader.readline():
        word = line.decode(errors="replace").split()
        if not word or word[0] not in ("sleep", "wake"):
            continue
        asleep = word[0] == "sleep"
        if s.sim_gpus and s.sim_held:
            gpu.sim_asleep(s.sim_gpus, s.sim_held, asleep)
        if asleep:
            freed = sum(s.sim_held.values()) / 2**30 if s.sim_held else s.weights_gib
            log("INFO", "gpu_worker.py:326", f"Sleep mode freed {freed:.2f} GiB memory, 0.50 GiB memory is still in use.")  # fmt: skip
        writer.write(b"slept\n" if asleep else b"woke\n")
        await writer.drain()
