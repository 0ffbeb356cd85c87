"""What the owner keeps beside the lanes' records: the config and the units it names, the
unit of each lane as systemd last showed it, notices, the tasks it runs, and the views over
the book that every part shares (where each lane is placed, what an activation takes off,
which lanes are busy). The lanes' records themselves are the book's (laned.owner.book), and
only the lane machine's runner replaces them (laned.owner.interpreter).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Coroutine

from laned.config.model import Config, LaneConfig
from laned.config.names import unit_name, weights_unit_name
from laned.core import placement, policy
from laned.core.lanes import Desired, LaneState, LaneStatus
from laned.core.recorder import Recorder
from laned.engines.footprints import footprints
from laned.owner.book import Book
from laned.owner.seam import StateStore
from laned.render.wrapper import weights_digest

log = logging.getLogger("laned.supervisor")


class Records:
    """The owner's state beside the lanes' records, one object for all its parts."""

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
            lambda: self.book.saved(),
            lambda why: self.trouble("state.json", why),
        )
        self.book = Book(config.lanes, clock, self.writer.mark)
        self._recorder = Recorder()
        self.notices: dict[str, str] = {}  # what laned itself meets, by source (/healthz)
        self.closing = False
        self._tasks: set[asyncio.Task[None]] = set()

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

    # --- reading ------------------------------------------------------------------------------

    @property
    def statuses(self) -> dict[str, LaneStatus]:
        """Every lane's record (read-only: the book's)."""
        return self.book.statuses  # type: ignore[return-value]

    @property
    def recorder(self) -> Recorder:
        """Where what happens is counted (laned's metrics; a no-op by default)."""
        return self._recorder

    @recorder.setter
    def recorder(self, recorder: Recorder) -> None:
        self._recorder = recorder

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
        return self.statuses[lane].serving

    def busy(self, lanes: Collection[str]) -> bool:
        """Whether a request works on any of `lanes` (its own, or an activation taking it off)."""
        for name, status in self.statuses.items():
            op = status.op
            if op is not None and (name in lanes or set(op.evicts) & set(lanes)):
                return True
        return False

    # --- the rules every part shares ----------------------------------------------------------

    def trouble(self, source: str, why: str | None) -> None:
        """What laned meets of `source` (the user manager, journald, the state file), shown
        in /healthz until it is over (None)."""
        if why is None:
            self.notices.pop(source, None)
        else:
            self.notices[source] = why

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
            name: placement.Footprint.asleep(
                name, dict(status.residual), self.config.lanes[name].port
            )
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

    def sleepers(self, but: Collection[str] = ()) -> frozenset[int]:
        """The processes of every sleeping lane (`but` those an activation stops): their
        residual GPU memory stays."""
        pids: set[int] = set()
        for name, s in self.statuses.items():
            if s.state is LaneState.SLEEPING and name not in but and s.asleep is not None:
                pids |= s.asleep.pids
        return frozenset(pids)

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
        """Closing: every task cancelled; the tasks, to wait for."""
        self.closing = True
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        return tasks
