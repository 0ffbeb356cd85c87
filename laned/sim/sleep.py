"""vLLM's sleep mode, as the simulated engine does it. From vLLM 0.32's source:

- The routes exist only with VLLM_SERVER_DEV_MODE=1 (vllm/entrypoints/launchers/api_server/
  routers.py registers the dev routers under `envs.VLLM_SERVER_DEV_MODE`); otherwise 404.
- `POST /sleep?level=0|1|2&mode=abort|wait|keep` (vllm/entrypoints/serve/dev/sleep/
  api_router.py: `level` Query(ge=0, le=2) default 1, `mode` PauseMode default "abort"):
  {"status": "sleeping", "level": level}. The engine pauses its scheduler first
  (vllm/v1/engine/core.py `EngineCore.sleep`): "abort" ends the requests in flight, "wait"
  lets them finish, "keep" freezes them until the wake. Level 0 stops there; level 1 copies
  the weights to pinned host memory (asked for at each sleep: vllm/device_allocator/
  cumem.py `sleep`, `pin_memory=PIN_MEMORY`, through torch's caching host allocator, which
  keeps what the wake drops) and drops the KV cache; level 2 drops both
  (vllm/v1/worker/gpu_worker.py `sleep`, which logs what it freed).
- Requests that arrive meanwhile are accepted and wait: the scheduler is paused.
- `POST /wake_up[?tags=weights&tags=kv_cache]` ({"status": "awake"|"sleeping", "tags"}):
  scheduling resumes only once every tag is awake again (core.py `wake_up`).
- `GET /is_sleeping`: {"is_sleeping": paused or the executor sleeps} (core.py `is_sleeping`).
- After a level-2 wake the weights' memory is back but holds nothing: the engine answers,
  wrongly, until `POST /collective_rpc {"method": "reload_weights"}` (vLLM #29341).
  `POST /reset_prefix_cache` answers {"success": true} (dev/cache/api_router.py).
- `vllm:engine_sleep_state{sleep_state=awake|weights_offloaded|discard_all}` (vllm/v1/
  metrics/loggers.py, set by `record_sleep_state`) and `vllm:sleep_mode_operation_duration_
  seconds{operation}` (dev/sleep/metrics.py).

Timings: pinning host memory 0.49 s/GiB at the engine's first level-1 sleep only (later ones
reuse the buffers torch's caching host allocator kept), host <-> GPU copies at 51.4 GiB/s,
both measured on the H200 with torch (issue 29); a level-2 reload reads the weights at
LANED_SIM_RELOAD_GIBPS.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from laned.sim.http import Request, Response
from laned.sim.metrics import Histogram
from laned.sim.startup import log

PIN_SECONDS_PER_GIB = 7.8 / 16  # torch pin_memory of 16 GiB took 7.8 s on the H200 host
LINK_GIBPS = 51.4  # pinned host <-> GPU, both ways, PCIe 5.0 x16 (H200, torch)
SLEEP_TAGS = ("weights", "kv_cache")  # vllm/v1/executor/abstract.py SLEEP_TAGS
MODES = ("abort", "wait", "keep")  # vllm/v1/engine/__init__.py PauseMode
OPERATION_BUCKETS = (0.01, 0.1, 1, 10, 30, 60, 120, 300, 600)  # dev/sleep/metrics.py
ROUTES = {
    ("POST", "/sleep"),
    ("POST", "/wake_up"),
    ("GET", "/is_sleeping"),
    ("POST", "/collective_rpc"),
    ("POST", "/reset_prefix_cache"),
}


class Sleep:
    """The engine's sleep state and its dev-mode routes."""

    def __init__(
        self,
        weights_gib: float,
        reload_gibps: float,
        in_flight: Callable[[], int],
        abort: Callable[[], None],
        slept: Callable[[bool], None],
        moves: Callable[[str], None] | None = None,
        held: Callable[[bool], None] | None = None,
        ranks: Callable[[str], Awaitable[None]] | None = None,
    ) -> None:
        # weights_gib 0: started without --enable-sleep-mode. vLLM then sleeps without its
        # cumem allocator's pools: the calls answer as usual and free nothing.
        self.weights_gib, self.reload_gibps = weights_gib, reload_gibps
        self.in_flight, self.abort, self.slept = in_flight, abort, slept
        # Real GPU memory held (LANED_SIM_HOLD_GPU_GIB): `moves("offload"|"restore"|
        # "discard"|"retake")` does to it what the sleep does (blocking, run off the loop), in
        # place of the timings above.
        self.moves = moves
        # A simulated host's GPUs (LANED_SIM_GPUS): `held(asleep)` says what the process holds
        # there now, its context only while it sleeps.
        self.held = held
        # A head over several nodes: `ranks("sleep 1"|"sleep 2"|"wake")` does the same on
        # every worker rank and returns once each has (vLLM's executor sleeps and wakes every
        # rank, the headless nodes' workers too, through collective_rpc and waits for each
        # reply: vllm/v1/executor/abstract.py `sleep`, `wake_up`).
        self.ranks = ranks
        # torch's caching host allocator keeps the pinned buffers a wake drops (vLLM empties
        # it only at shutdown: vllm/distributed/parallel_state.py): only the first level-1
        # sleep pins host memory; later ones get the same buffers back (H200: 34.9 s, then
        # 50 µs, for 40 GiB).
        self.pinned = False
        self.level: int | None = None  # None: awake
        self.asleep: set[str] = set()  # the executor's sleeping tags
        self.stale = False  # woken from level 2, the weights not reloaded: wrong answers
        self.reload_fixes = True  # the "bad-reload" fault: reload_weights leaves them wrong
        self.awake = asyncio.Event()
        self.awake.set()
        self.durations = {op: Histogram(OPERATION_BUCKETS) for op in ("sleep", "wake")}

    @property
    def paused(self) -> bool:
        return not self.awake.is_set()

    async def handle(self, request: Request) -> Response:
        """One of ROUTES."""
        route = (request.method, request.path)
        if route == ("GET", "/is_sleeping"):
            return Response.json({"is_sleeping": self.paused or bool(self.asleep)})
        if route == ("POST", "/reset_prefix_cache"):
            return Response.json({"success": True})
        if route == ("POST", "/collective_rpc"):
            return await self._rpc(request)
        if route == ("POST", "/wake_up"):
            return await self._timed("wake", self._wake(request.query.get("tags") or None))
        level = request.query.get("level", ["1"])[-1]
        mode = request.query.get("mode", ["abort"])[-1]
        if level not in ("0", "1", "2") or mode not in MODES:
            return _invalid(level, mode)
        return await self._timed("sleep", self._sleep(int(level), mode))

    async def _timed(self, operation: str, work: Any) -> Response:
        started = time.perf_counter()
        try:
            body = await work
        finally:
            self.durations[operation].observe(time.perf_counter() - started)
        return Response.json(body)

    async def _sleep(self, level: int, mode: str) -> dict[str, Any]:
        if mode == "abort":
            self.abort()  # each running request ends at its next step, as "abort"
        if mode != "keep":
            while self.in_flight():
                await asyncio.sleep(0.01)
        self.awake.clear()  # the scheduler pauses: later requests wait
        if level >= 1 and not self.asleep:
            began = time.perf_counter()
            if self.moves is not None:
                await asyncio.to_thread(self.moves, "offload" if level == 1 else "discard")
            elif level == 1:
                pin = 0.0 if self.pinned else self.weights_gib * PIN_SECONDS_PER_GIB
                await asyncio.sleep(pin + self.weights_gib / LINK_GIBPS)
            if self.held is not None:
                self.held(True)
            if self.ranks is not None:
                await self.ranks(f"sleep {level}")
            self.pinned = self.pinned or level == 1
            self.asleep = set(SLEEP_TAGS)
            self.level = level
            self.slept(True)
            log("INFO", "abstract.py:390", f"It took {time.perf_counter() - began:.6f} seconds to fall asleep.")  # fmt: skip
            log("INFO", "gpu_worker.py:326", f"Sleep mode freed {self.weights_gib:.2f} GiB memory, 0.50 GiB memory is still in use.")  # fmt: skip
        elif level == 0:
            self.level = self.level or 0
        return {"status": "sleeping", "level": level}

    async def _wake(self, tags: list[str] | None) -> dict[str, Any]:
        log("INFO", "api_router.py:51", f"wake up the engine with tags: {tags}")
        waking = set(self.asleep if tags is None else tags) & self.asleep
        if "weights" in waking:
            began = time.perf_counter()
            if self.moves is not None:
                await asyncio.to_thread(self.moves, "restore" if self.level == 1 else "retake")
            elif self.level == 1:
                await asyncio.sleep(self.weights_gib / LINK_GIBPS)
            if self.held is not None:
                self.held(False)
            if self.ranks is not None:
                await self.ranks("wake")
            if self.level == 2 and self.weights_gib:
                self.stale = True  # level 2: the memory is back, its contents are not
            shown = tags if tags is not None else sorted(self.asleep)
            log("INFO", "abstract.py:408", f"It took {time.perf_counter() - began:.6f} seconds to wake up tags {shown}.")  # fmt: skip
        self.asleep -= waking
        if not self.asleep:
            if self.level:
                self.slept(False)
            self.level = None
            self.awake.set()
        return {"status": "sleeping" if self.paused else "awake", "tags": tags}

    async def _rpc(self, request: Request) -> Response:
        try:
            body = request.json()
        except ValueError as exc:
            return Response.json({"detail": f"JSON decode error: {exc}"}, 400)
        if not isinstance(body, dict):
            return Response.json({"detail": "Request body must be a JSON object"}, 400)
        if body.get("method") is None:
            return Response.json({"detail": "Missing 'method' in request body"}, 400)
        if body["method"] == "reload_weights":
            # Read off disk again at the reload rate, then right answers again.
            await asyncio.sleep(self.weights_gib / self.reload_gibps)
            self.stale = self.stale and not self.reload_fixes
            return Response(200, b"", "application/json")
        return Response.json({"results": [None]})

    def answer(self, piece: tuple[str, str]) -> tuple[str, str]:
        """A generated piece as the weights make it: garbage after a level-2 wake that was
        not followed by reload_weights (the memory is back; what it holds is not)."""
        if not self.stale:
            return piece
        kind, text = piece
        return kind, "".join(chr(0x2580 + ord(c) % 32) if not c.isspace() else c for c in text)

    def metric_lines(self, base: dict[str, str], family: Callable[..., None]) -> None:
        """vllm:engine_sleep_state and the operations' durations, on /metrics."""
        states = {
            "awake": float(not self.paused),
            "weights_offloaded": float(self.level == 1),
            "discard_all": float(self.level == 2),
        }
        family(
            "engine_sleep_state",
            "gauge",
            "Engine sleep state; awake = 0 means engine is sleeping; awake = 1 means engine "
            "is awake; weights_offloaded = 1 means sleep level 1; discard_all = 1 means sleep "
            "level 2.",
            [("engine_sleep_state", {**base, "sleep_state": s}, v) for s, v in states.items()],
        )
        name = "sleep_mode_operation_duration_seconds"
        samples: list[tuple[str, dict[str, str], float]] = []
        for op, hist in self.durations.items():
            if not hist.count:
                continue  # a label's child exists once its first operation is recorded
            bounds = [*(repr(float(b)) for b in hist.buckets), "+Inf"]
            counts = [*hist.counts, hist.count]
            samples += [(f"{name}_bucket", {"operation": op, "le": le}, c) for le, c in zip(bounds, counts, strict=True)]  # fmt: skip
            samples += [
                (f"{name}_count", {"operation": op}, hist.count),
                (f"{name}_sum", {"operation": op}, hist.total),
            ]
        family(name, "histogram", "Duration of one sleep-mode operation.", samples)


def _invalid(level: str, mode: str) -> Response:
    """FastAPI's 422 for a query parameter out of its range."""
    if level not in ("0", "1", "2"):
        where, msg = "level", "Input should be less than or equal to 2"
        if not level.lstrip("-").isdigit():
            msg = "Input should be a valid integer, unable to parse string as an integer"
        elif int(level) < 0:
            msg = "Input should be greater than or equal to 0"
    else:
        where, msg = "mode", "Input should be 'abort', 'wait' or 'keep'"
    detail = [{"type": "value_error", "loc": ["query", where], "msg": msg, "input": level if where == "level" else mode}]  # fmt: skip
    return Response.json({"detail": detail}, 422)
