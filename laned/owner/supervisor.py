"""The supervisor: the one owner of lane state, composed of its parts.

Commands reach it as synchronous calls on its event loop (requests, systemd's unit changes,
the watchers' observations, timers), each handled to its end before the next: the loop is
the owner's queue (docs/decisions/0005-one-owner.md). Every lane has one immutable record
(laned.core.lanes.LaneStatus) in the owner's book (laned.owner.book); it changes only by the
lane machine's pure step (laned.core.machine), run by one interpreter
(laned.owner.interpreter), which replaces the record and runs the step's effects — the
sequences of a request among them, whose actions (laned.owner.actions) act on the host
through one seam (laned.owner.seam, given here: a small protocol per kind of thing on the
host, each part handed the ones it uses). The parts post inputs and read records:

- `Requests` (owner.requests): activate, deactivate, restart, planned across lanes;
- `Reactions` (owner.reactions): a unit's change, an exit, what the watchers observe, the
  journal's startup phases, a peer rank out of reach;
- `Weights` (owner.weights): the weight-cache daemons' units;
- `Checks` (owner.checks): acceptance gates against a serving lane;
- `Outages` (owner.outages): the user manager, journald, the state file away and back;
- `BusKeeper` (owner.bus): the D-Bus connection and its resyncs;
- `Scheduler` (owner.scheduler): the swaps that requests waiting at the OpenAI endpoint ask
  for, and each request's turn.

Everyone else (the front, the proxy, the coordinator, the metrics) uses the methods below
and reads what they return (the records are snapshots); nobody reaches into the parts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from laned import engines
from laned.config.model import GATES, Config, LaneConfig
from laned.config.names import unit_name
from laned.core import inputs as i
from laned.core import placement, policy, resume
from laned.core.facts import HostFacts
from laned.core.lanes import Event, EventKind, LaneStatus
from laned.core.liveness import engine_summary
from laned.core.machine import Context
from laned.core.recorder import Recorder
from laned.core.schedule import Admission
from laned.errors import ConfigRefused, Finding, LanedError
from laned.owner.actions import Actions, rank_held
from laned.owner.book import Book, Listener
from laned.owner.bus import BusKeeper
from laned.owner.checkpoints import Checkpoints
from laned.owner.checks import Checks
from laned.owner.interpreter import Interpreter
from laned.owner.outages import Outages
from laned.owner.prefetching import Prefetches
from laned.owner.reactions import Reactions
from laned.owner.records import Records
from laned.owner.requests import Requests
from laned.owner.scheduler import Scheduler
from laned.owner.seam import Seam
from laned.owner.traffic import Traffic
from laned.owner.weights import Weights
from laned.preflight.rules import model_path
from laned.render import plan as render

log = logging.getLogger("laned.supervisor")
GPU_REREAD = 60.0  # seconds between tries to read GPUs that laned could not read at its start


class _Hands:
    """What the interpreter runs beside the sequences (laned.owner.interpreter.Hands), by
    the parts that do it."""

    def __init__(
        self,
        records: Records,
        reactions: Reactions,
        checks: Checks,
        weights: Weights,
        prefetches: Prefetches,
    ) -> None:
        self.records, self.reactions, self.checks = records, reactions, checks
        self.weights, self.prefetches = weights, prefetches

    def watch(self, lane: str, run: int) -> Coroutine[object, object, None]:
        return self.reactions.watch(lane, run)

    def task(self, lane: str, what: str, reason: str) -> Coroutine[object, object, None] | None:
        tasks: dict[str, Callable[[], Coroutine[object, object, None]]] = {
            "after-activate": lambda: self.checks.after_activate(lane),
            "weights-gone": lambda: self.weights.down_said(lane),
            "stopped-outside": lambda: self.reactions.stopped_outside(lane, reason),
        }
        return tasks[what]()

    def prefetch(self, lane: str, what: str, taking_off: tuple[str, ...]) -> None:
        if what == "begin":
            self.prefetches.begin(lane, taking_off)
        else:
            self.prefetches.end(lane)

    def context(self, lane: str, epoch: int) -> Context:
        r = self.records
        spec = r.config.lanes.get(lane)
        missed = None
        if spec is not None and spec.weight_cache is not None:
            cache = engines.for_lane(spec).weight_cache
            missed = cache.missed if cache is not None else None
        return Context(r.clock(), time.monotonic(), spec, epoch, missed)


class Supervisor:
    """Owns every lane's state; talks to systemd and the engines."""

    def __init__(
        self,
        config: Config,
        seam: Seam,
        systemd_version: int = render.DEFAULT_SYSTEMD_VERSION,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`seam`: the one way to the host (laned.owner.wiring.host_seam over the adapters)."""
        self.seam, self.clock = seam, clock
        self.records = records = Records(config, clock, systemd_version, seam.state)
        self.traffic = Traffic(clock)  # laned's OpenAI endpoint counts its requests here
        records.load = lambda lane: self.traffic.queued(lane) + self.traffic.in_flight(lane)
        self.checks = Checks(records, seam.engines, seam.state)
        checkpoints = Checkpoints(records, seam.pages, seam.state)
        self.weights = Weights(records, seam.units, seam.weight_caches, checkpoints)
        self.reactions = Reactions(records, seam, self.weights, checkpoints)
        self.prefetches = Prefetches(records, seam.pages)
        self.actions = Actions(
            records, seam, self.traffic, self.weights, checkpoints, self.prefetches
        )
        hands = _Hands(records, self.reactions, self.checks, self.weights, self.prefetches)
        self.interpreter = run = Interpreter(
            records.book, self.actions, hands, lambda: records.recorder, records.spawn
        )
        self.requests = Requests(records, run, self.actions)
        # The parts post inputs through the interpreter, the one way a lane changes.
        for part in (self.checks, self.weights, self.reactions, self.prefetches):
            part.post = run.post
        self.actions.take_off, self.actions.epoch = run.take_off, run.epoch
        self.actions.canary = self.reactions.canary
        self.reactions.started_outside = self.requests.started_outside
        self.reactions.poke, self.reactions.alarm = run.poke, run.alarm
        self.reactions.restart_waiting = run.restart_waiting
        self.outages = Outages(records, seam.journal, self.reactions, self.requests, run)
        self.scheduler = Scheduler(records, self.traffic, self.requests.activate)
        self.bus = BusKeeper(
            seam.manager,
            seam.units,
            records.all_units,
            self.reactions.unit_changed,
            self.outages.resynced,
            functools.partial(records.trouble, "user manager"),
        )
        self._log_task: asyncio.Task[None] | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Load the saved state, connect to systemd, reconcile with what runs."""
        r = self.records
        store = self.seam.state
        saved = store.load(r.config.daemon.state_dir)
        if saved.problem is not None:
            log.warning("%s", saved.problem)
            r.notices["state.json at start"] = saved.problem
        # Restoring is an input like any other: each lane takes up what state.json kept.
        r.book.restore_log(saved)
        for lane in r.config.lanes:
            checks = store.load_checks(r.config.daemon.state_dir, lane)
            self.interpreter.post(lane, Book.restoring(saved, lane, checks))
        r.writer.start()
        if not await self.read_gpus():
            r.spawn(self._read_gpus_later())
        await self.bus.connect()
        self._log_task = r.spawn(self.outages.follow_logs())
        await self.reconcile(first=not saved.desired)
        r.spawn(self.bus.keep())
        r.spawn(self.scheduler.run())

    async def read_gpus(self) -> bool:
        """The host's GPUs, for placement (laned.core.placement): read at start, and by
        `_read_gpus_later` until read; True when read. Their sizes do not change while
        laned runs."""
        try:
            gpus = (await self.seam.facts.host_facts()).gpus
        except Exception as exc:  # placement then keeps lanes apart where sizes matter
            log.warning("GPUs not read for placement: %r", exc)
            gpus = None
        self.records.gpu_totals = None if not gpus else {g.index: g.total_bytes for g in gpus}
        return self.records.gpu_totals is not None

    async def _read_gpus_later(self) -> None:
        """GPUs not read at start — a driver that loads after laned at boot, or a host with
        none — are tried again every GPU_REREAD seconds until read: until then placement
        adds up shares only and keeps lanes sized in GiB apart (docs/placement.md)."""
        while True:
            await asyncio.sleep(GPU_REREAD)
            if await self.read_gpus():
                totals = self.records.gpu_totals or {}
                log.info("GPUs read: %d; placement now counts their memory", len(totals))
                self.scheduler.news()  # a lane waiting may fit beside the others now
                return

    async def close(self) -> None:
        """Stop watching (the lanes keep running: they are systemd's units)."""
        self.prefetches.end_all()
        self.interpreter.close()
        tasks = self.records.cancel_all()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=10)
            for task in pending:
                log.error("a supervisor task did not stop: %r", task)
        await self.bus.close()
        await self.records.writer.close()

    async def reconcile(self, first: bool = False) -> None:
        """Adopt lanes that already run (never restart a healthy one); start the desired ones."""
        r, run = self.records, self.interpreter
        running = []
        for unit, lane in r.units.items():
            snap = await self.bus.snapshot(unit)
            run.post(lane, i.UnitSeen(snap))
            if snap.running and await self.seam.engines.asleep(r.config.lanes[lane]):
                # Put to sleep by an earlier laned: it stays asleep, not desired, until woken.
                # Taken to be asleep with the config laned starts with (which it cannot tell),
                # at the level the engine says (a level 2 woken as 1 would skip its reload).
                spec = r.config.lanes[lane]
                level = await self.seam.engines.sleep_level(spec)
                # Its processes, for the GPU-memory gate.
                pids = await self.seam.containers.engine_pids(lane, spec, snap.control_group)
                digest = render.lane_digest(r.config, lane, r.systemd_version)
                run.post(lane, i.FoundAsleep(digest, level or 0, frozenset(pids)))
            elif snap.running:
                running.append(lane)
        for unit, lane in r.weights_units.items():
            self.weights.seen(lane, await self.bus.snapshot(unit))
        desired = {n: s.desired for n, s in r.statuses.items()}
        workers = engines.workers(r.config.lanes)
        plan = resume.plan_reconcile(
            r.config, running, desired, r.book.states(), first, workers=workers
        )
        for lane in plan.adopt:
            run.post(lane, i.Adopt("adopted: already running"))
        for lane, reason in plan.start:
            self.requests.spawn_activation(lane, reason)

    async def reload(self, new: Config) -> dict[str, Any]:
        """Apply a new, already validated config; nothing running is disturbed.

        Each changed key is applied as its field declares (laned.config.applied): live ones
        now (the podman socket here; the API's own by the caller), next-start ones at the
        lane's next start (`restart_needed` names the running lanes they wait for; their
        engines are reached as they started meanwhile). Refused (ConfigRefused, the running
        config stays in force): removing or renaming the unit of a lane that runs or has an
        operation under way, or changing settings only a restart of laned applies."""
        r = self.records
        under_way = {n for n, status in r.statuses.items() if status.op is not None}
        under_way |= set(self.interpreter.restarts)
        problems = policy.reload_problems(r.config, new, r.book.states(), under_way)
        if problems:
            raise ConfigRefused(
                "the new config cannot be applied while laned runs", "; ".join(problems)
            )
        # No await from the check to the switch: nothing can start a lane in between.
        changes = await self.seam.units.render(new, r.systemd_version)
        restart_needed = policy.restart_needed(r.config, new, r.book.states())
        keys = policy.reload_changes(r.config, new)
        self.seam.containers.use_podman(new)
        old, r.config = r.config, new
        r.name_units(new)
        for lane in old.lanes.keys() - new.lanes.keys():
            r.book.drop(lane)
            self.interpreter.fail_waiters(lane, "removed from the config")
        for lane in new.lanes:
            r.book.add(lane)
        r.writer.mark()
        await self.seam.units.reload()
        await self.bus.ref_units()
        if self._log_task is not None:
            self._log_task.cancel()
        self._log_task = r.spawn(self.outages.follow_logs())
        return {
            "applied": True,
            "changed": [path for action, path in changes if action is not render.Action.UNCHANGED],
            "restart_needed": restart_needed,
            "keys": {change.key: change.applied.value for change in keys},
        }

    # --- requests (each answers with a future: ready, stopped, or why not) -------------------

    def activate(
        self,
        lane: str,
        reason: str = "activate",
        force: bool = False,
        findings: list[Finding] | None = None,
    ) -> asyncio.Future[LaneStatus]:
        """Make `lane` run, taking off what it cannot run beside (Requests.activate)."""
        return self.requests.activate(lane, reason, force, findings)

    def deactivate(self, lane: str, force: bool = False) -> asyncio.Future[LaneStatus]:
        """Stop `lane`, never counted as a failure (Requests.deactivate); the requests that
        wait for it are answered: an operator's stop wins over them."""
        self.spec(lane)
        self.scheduler.dismiss(lane, "deactivated by an operator")
        return self.requests.deactivate(lane, force)

    def restart(
        self, lane: str, reason: str = "restart requested", force: bool = False
    ) -> asyncio.Future[LaneStatus]:
        """Stop and start `lane` again (Requests.restart)."""
        return self.requests.restart(lane, reason, force)

    async def preflight(self, lane: str) -> list[Finding]:
        """The lane's preflight findings as of now ([] without a host adapter)."""
        return await self.requests.preflight(lane)

    async def check(self, lane: str, gates: Sequence[str] = GATES) -> dict[str, Any]:
        """Run acceptance gates against the serving lane and keep the results (Checks.check)."""
        return await self.checks.check(lane, gates)

    def peer_trouble(self, lane: str, reason: str | None) -> None:
        """The coordinator's word on a lane over several hosts: a peer rank out of reach
        (`reason`) or every one back (None)."""
        self.reactions.peer_trouble(lane, reason)

    async def rank_held(self, lane: str) -> tuple[set[int], dict[int, int] | None]:
        """This host's rank of a lane over several hosts: its engine's processes and what
        they hold on each of its GPUs (None where that cannot be read)."""
        return await rank_held(self.seam, lane, self.engine_spec(lane))

    def rank_asleep(
        self, lane: str, level: int, pids: set[int], residual: Mapping[int, int]
    ) -> str | None:
        """This host's rank asleep with its head (confirmed here); why not, where its mode
        does not take it (it no longer serves)."""
        digest = render.lane_digest(self.config, lane, self.records.systemd_version)
        answer = self.interpreter.post(
            lane, i.RankSlept(level, frozenset(pids), dict(residual), digest)
        )
        return answer.ignored or answer.refused or None

    def note(self, lane: str, kind: EventKind, text: str) -> None:
        """An event of the lane that changes no state (the coordinator's asks)."""
        self.records.book.note(lane, kind, text)

    def wait_ready(self, lane: str) -> asyncio.Future[LaneStatus]:
        """A future that resolves when the lane is ready, or fails with why it will not be."""
        self.spec(lane)
        return self.interpreter.wait_ready(lane)

    def admission(self, lane: str, arrived: float) -> Admission:
        """Whether a request for the lane goes to its engine now, waits, or is refused."""
        return self.scheduler.admission(lane, arrived)

    async def turn(self, lane: str, arrived: float, timeout: float) -> Admission:
        """A waiting request's turn (Scheduler.turn): GO or REFUSE; TimeoutError."""
        return await self.scheduler.turn(lane, arrived, timeout)

    async def flush(self) -> None:
        """What was accepted is on disk (state.json) once this returns."""
        await self.records.writer.flush()

    # --- reading --------------------------------------------------------------------------------

    @property
    def config(self) -> Config:
        """The config laned runs (the last one reload accepted)."""
        return self.records.config

    def spec(self, lane: str) -> LaneConfig:
        """The lane's config; UnknownLane with the known names otherwise."""
        return self.records.spec(lane)

    def engine_spec(self, lane: str) -> LaneConfig:
        """The lane's engine as it runs (Records.engine_spec): where to reach it."""
        return self.records.engine_spec(lane)

    @property
    def statuses(self) -> Mapping[str, LaneStatus]:
        """Every lane's record, read-only (each a snapshot: the lane machine replaces it)."""
        return self.records.book.statuses

    @property
    def events(self) -> Sequence[Event]:
        """Recent events, oldest first."""
        return self.records.book.events

    def timeline(self, since: float) -> list[dict[str, Any]]:
        """Every transition since `since` (a day is kept, across laned's restarts)."""
        return self.records.book.timeline(since)

    def placed(self) -> list[str]:
        """The lanes on the GPUs or on their way there (laned.core.placement)."""
        return self.records.placed()

    def resting(self) -> list[placement.Footprint]:
        """The sleepers that stay asleep, placed by what each kept at its last sleep."""
        return list(self.records.resting().values())

    def placement(self) -> list[placement.GpuPlace]:
        """Each GPU with the lanes placed on it now (laned.core.placement), the sleepers
        there, and what is left, by the GPUs' memory as read at start."""
        r = self.records
        placed = [r.footprints[n] for n in r.placed()] + self.resting()
        return placement.per_gpu(placed, r.gpu_totals)

    async def gpu_holders(self) -> dict[int, str]:
        """Which lane each process on the GPUs is an engine process of (pid -> lane): the
        lanes that run, from their units' cgroups (a container's own too)."""
        r, holders = self.records, {}
        for lane, status in list(r.statuses.items()):
            seen = status.unit
            if lane not in r.config.lanes or seen is None or not seen.running:
                continue
            spec = r.config.lanes[lane]
            try:  # its cgroup as systemd has it now (ControlGroup comes with no signal)
                snap = await self.seam.units.snapshot(unit_name(lane, spec))
            except LanedError:
                continue
            if snap.control_group:
                for pid in await self.seam.containers.engine_pids(lane, spec, snap.control_group):
                    holders[pid] = lane
        return holders

    # --- the host, read (through the seam: the front's one way to it) -------------------------

    def journald_down(self) -> str | None:
        """Why journald does not answer now (one connect to its socket); None when it does."""
        return self.seam.journal.journald_down()

    async def log_lines(self, lane: str, lines: int, source: str = "journal") -> list[str]:
        """The engine's last log lines, from journald or its running container's own log."""
        spec = self.spec(lane)
        if source == "journal":
            return await self.seam.journal.tail(unit_name(lane, spec), lines)
        return await self.seam.containers.container_logs(lane, spec, lines)

    async def container(self, lane: str) -> dict[str, Any] | None:
        """A container lane's container as podman shows it now (None for other lanes)."""
        return await self.seam.containers.container(lane, self.spec(lane))

    async def host_facts(self) -> HostFacts:
        """The host's GPUs and memory as read now."""
        return await self.seam.facts.host_facts()

    async def weights_gib(self, lanes: Sequence[str]) -> dict[str, float | None]:
        """The size of each lane's local weight files."""
        config, pages = self.config, self.seam.pages
        return await asyncio.to_thread(
            lambda: {name: pages.weights_gib(model_path(config.lanes[name])) for name in lanes}
        )

    async def weights_resident(self) -> dict[str, dict[str, Any]]:
        """Each lane with local weight files: its model and how much is in the page cache."""
        config, pages = self.config, self.seam.pages

        def look() -> dict[str, dict[str, Any]]:
            found = {}
            for name, spec in config.lanes.items():
                files = pages.weight_files(model_path(spec))
                if files:
                    found[name] = {"model": model_path(spec), **pages.residency(files).to_json()}
            return found

        return await asyncio.to_thread(look)

    @property
    def notices(self) -> Mapping[str, str]:
        """What laned itself meets or met, by source (/healthz)."""
        return MappingProxyType(self.records.notices)

    def engine_summary(self, lane: str) -> dict[str, float] | None:
        """The engine's load from its /metrics (running lanes only), with tokens/s over a minute."""
        window = self.records.statuses[lane].samples
        if not window or self.records.statuses[lane].state not in policy.RUNNING_STATES:
            return None
        return engine_summary(list(window))

    def listen(self, listener: Listener) -> None:
        """Call `listener` with every new event, until `unlisten`."""
        self.records.book.listeners.append(listener)

    def unlisten(self, listener: Listener) -> None:
        self.records.book.listeners.remove(listener)

    @property
    def recorder(self) -> Recorder:
        """Where what happens is counted (laned's metrics; a no-op by default)."""
        return self.records.recorder

    @recorder.setter
    def recorder(self, recorder: Recorder) -> None:
        self.records.recorder = recorder
