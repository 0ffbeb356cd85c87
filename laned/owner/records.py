"""What the owner keeps: every lane's status (the ledger's), its run record, the unit as
systemd last showed it, the operations under way, notices, and the tasks it runs.

Every part of the owner (laned.owner.supervisor) works on this one object; only the parts
call its mutating methods. The small rules every part shares live here: a new run, a
counted failure, a failed start, the desire of one lane of a group.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field

from laned.adapters import state
from laned.config.groups import group_peers
from laned.config.model import Config, LaneConfig
from laned.config.names import unit_name
from laned.core import policy
from laned.core.lanes import Desired, LaneState, LaneStatus
from laned.core.liveness import EngineSample
from laned.core.recorder import Recorder
from laned.core.unit_state import UnitSnapshot
from laned.owner.ledger import Ledger
from laned.owner.operations import Operations

log = logging.getLogger("laned.supervisor")


@dataclass
class LaneRun:
    """What the owner keeps of a lane's runs, besides its LaneStatus: one record per lane."""

    number: int = 0  # each start adds one: reports about an older run are dropped
    spec: LaneConfig | None = None  # the config the current run started with (reload: kept)
    started_at: float | None = None  # when the current run started
    ready_at: float = 0.0  # when the lane last became ready
    follow: asyncio.Task[None] | None = None  # the watcher of the current run
    restart: asyncio.TimerHandle | None = None  # a restart after a failure, waiting
    poke: asyncio.Event = field(default_factory=asyncio.Event)  # look again now
    samples: deque[tuple[float, EngineSample]] = field(default_factory=deque)  # /metrics, 60 s
    # The run whose failure is counted already, and what saw it: a run fails once,
    # whichever path (its exit, health probes, a stall, a timeout) saw it first.
    failed: tuple[int, str] | None = None
    stopping: bool = False  # a stop laned asked for is under way
    check_degraded: bool = False  # degraded by a failed check, still serving
    waking: bool = False  # the current run is a wake from sleep, not a cold start
    woke: bool = False  # the current run became ready from a wake (its swap-in cost)
    checking: int = 0  # acceptance checks running against it now (they keep it busy)
    sleepers: frozenset[int] = frozenset()  # asleep: its engine's processes (the GPU gate)
    slept_as: str = ""  # asleep: the digest of its unit and wrapper when it went to sleep
    slept_level: int = 0  # asleep: the level it sleeps at (0: its own, not known better)
    pinned: bool = False  # its engine slept at level 1: it keeps those pinned buffers (fit.py)
    residual: dict[int, int] = field(default_factory=dict)  # GPU index -> bytes, its last sleep


class Records:
    """The owner's state, one object for all its parts."""

    def __init__(self, config: Config, clock: Callable[[], float], systemd_version: int) -> None:
        self.config, self.clock, self.systemd_version = config, clock, systemd_version
        self.units = {unit_name(n, spec): n for n, spec in config.lanes.items()}  # unit -> lane
        self.writer = state.StateWriter(
            config.daemon.state_dir,
            lambda: self.ledger.saved(),
            lambda why: self.trouble("state.json", why),
        )
        self.ledger = Ledger(config.lanes, clock, self.writer.mark)
        self._recorder = Recorder()
        self.ops = Operations(self._recorder)
        self.notices: dict[str, str] = {}  # what laned itself meets, by source (/healthz)
        self.snapshots: dict[str, UnitSnapshot] = {}  # each lane's unit, as last seen
        self.runs = {name: LaneRun() for name in config.lanes}
        self.closing = False
        self._tasks: set[asyncio.Task[None]] = set()

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
        run, spec = self.runs.get(lane), self.spec(lane)
        if run is None or run.spec is None or self.statuses[lane].state in policy.SETTLED_STATES:
            return spec
        return run.spec

    def serving(self, lane: str) -> bool:
        """Ready, or degraded only by a failed acceptance check (it still serves; watch it)."""
        now = self.statuses[lane].state
        return now is LaneState.READY or (
            now is LaneState.DEGRADED and self.runs[lane].check_degraded
        )

    def counted(self, lane: str) -> str | None:
        """What counted the current run's failure already (None: not counted yet)."""
        run, seen_by = self.runs[lane].failed or (-1, "")
        return seen_by if run == self.runs[lane].number else None

    # --- the rules every part shares ----------------------------------------------------------

    def trouble(self, source: str, why: str | None) -> None:
        """What laned meets of `source` (the user manager, journald, the state file), shown
        in /healthz until it is over (None)."""
        if why is None:
            self.notices.pop(source, None)
        else:
            self.notices[source] = why

    def desire_only(self, lane: str) -> None:
        """`lane` desired active and its group peers not."""
        for peer in group_peers(self.config, lane):
            self.ledger.desire(peer, Desired.INACTIVE)
        self.ledger.desire(lane, Desired.ACTIVE)

    def begin_start(self, lane: str) -> None:
        """A new run of the lane: its number, its clock and its phase timeline begin again."""
        now, run, status = self.clock(), self.runs[lane], self.statuses[lane]
        run.number += 1
        run.spec = self.config.lanes[lane]
        run.started_at = status.started_at = now
        run.check_degraded = run.waking = False
        status.phases, status.notes = [], []

    def cancel_restart(self, lane: str) -> None:
        timer, self.runs[lane].restart = self.runs[lane].restart, None
        if timer is not None:
            timer.cancel()

    def count_failure(self, lane: str, seen_by: str, what: str) -> policy.Counted | None:
        """Count the current run's failure, seen first by a path other than its exit
        (`seen_by`: health, stalled, start-timeout, memory-guard; `what` it saw); None when
        it was counted already."""
        if self.counted(lane) is not None:
            return None
        status = self.statuses[lane]
        counted = policy.count_failure(self.config.lanes[lane], status.failures, self.clock(), what)
        status.failures[:] = counted.failures
        self.runs[lane].failed = (self.runs[lane].number, what)
        self.recorder.failure(lane, seen_by)
        self.writer.mark()
        return counted

    def sleepers(self) -> frozenset[int]:
        """The processes of every sleeping lane: their residual GPU memory stays."""
        asleep = [n for n, s in self.statuses.items() if s.state is LaneState.SLEEPING]
        return frozenset().union(*(self.runs[n].sleepers for n in asleep))

    def to_sleep(self, lane: str) -> dict[str, dict[int, int]]:
        """The peers an activation of `lane` would put to sleep (they sleep and serve now),
        with what each kept on its GPUs at its last sleep ({}: not measured yet)."""
        return {
            peer: dict(self.runs[peer].residual)
            for peer in group_peers(self.config, lane)
            if self.config.lanes[peer].sleep_level and self.serving(peer)
        }

    def fail_start(self, lane: str, reason: str) -> None:
        """The lane is failed; whoever waits for it to be ready hears why."""
        self.ledger.transition(lane, LaneState.FAILED, reason)
        self.ledger.fail_waiters(lane, reason)

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
        for run in self.runs.values():
            if run.restart is not None:
                run.restart.cancel()
        follows = [run.follow for run in self.runs.values() if run.follow]
        tasks = [*self._tasks, *follows, *self.ops.cancel_all()]
        for task in tasks:
            task.cancel()
        return tasks
