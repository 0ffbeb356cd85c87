"""`laned serve`: render the lanes, start the supervisor, serve the control API until SIGTERM.

The lanes are systemd units of their own: stopping laned never stops them, and a new
laned adopts what runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator

import uvicorn
from fastapi import FastAPI

from laned.adapters import rendered
from laned.adapters.host import Host
from laned.adapters.kernel import give_back_large_buffers, trim_memory, usable_memory
from laned.adapters.notify import keep_watchdog, notify
from laned.adapters.podman import Podman
from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.api import ApiSettings, create_app
from laned.api.budget import Budget
from laned.api.daemon import Reload
from laned.api.front import Front
from laned.api.limits import Limits, bounded
from laned.api.metrics import LanedMetrics
from laned.api.settings import api_settings
from laned.config.applied import reload_lines
from laned.config.listener import LimitsConfig
from laned.config.model import Config
from laned.config.names import podman_socket
from laned.errors import ConfigError, LanedError
from laned.owner import wiring
from laned.owner.coordinator import Coordinator
from laned.owner.supervisor import Supervisor
from laned.render import plan as render

log = logging.getLogger("laned")


async def start_supervisor(
    config: Config,
    systemd: Systemd | None = None,
    recorder: LanedMetrics | None = None,
    peer_token: str | None = None,
) -> Front:
    """Render and daemon-reload the lanes, then start a supervisor on them (and, for lanes
    over several hosts, the coordinator of their ranks, watching once started); the front
    over both, the one the metrics and the API read."""
    systemd = systemd or Systemd()
    await systemd.connect()
    version = await systemd.version() or render.DEFAULT_SYSTEMD_VERSION
    changes = rendered.apply(config, version)
    if any(action is not render.Action.UNCHANGED for action, _ in changes):
        await systemd.reload()
    # The supervisor keeps this connection (one bus connection per laned).
    host = Host(Podman(podman_socket(config, os.environ, os.getuid())))
    seam = wiring.host_seam(systemd, Probe(), host)  # the owner's one way to the host
    supervisor = Supervisor(config, seam, systemd_version=version)
    coordinator = None
    if any(spec.nodes for spec in config.lanes.values()):
        coordinator = Coordinator(supervisor, wiring.peers(peer_token))
    front = Front(supervisor, coordinator)  # the one view of this laned: metrics and API
    if recorder is not None:
        supervisor.recorder = recorder
        recorder.attach(front, front.host_facts)
    await supervisor.start()
    if coordinator is not None:
        coordinator.start()
    return front


# Idle keep-alive of the control API. Longer than clients keep a pooled connection (httpx
# 5 s, Prometheus' scrapes every 15 s or more): when server and client give up on an idle
# connection at the same moment (uvicorn's default is also 5 s), the client's next request
# on it fails with a reset instead of an answer.
API_KEEP_ALIVE = 75


class ApiServer(uvicorn.Server):
    """uvicorn without its own signal handling: laned stops it itself (`stop()`), then the
    supervisor. Its main loop wakes once a second, not ten times: uvicorn's tick refreshes
    the Date header each second and looks for should_exit, which `stop()` sets and wakes
    at once (an idle laned woke 10.8 times a second, bench/cost.py)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield

    budget: Budget | None = None  # the memory of requests in flight (laned.api.budget)

    def stop(self) -> None:
        """Ask the server to exit, now."""
        self.should_exit = True
        if self._woken is not None:
            self._woken.set()

    _woken: asyncio.Event | None = None

    async def main_loop(self) -> None:
        self._woken = asyncio.Event()
        counter = 0  # in uvicorn's tenths of a second: on_tick acts on every tenth
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._woken.wait(), 1.0)
            should_exit = await self.on_tick(counter)


TRIM_EVERY = 1.0  # seconds: the heap is trimmed at most this often


def _trimmer() -> Callable[[], None]:
    """What the request budget calls when it empties: the C library's free heap given back
    (laned.adapters.kernel.trim_memory), at most once every TRIM_EVERY."""
    last = [-TRIM_EVERY]

    def trim() -> None:
        now = time.monotonic()
        if now - last[0] >= TRIM_EVERY:
            last[0] = now
            trim_memory()

    return trim


