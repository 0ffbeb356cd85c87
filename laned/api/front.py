"""The front: what the API (and so the CLI) and the metrics use of a running laned.

Requests go to the supervisor (the one owner); views, event subscriptions, logs and the
host's fit are read here, so that no caller reaches into the supervisor's state or its
adapters. The front changes no lane state.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from laned import engines
from laned.config.model import GATES, Config, LaneConfig, gpu_indices
from laned.config.names import unit_name, weights_unit_name
from laned.config.ranks import rank_here
from laned.core import policy
from laned.core.facts import HostFacts, blocking
from laned.core.lanes import Event, LaneState, LaneStatus
from laned.core.schedule import Admission
from laned.errors import BadRequest, BusUnavailable, PreflightFailed
from laned.owner.supervisor import Supervisor
from laned.owner.traffic import Traffic
from laned.preflight.fit import fit_report
from laned.preflight.rules import refusal, report
from laned.validation.load import load_config

if TYPE_CHECKING:
    from laned.owner.coordinator import Coordinator


class Front:
    """One running laned, as its callers see it."""

    def __init__(self, supervisor: Supervisor, coordinator: Coordinator | None = None) -> None:
        self.supervisor = supervisor
        self.coordinator = coordinator  # lanes over several hosts (laned serve makes one)

    # --- reading ----------------------------------------------------------------------------

    def notices(self) -> list[str]:
        """What laned met since it started and recovered from, or meets now; journald's
        liveness is read as asked (one connect to its socket)."""
        notices = list(self.supervisor.notices.values())
        down = self.supervisor.journald_down()
        if down is not None:
            notices.append(
                f"{down}: the engines' log lines are lost until it is back, startup phases are "
                "not shown and readiness is found by probing alone (start it: "
                "`systemctl start systemd-journald`)"
            )
        return notices

    def engine_spec(self, lane: str) -> LaneConfig:
        """The lane's engine as it runs: its port and model name until its next start."""
        return self.supervisor.engine_spec(lane)

    def status(self, lane: str) -> LaneStatus:
        """The lane's status; UnknownLane (with the configured names) otherwise."""
        self.supervisor.spec(lane)
        return self.supervisor.statuses[lane]

    @property
    def config(self) -> Config:
        """The config laned runs (the last one reload accepted)."""
        return self.supervisor.config

    @property
    def statuses(self) -> Mapping[str, LaneStatus]:
        """Every lane's status, read-only."""
        return MappingProxyType(self.supervisor.statuses)

    def engine_summary(self, lane: str) -> dict[str, float] | None:
        """The lane's engine load from its /metrics (running lanes only)."""
        return self.supervisor.engine_summary(lane)

    def engine_info(self, lane: str) -> tuple[str, str]:
        """(the lane's engine, its served model name), as it runs."""
        spec = self.supervisor.engine_spec(lane)
        return engines.for_lane(spec).name, spec.served_model_name

    @property
    def traffic(self) -> Traffic:
        """Requests at laned's OpenAI endpoint: in flight and waiting, per lane."""
        return self.supervisor.traffic

    def proxy_counts(self, lane: str) -> dict[str, float]:
        """The lane's requests at laned's OpenAI endpoint: in flight, waiting for it."""
        return self.supervisor.traffic.counts(lane)

    def admission(self, lane: str, arrived: float) -> Admission:
        """Whether a request for the lane goes to its engine now, waits, or is refused."""
        return self.supervisor.admission(lane, arrived)

    async def turn(self, lane: str, arrived: float, timeout: float) -> Admission:
        """A waiting request's turn: GO or REFUSE (with why); TimeoutError."""
        return await self.supervisor.turn(lane, arrived, timeout)

    def lanes(self) -> list[str]:
        """The configured lanes, sorted."""
        return sorted(self.supervisor.statuses)

    async def views(self, host: str = "127.0.0.1") -> dict[str, Any]:
        """GET /lanes: every lane's view; `notices`: what laned itself meets (as in /healthz)."""
        return {
            "lanes": [await self.view(n, host) for n in self.lanes()],
            "notices": self.notices(),
        }

    async def view(self, lane: str, host: str = "127.0.0.1") -> dict[str, Any]:
        """Everything about one lane: state, desired, phase, restarts, where to reach it."""
        sup = self.supervisor
        status = self.status(lane)
        spec, engine = sup.config.lanes[lane], sup.engine_spec(lane)  # as configured, as it runs
        shown = status.to_json()
        ranks = self.rank_view(lane)
        if ranks is not None and ranks["peers"] and status.state is LaneState.STARTING:
            # The head's cold start, with what each worker was doing at the last look.
            others = [
                f"rank {p['rank']} ({p['host']}): {p.get('phase') or p.get('state') or 'not seen yet'}"
                for p in ranks["peers"]
            ]
            shown["phase"] = f"head: {status.phase or 'starting'}, " + ", ".join(others)
        return {
            **shown,
            "unit": unit_name(lane, spec),
            "group": spec.group,
            "port": engine.port,  # a reload's new port waits for the lane's next start
            "served_model_name": engine.served_model_name,
            "engine_name": engines.for_lane(engine).name,
            "base_url": f"http://{_bracketed(host)}:{engine.port}/v1",
            "engine": sup.engine_summary(lane),
            "proxy": sup.traffic.counts(lane),
            "startup": status.startup(sup.clock()),
            "ready_in": _ready_in(status),
            "container": await self._container(lane),
            "rank": ranks,
            "weight_cache": self._weight_cache(lane, status),
        }

    def _weight_cache(self, lane: str, status: LaneStatus) -> dict[str, Any] | None:
        """The lane's weight-cache daemon: its unit, its state, the GPU memory it holds by its
        own word (None where it does not answer), its /health port; None without one."""
        spec = self.supervisor.engine_spec(lane)
        if spec.weight_cache is None:
            return None
        return {
            "unit": weights_unit_name(lane, spec),
            "state": status.weights or "stopped",
            "held_bytes": status.weights_held,
            "health_port": spec.weight_cache_ports()[0],
        }

    def rank_view(self, lane: str) -> dict[str, Any] | None:
        """A lane over several hosts: this host's rank and the lane's nodes."""
        config = self.supervisor.config
        spec = config.lanes[lane]
        rank = rank_here(config, lane)
        if rank is None:
            return None
        nodes = [{"rank": i, "host": n.host, "laned": n.laned} for i, n in enumerate(spec.nodes)]
        peers = self.coordinator.peers_of(lane) if self.coordinator and rank == 0 else None
        return {
            "rank": rank,
            "head": rank == 0,
            "headless": engines.headless(spec),
            "nodes": nodes,
            "peers": peers,  # on the head: what it last saw of each worker
        }

    async def _container(self, lane: str) -> dict[str, Any] | None:
        return await self.supervisor.container(lane)

    def sd_targets(self, host: str = "127.0.0.1") -> list[dict[str, Any]]:
        """Prometheus HTTP service discovery: the running lanes' engine /metrics endpoints."""
        sup = self.supervisor
        targets = []
        for name, status in sorted(sup.statuses.items()):
            spec = sup.engine_spec(name)
            if status.state not in policy.RUNNING_STATES or engines.headless(spec):
                continue  # a worker rank has no /metrics: the head's engine speaks for the lane
            labels = {
                "lane": name,
                "model": spec.served_model_name,
                "unit": unit_name(name, spec),
                "engine": engines.for_lane(spec).name,
            }
            targets.append({"targets": [f"{_bracketed(host)}:{spec.port}"], "labels": labels})
        return targets

    def events(self, lane: str | None = None, limit: int = 100) -> list[Event]:
        """The last `limit` events (of one lane, or all), oldest first."""
        if lane is not None:
            self.status(lane)
        return [e for e in self.supervisor.events if lane is None or e.lane == lane][-limit:]

    @contextlib.contextmanager
    def subscribe(
        self, lane: str | None = None, size: int = 1000
    ) -> Iterator[asyncio.Queue[Event]]:
        """New events (of one lane, or all) as they happen; a slow reader loses the newest."""
        queue: asyncio.Queue[Event] = asyncio.Queue(maxsize=size)

        def listener(event: Event) -> None:
            if (lane is None or event.lane == lane) and not queue.full():
                queue.put_nowait(event)

        self.supervisor.listen(listener)
        try:
            yield queue
        finally:
            self.supervisor.unlisten(listener)

    async def logs(self, lane: str, lines: int, source: str = "journal") -> list[str]:
        """The engine's last log lines, from journald or the running container's own log."""
        self.status(lane)
        return await self.supervisor.log_lines(lane, lines, source)

    async def host_facts(self) -> HostFacts:
        """The host's GPUs and memory as read now (for /metrics)."""
        return await self.supervisor.host_facts()

    async def fit(self) -> dict[str, Any]:
        """Which configured lanes this host can run at all (needs against GPUs, memory, disks)."""
        facts = await self.supervisor.host_facts()
        lanes = self.supervisor.config.lanes
        weights = await self.supervisor.weights_gib([n for n, s in lanes.items() if s.sleep_level])
        placed, asleep = self.supervisor.placed(), self.supervisor.resting()
        return fit_report(lanes, facts, weights, placed, asleep)

    async def weights(self) -> dict[str, Any]:
        """Each lane with local weight files: how much of them is in the page cache now."""
        return {"lanes": await self.supervisor.weights_resident()}

    async def gpus(self) -> dict[str, Any]:
        """Each GPU's memory as NVML reads it, and which lane's engine each process is of
        (`lane` null: not one of laned's); `note` says why there are none."""
        facts = await self.supervisor.host_facts()
        if facts.gpus is None:
            return {"gpus": [], "note": facts.gpu_note or "no NVML"}
        holders = await self.supervisor.gpu_holders()
        places = {g.index: g for g in self.supervisor.placement()}
        asleep = {fp.lane for fp in self.supervisor.resting()}
        return {
            "note": facts.gpu_note or None,  # the GPUs NVML could not read, and why
            "gpus": [
                {
                    "index": gpu.index,
                    "name": gpu.name,
                    # unified: its memory is the host's pool (total, and all that is taken
                    # of it, by any process): docs/placement.md, "Unified memory".
                    "unified": gpu.unified,
                    "total_bytes": gpu.total_bytes,
                    "used_bytes": gpu.used_bytes,
                    # Where laned placed lanes (laned.core.placement): what each takes, and
                    # what is left for another (null: cannot be told).
                    "placed": [
                        {"lane": n, "bytes": b, "asleep": n in asleep}
                        for n, b in (places[gpu.index].lanes if gpu.index in places else ())
                    ],
                    "left_bytes": places[gpu.index].left
                    if gpu.index in places
                    else gpu.total_bytes,
                    "processes": None
                    if gpu.processes is None
                    else [{"pid": p, "bytes": b, "lane": holders.get(p)} for p, b in gpu.processes],
                }
                for gpu in facts.gpus
            ],
        }

    def timeline(self, hours: float) -> dict[str, Any]:
        """Which lane held which GPUs over the last `hours`: every transition since, and the
        lanes by band (their explicit group, else the GPUs they name: "gpus 2,3", "gpus")."""
        now = self.supervisor.clock()
        config = self.supervisor.config
        groups: dict[str, list[str]] = {}
        for name, spec in sorted(config.lanes.items()):
            gpus = gpu_indices(spec)
            band = spec.group or ("gpus " + ",".join(map(str, gpus)) if gpus else "gpus")
            groups.setdefault(band, []).append(name)
        since = now - hours * 3600
        return {
            "now": now,
            "since": since,
            "groups": groups,
            "transitions": self.supervisor.timeline(since),
        }

    async def preflight(self, lane: str) -> dict[str, Any]:
        """Would the lane start now? Every finding, errors first."""
        self.status(lane)
        return report(lane, await self.supervisor.preflight(lane))

    # --- requests ---------------------------------------------------------------------------

    async def activate(
        self, lane: str, force: bool = False, reason: str = "activate", rank_only: bool = False
    ) -> asyncio.Future[LaneStatus]:
        """Activate the lane; PreflightFailed at once (nothing stopped) when preflight refuses.
        `force`: start despite preflight errors, stop its peers without draining requests.

        The early preflight lets a caller that does not wait hear why, too; the activation
        then uses its findings instead of running preflight again."""
        status = self.status(lane)
        self._reachable(lane, "activated")
        rank = self._rank_of(lane, rank_only)
        if rank is not None and rank > 0:  # a worker's host: the head coordinates
            assert self.coordinator is not None
            await self.coordinator.ask_head(lane, "activate", force)
            return self.supervisor.wait_ready(lane)  # the head asked this rank meanwhile
        findings = None
        if not force and not policy.already_active(status.state, status.desired):
            findings = await self.supervisor.preflight(lane)
            if blocking(findings):
                message, hint = refusal(lane, findings)
                raise PreflightFailed(message, hint, findings)
        if rank == 0:  # the head: its own preflight passed; now every worker's rank
            assert self.coordinator is not None
            await self.coordinator.ask_workers(lane, "activate", force)
        return await self._kept(
            self.supervisor.activate(lane, reason, force=force, findings=findings)
        )

    async def deactivate(
        self, lane: str, force: bool = False, rank_only: bool = False
    ) -> asyncio.Future[LaneStatus]:
        """Stop the lane (never counted as a failure); `force`: without draining requests."""
        self.status(lane)
        self._reachable(lane, "stopped")
        if await self._coordinated(lane, "deactivate", force, rank_only):
            # The head asked this rank to stop before it answered; that stop is under way.
            accepted: asyncio.Future[LaneStatus] = asyncio.get_running_loop().create_future()
            accepted.set_result(self.status(lane))
            return accepted
        return await self._kept(self.supervisor.deactivate(lane, force))

    async def restart(
        self, lane: str, force: bool = False, rank_only: bool = False
    ) -> asyncio.Future[LaneStatus]:
        """Stop and start the lane again; `force`: without draining requests."""
        self.status(lane)
        self._reachable(lane, "restarted")
        if await self._coordinated(lane, "restart", force, rank_only):
            return self.supervisor.wait_ready(lane)
        return await self._kept(self.supervisor.restart(lane, force=force))

    async def rank_sleep(self, lane: str, step: str, level: int) -> dict[str, Any]:
        """This host's rank around its head's sleep (laned.owner.coordinator.rank_sleep)."""
        self.status(lane)
        if self.coordinator is None:
            raise BadRequest(
                f"lane {lane}: this laned coordinates no lane over several hosts",
                "only a head's laned calls rank-sleep",
            )
        return await self.coordinator.rank_sleep(lane, step, level)

    def _reachable(self, lane: str, what: str) -> None:
        """Refuse a request while the user manager is out of reach (nothing is recorded)."""
        away = self.supervisor.notices.get("user manager")
        if away is not None:
            raise BusUnavailable(
                f"lane {lane} cannot be {what} now: {away}",
                "laned reconnects by itself (GET /healthz says while it cannot); ask again then",
            )

    async def _kept(self, accepted: asyncio.Future[LaneStatus]) -> asyncio.Future[LaneStatus]:
        """An accepted request is on disk (state.json) before laned answers it: a laned
        killed right after its answer comes back wanting what the caller was told."""
        await self.supervisor.flush()
        return accepted

    def _rank_of(self, lane: str, rank_only: bool) -> int | None:
        """This host's rank when the request is for a whole lane over several hosts."""
        if rank_only or self.coordinator is None:
            return None
        return self.coordinator.rank(lane)

    async def _coordinated(self, lane: str, action: str, force: bool, rank_only: bool) -> bool:
        """A whole lane over several hosts: on a worker's host the request goes to the head
        (True: it calls this rank back); on the head, the workers act first (False: now this
        rank)."""
        rank = self._rank_of(lane, rank_only)
        if rank is None:
            return False
        assert self.coordinator is not None
        if rank > 0:
            await self.coordinator.ask_head(lane, action, force)
            return True
        await self.coordinator.ask_workers(lane, action, force)
        return False

    async def check(self, lane: str, gates: Sequence[str] = GATES) -> dict[str, Any]:
        """Run acceptance gates against the lane and keep the results."""
        self.status(lane)
        return await self.supervisor.check(lane, gates)

    async def load(self) -> Config:
        """The config file as it is now, validated (ConfigError: every problem)."""
        return await asyncio.to_thread(load_config, self.supervisor.config.source)

    async def reload(self, new: Config, peer_token: str | None) -> dict[str, Any]:
        """Apply a new config (ConfigRefused: nothing changes); the peers' token from now on."""
        applied = await self.supervisor.reload(new)
        if self.coordinator is not None:
            self.coordinator.peers.use_token(peer_token)
        return applied


def _ready_in(status: LaneStatus) -> float | None:
    """Seconds to serve from where the lane is, as measured last time: 0 serving, its last
    wake asleep, its last cold start stopped; None while it moves or before a measure."""
    if status.state in (LaneState.READY, LaneState.DEGRADED):
        return 0.0
    if status.state is LaneState.SLEEPING:
        return status.last_wake
    if status.state in (LaneState.INACTIVE, LaneState.FAILED):
        return status.last_cold_start
    return None


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host
