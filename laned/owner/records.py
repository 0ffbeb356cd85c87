"""What the owner keeps: every lane's record (the ledger's: the lane machine's runner), the
unit as systemd last showed it, the operations under way, notices, the tasks it runs, and
each run's watcher and waiting restart (the machine's `Hands`).

Every part of the owner (laned.owner.supervisor) works on this one object; only the parts
call its methods. The small rules every part shares live here: an event fired with the
lane's config, a counted failure, where each lane is placed and what an activation takes off.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine

from laned.config.model import Config, LaneConfig
from laned.config.names import unit_name, weights_unit_name
from laned.core import placement, policy
from laned.core.footprints import footprints
from laned.core.lanes import Desired, LaneState, LaneStatus
from laned.core.machine import SERVING_MODES, Ev
from laned.core.recorder import Recorder
from laned.core.unit_state import UnitSnapshot
from laned.owner.ledger import Ledger
from laned.owner.operations import Operations
from laned.owner.seam import StateStore
from laned.render.wrapper import weights_digest

log = logging.getLogger("laned.supervisor")


class Records:
    """The owner's state, one object for all its parts."""

    def __init__(
        self,
        config: Config,
        clock: Callable[[], float],
        systemd_version: int,
        store: StateStore,
    ) -> None:
        """`store`: laned's state files (state.json is written through it)."""
        self.config, self.clock, self.systemd_version = config, clock, systemd_version
        self.units: dict[str, str] = {}  # unit -> lane
        self.weights_digests: dict[str, str] = {}  # lane -> what its daemon loads
        self.weights_units: dict[str, str] = {}  # weight-cache daemon's unit -> lane
        self.footprints: dict[str, placement.Footprint] = {}  # what each lane takes of its GPUs
        self.gpu_totals: placement.Totals | None = None  # the host's GPUs (None: not known)
        # The requests a lane has waiting or in flight (laned.owner.traffic), for what
        # taking it off costs.
        self.load: Callable[[str], int] = lambda lane: 0
        self.name_units(config)
        self.writer = store.writer(
            config.daemon.state_dir,
            lambda: self.ledger.saved(),
            lambda why: self.trouble("state.json", why),
        )
        self.ledger = Ledger(config.lanes, clock, self.writer.mark, hands=self)
        self._recorder = Recorder()
        self.ops = Operations(self._recorder)
        self.notices: dict[str, str] = {}  # what laned itself meets, by source (/healthz)
        self.snapshots: dict[str, UnitSnapshot] = {}  # each lane's unit, as last seen
        self.closing = False
        self._tasks: set[asyncio.Task[None]] = set()
        # The machine's hands: each run's watcher, each restart waiting, each lane's "look
        # again now"; what they run is bound by the supervisor (`bind`).
        self.follows: dict[str, asyncio.Task[None]] = {}
        self.restarts: dict[str, asyncio.TimerHandle] = {}
        self.pokes: dict[str, asyncio.Event] = {}
        self.alarms: dict[str, asyncio.Event] = {}
        self._watch: Callable[[str, int], Coroutine[object, object, None]] | None = None
        self._restart: Callable[[str], None] | None = None

    def name_units(self, config: Config) -> None:
        """The lanes' units and their weight-cache daemons', by name (at start, at reload)."""
        self.units = {unit_name(n, spec): n for n, spec in config.lanes.items()}
        self.weights_units = {
            weights_unit_name(n, spec): n
            for n, spec in config.lanes.items()
            if spec.weight_cache is not None
        }
        # What each daemon loads as the config renders it (its wrapper's digest).
        self.weights_digests = {n: weights_digest(config, n) for n in self.weights_units.values()}
        self.footprints = footprints(config.lanes)

    def all_units(self) -> dict[str, str]:
        """Every unit laned keeps loaded and follows: the lanes' and their daemons'."""
        return {**self.units, **self.weights_units}

    def bind(
        self,
        watch: Callable[[str, int], Coroutine[object, object, None]],
        restart: Callable[[str], None],
    ) -> None:
        """What a FOLLOW runs (`watch(lane, run)`) and what a restart's timer calls."""
        self._watch, self._restart = watch, restart

    # --- reading ------------------------------------------------------------------------------

    @property
    def statuses(self) -> dict[str, LaneStatus]:
        return self.ledger.statuses

    @property
    def recorder(self) -> Recorder:
        """Where what happens is counted (laned's metrics; a no-op by default)."""
        return self._recorder

    @recorder.setter
    def recorder(self, recorder: Recorder) -> None:
        self._recorder = self.ops.recorder = recorder

    def spec(self, lane: str) -> LaneConfig:
        """The lane's config; UnknownLane with the known names otherwise."""
        return self.config.lane(lane)

    def engine_spec(self, lane: str) -> LaneConfig:
        """The config of the lane's engine as it runs: what its current run started with
        while its process may be there (any state but inactive or failed: a reload's new
        port, model name or container name waits for its next start), else the lane's
        config."""
        status, spec = self.statuses.get(lane), self.spec(lane)
        if status is None or status.spec is None or status.state in policy.SETTLED_STATES:
            return spec
        return status.spec

    def serving(self, lane: str) -> bool:
        """Ready, or degraded by a failed check or a peer out of reach (it still serves)."""
        return self.statuses[lane].mode in SERVING_MODES

    def counted(self, lane: str) -> str | None:
        """What counted the current run's failure already (None: not counted yet)."""
        status = self.statuses[lane]
        run, seen_by = status.failed or (-1, "")
        return seen_by if run == status.run else None

    def fire(self, lane: str, event: Ev, reason: str, delay: float = 0.0) -> bool:
        """The lane machine's `event` for `lane` (Ledger.fire), a new run with its config."""
        return self.ledger.fire(lane, event, reason, self.config.lanes.get(lane), delay)

    def poke(self, lane: str) -> asyncio.Event:
        """The lane's "look again now" for its readiness watcher."""
        return self.pokes.setdefault(lane, asyncio.Event())

    def alarm(self, lane: str) -> asyncio.Event:
        """The lane's "its engine says it is dying" for its liveness watcher."""
        return self.alarms.setdefault(lane, asyncio.Event())

    # --- the machine's hands (laned.owner.ledger.Hands) ---------------------------------------

    def follow(self, lane: str) -> None:
        """Watch the lane's current run: readiness, then liveness (the bound `watch`)."""
        self.unfollow(lane)
        if self._watch is None:
            return
        task = asyncio.get_running_loop().create_task(self._watch(lane, self.statuses[lane].run))
        task.add_done_callback(self.task_done)
        self.follows[lane] = task

    def unfollow(self, lane: str) -> None:
        task = self.follows.pop(lane, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def watching(self, lane: str) -> bool:
        """A watcher follows the lane's run now."""
        task = self.follows.get(lane)
        return task is not None and not task.done()

    def cancel_restart(self, lane: str) -> None:
        timer = self.restarts.pop(lane, None)
        if timer is not None:
            timer.cancel()

    def schedule_restart(self, lane: str, delay: float) -> None:
        if self._restart is not None:
            loop = asyncio.get_running_loop()
            self.restarts[lane] = loop.call_later(delay, self._restart, lane)

    def restart_waiting(self, lane: str) -> bool:
        """A restart after a failure waits for its backoff."""
        return lane in self.restarts

    # --- the rules every part shares ----------------------------------------------------------

    def trouble(self, source: str, why: str | None) -> None:
        """What laned meets of `source` (the user manager, journald, the state file), shown
        in /healthz until it is over (None)."""
        if why is None:
            self.notices.pop(source, None)
        else:
            self.notices[source] = why

    def desire_only(self, lane: str, off: Collection[str]) -> None:
        """`lane` desired active and the lanes it takes off (`off`) not."""
        for peer in off:
            self.ledger.desire(peer, Desired.INACTIVE)
        self.ledger.desire(lane, Desired.ACTIVE)

    def placed(self, but: str = "") -> list[str]:
        """The lanes on the GPUs or on their way there: desired active (a failed one too: an
        activation of it may be under way, and taking it off costs nothing), or holding them.
        Sleeping lanes that stay asleep are placed by what they keep (`resting`)."""
        return sorted(
            name
            for name, status in self.statuses.items()
            if name != but
            and name in self.config.lanes
            and (status.desired is Desired.ACTIVE or status.state in policy.HOLDING_STATES)
        )

    def resting(self, but: str = "") -> dict[str, placement.Footprint]:
        """The sleeping lanes that stay asleep (not desired: none is on its way to a wake),
        each placed by the GPU memory it kept at its last sleep. One whose residual was not
        measured (found asleep at laned's start), or on a host whose GPUs are not known, is
        left to the start gate, which counts what it holds."""
        if self.gpu_totals is None:
            return {}
        return {
            name: placement.Footprint.asleep(name, status.residual, self.config.lanes[name].port)
            for name, status in sorted(self.statuses.items())
            if name != but
            and name in self.config.lanes
            and status.state is LaneState.SLEEPING
            and status.desired is not Desired.ACTIVE
            and status.residual
        }

    def evictions(self, lane: str) -> placement.Eviction:
        """The lanes an activation of `lane` takes off now, each with why: of the lanes
        placed, and of the sleepers whose residual memory leaves it no room (those stop)."""
        fps = self.footprints
        placed = [fps[n] for n in self.placed(but=lane)] + list(self.resting(but=lane).values())
        costs = {fp.lane: self.eviction_cost(fp.lane) for fp in placed}
        return placement.evictions(fps[lane], placed, self.gpu_totals, costs)

    def eviction_cost(self, lane: str) -> float:
        """What taking the lane off costs (laned.core.placement.cost): the swap back in it
        would need (a sleeper taken off needs a cold start, not a wake)."""
        spec, status = self.config.lanes[lane], self.statuses[lane]
        if status.state is LaneState.FAILED:
            return 0.0  # it holds nothing; taking it off acknowledges its failure
        asleep = status.state is LaneState.SLEEPING
        start = status.last_wake if status.woke and not asleep else status.last_cold_start
        return placement.cost(start, self.load(lane), spec.priority, spec.pinned)

    def count_failure(self, lane: str, seen_by: str, what: str) -> policy.Counted | None:
        """Count the current run's failure, seen first by a path other than its exit
        (`seen_by`: health, stalled, start-timeout, memory-guard; `what` it saw); None when
        it was counted already."""
        if self.counted(lane) is not None:
            return None
        status = self.statuses[lane]
        counted = policy.count_failure(self.config.lanes[lane], status.failures, self.clock(), what)
        self.ledger.failure_counted(lane, counted.failures, what)
        self.recorder.failure(lane, seen_by)
        return counted

    def sleepers(self, but: Collection[str] = ()) -> frozenset[int]:
        """The processes of every sleeping lane (`but` those an activation stops): their
        residual GPU memory stays."""
        asleep = [
            s
            for name, s in self.statuses.items()
            if s.state is LaneState.SLEEPING and name not in but
        ]
        return frozenset().union(*(s.sleepers for s in asleep))

    def to_sleep(self, lane: str) -> dict[str, dict[int, int]]:
        """The lanes an activation of `lane` would put to sleep (they sleep and serve now),
        with what each kept on its GPUs at its last sleep ({}: not measured yet)."""
        return {
            peer: dict(self.statuses[peer].residual)
            for peer in self.evictions(lane).lanes
            if self.config.lanes[peer].sleep_level and self.serving(peer)
        }

    # --- tasks --------------------------------------------------------------------------------

    def spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        """Run `coro` as the owner's task: kept until done, cancelled at close, a failure logged."""
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self.task_done)
        return task

    def task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed: %r", task.exception())

    def cancel_all(self) -> list[asyncio.Task[None]]:
        """Closing: every waiting restart and every task cancelled (its own, the watchers',
        the operations'); the tasks, to wait for."""
        self.closing = True
        for timer in self.restarts.values():
            timer.cancel()
        tasks = [*self._tasks, *self.follows.values(), *self.ops.cancel_all()]
        for task in tasks:
            task.cancel()
        return tasks