def api_server(
    app: FastAPI, settings: ApiSettings, limits: LimitsConfig | None = None
) -> ApiServer:
    """The control API's HTTP server (`laned serve`, and the tests, use this one), its input
    bounded by `limits` (daemon.limits; laned.api.limits), the memory of its requests in
    flight by one budget sized from the memory laned may use (its `budget`)."""
    bounds = Limits.of(limits or LimitsConfig(), memory=usable_memory())
    budget = Budget(bounds.request_memory, _trimmer())
    server = ApiServer(
        uvicorn.Config(
            app,
            host=settings.listen_host,
            port=settings.listen_port,
            log_level="warning",
            timeout_keep_alive=API_KEEP_ALIVE,
            http=bounded(bounds, budget),
        )
    )
    server.budget = budget
    return server


async def reload_on_hangup(reload_config: Reload, source: str) -> None:
    """SIGHUP (systemd's ExecReload=, so `systemctl --user reload laned`): what POST /reload
    does, by the same call; the result in laned's log. A config that is bad or refused
    changes nothing: the lanes run on, and the log says every error with its key."""
    log.info("SIGHUP: reloading %s", source)
    # systemd's protocol for a Type=notify service: the unit shows `reloading` until READY=1.
    notify(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")
    try:
        result = await reload_config()
    except ConfigError as exc:
        log.error("SIGHUP: not reloaded, the running config stays in force: %s", exc)
    except LanedError as exc:
        log.error(
            "SIGHUP: not reloaded, the running config stays in force: %s (%s)",
            exc.message,
            exc.hint,
        )
    except Exception:  # the reload's own fault: said, and laned serves on
        log.exception("SIGHUP: the reload failed; the running config stays in force")
    else:
        said = reload_lines(result["keys"], result["restart_needed"])
        log.info("SIGHUP: reloaded %s: %s", source, "; ".join(said))
    finally:
        notify("READY=1")


async def serve(config: Config) -> int:
    """Run laned until SIGTERM or SIGINT; SIGHUP reloads the config (POST /reload)."""
    give_back_large_buffers()  # request bodies' memory goes back once they are answered
    loop = asyncio.get_running_loop()
    # Until the API is up there is nothing to reload into: SIGHUP must not end laned (its
    # default action) while it starts.
    loop.add_signal_handler(
        signal.SIGHUP, lambda: log.warning("SIGHUP while laned starts: ignored, send it again")
    )
    settings = api_settings(config)
    metrics = LanedMetrics()
    front = await start_supervisor(config, recorder=metrics, peer_token=settings.peer_token)
    supervisor, coordinator = front.supervisor, front.coordinator
    app = create_app(front, settings, metrics)
    server = api_server(app, settings, config.daemon.limits)
    metrics.budget = server.budget
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, server.stop)
    reloads: set[asyncio.Task[None]] = set()

    def hangup() -> None:
        assert app.reload_config is not None
        task = loop.create_task(reload_on_hangup(app.reload_config, supervisor.config.source))
        reloads.add(task)  # kept until done (the loop holds tasks weakly)
        task.add_done_callback(reloads.discard)

    loop.add_signal_handler(signal.SIGHUP, hangup)
    log.info(
        "laned is supervising %d lane(s); API on http://%s", len(config.lanes), config.daemon.listen
    )
    serving = loop.create_task(server.serve())
    watchdog = loop.create_task(keep_watchdog())
    try:
        while not server.started and not serving.done():
            await asyncio.sleep(0.02)
        if server.started:
            # READY once the API listens and the first reconcile is done (Type=notify).
            notify(f"READY=1\nSTATUS=supervising {len(config.lanes)} lane(s)")
        await serving
    finally:
        notify("STOPPING=1")
        watchdog.cancel()
        if coordinator is not None:
            await coordinator.close()
        await supervisor.close()
        await supervisor.seam.close()
    return 0
