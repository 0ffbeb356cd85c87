"""The faults a test can inject into the simulated engine (POST /sim/fault)."""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Protocol

from laned.sim.http import Request, Response
from laned.sim.responses import error
from laned.sim.sleep import Sleep
from laned.sim.startup import log


class Engine(Protocol):
    """What a fault changes of the engine (laned.sim.engine.Engine)."""

    dead: bool
    stalled: bool
    sleep: Sleep
    on_exit: Callable[[int, float], None]

    def log_engine_death(self) -> None: ...


def _hog_memory() -> None:
    held = []
    while True:
        held.append(b"\x01" * (64 << 20))  # written, so the pages are really taken


def inject(engine: Engine, request: Request) -> Response:
    """POST /sim/fault: the failure the test asks for."""
    try:
        body = request.json()
        kind = body["kind"]
    except (ValueError, KeyError, TypeError):
        return error(
            'expected {"kind": "exit"|"engine-dead"|"stall"|"crash"|"oom"|"bad-reload", ...}', 400
        )
    log("WARNING", "sim.py:1", f"fault injected: {json.dumps(body)}")
    if kind == "exit":
        code, linger = int(body.get("code", 1)), float(body.get("linger", 0))
        return Response(200, b'{"fault":"exit"}', after=lambda: engine.on_exit(code, linger))
    if kind == "crash":
        sig = int(body.get("signal", signal.SIGKILL))

        def crash() -> None:
            if os.getpid() == 1:
                # PID 1 of a container cannot be killed by a signal it sends itself; exit
                # as podman reports a killed container: 128 + the signal.
                sys.stderr.flush()
                os._exit(128 + sig)
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)  # die of it, even from SIGTERM
            os.kill(os.getpid(), sig)

        return Response(200, b'{"fault":"crash"}', after=crash)
    if kind == "engine-dead":
        engine.dead = True
        engine.log_engine_death()
        return Response.json({"fault": "engine-dead"})
    if kind == "stall":
        engine.stalled = True
        return Response.json({"fault": "stall"})
    if kind == "bad-reload":
        # reload_weights leaves the weights wrong (a model whose loader cannot reload in
        # place): after a level-2 wake the engine answers wrongly for good, /health 200.
        engine.sleep.reload_fixes = False
        return Response.json({"fault": "bad-reload"})
    if kind == "oom":
        # Take host memory until the kernel's OOM killer (or a container's limit) ends it.
        return Response(200, b'{"fault":"oom"}', after=_hog_memory)
    return error(f"unknown fault kind {kind!r}", 400)
