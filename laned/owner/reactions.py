"""The owner's reactions to what systemd, the watchers and the checks report of a lane's run.

`Supervisor` extends this class with the requests and operations: one owner, split by what
starts the work. A report is handled on the owner's loop, judged by `laned.core.policy`, acted on
here; a report about an older run of the lane (its run number) is dropped.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine

from laned.adapters import state
from laned.adapters.host import Host
from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.config.model import Config, LaneConfig
from laned.config.names import exit_record_path, unit_name
from laned.core import exits, policy
from laned.core.lanes import (
    Desired,
    Event,
    EventKind,
    LaneState,
    LaneStatus,
    LastExit,
    Verdict,
    phase_durations,
)
from laned.core.liveness import engine_summary
from laned.core.phases import ALMOST_READY, Seen, add_mark
from laned.core.policy import ExitAction, OpKind, RestartKind
from laned.core.recorder import Recorder
from laned.core.unit_state import UnitSnapshot
from laned.errors import LanedError
from laned.owner import steps, watchers
from laned.owner.bus import BusKeeper
from laned.owner.ledger import Ledger, Listener
from laned.owner.operations import Operations
from laned.owner.outages import Outages
from laned.owner.runs import LaneRun
from laned.owner.serving import Serving
from laned.owner.traffic import Traffic
from laned.render import plan as render
from laned.render.units import RESTART_STEPS_SINCE

log = logging.getLogger("laned.supervisor")


class Reactions(Outages, Serving):
    """The owner's state and its handlers for what happens to a lane's run."""

    def __init__(
        self,
        config: Config,
        systemd: Systemd,
        probe: Probe,
        systemd_version: int = render.DEFAULT_SYSTEMD_VERSION,
        host: Host | None = None,  # podman and NVML: preflight, the GPU gate, containers
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.config, self.systemd, self.probe, self.host = config, systemd, probe, host
        self.systemd_version, self.clock = systemd_version, clock
        self.systemd_restarts = systemd_version >= RESTART_STEPS_SINCE
        self._recorder = Recorder()
        self.units = {unit_name(n, spec): n for n, spec in config.lanes.items()}
        self.writer = state.StateWriter(
            config.daemon.state_dir, lambda: self.ledger.saved(), self._state_trouble
        )
        self.ledger = Ledger(config.lanes, clock, self.writer.mark)
        self.ops = Operations(self._recorder)
        self.traffic = Traffic()  # laned's OpenAI endpoint counts its requests here
        self.notices: dict[str, str] = {}  # what laned itself meets, by source (/healthz)
        self.bus = BusKeeper(
            systemd, lambda: self.units, self._on_unit_change, self._on_resync, self._bus_trouble
        )
        self.snapshots: dict[str, UnitSnapshot] = {}
        self.runs = {name: LaneRun() for name in config.lanes}  # one record per lane
        self._tasks: set[asyncio.Task[None]] = set()
        self._log_task: asyncio.Task[None] | None = None
        self._closing = False

    # --- reading ------------------------------------------------------------------------------

    @property
    def statuses(self) -> dict[str, LaneStatus]:
        """Every lane's status (read-only for everyone but this class)."""
        return self.ledger.statuses

    @property
    def events(self) -> deque[Event]:
        """Recent events, oldest first."""
        return self.ledger.events

    @property
    def listeners(self) -> list[Listener]:
        """Called with every new event."""
        return self.ledger.listeners

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

    def engine_summary(self, lane: str) -> dict[str, float] | None:
        """The engine's load from its /metrics (running lanes only), with tokens/s over a minute."""
        window = self.runs[lane].samples
        if not window or self.statuses[lane].state not in policy.RUNNING_STATES:
            return None
        return engine_summary(list(window))

    # --- what systemd tells ---------------------------------------------------------------------

    def _on_unit_change(self, unit: str, props: dict[str, object]) -> None:
        lane = self.units.get(unit)
        if lane is None or self._closing:
            return
        self._apply(lane, self.snapshots.get(lane, UnitSnapshot(unit)).update(props))

    def _apply(self, lane: str, snap: UnitSnapshot) -> None:
        """Compare a lane unit's new state with the last one seen and act on the difference."""
        previous = self.snapshots.get(lane, UnitSnapshot(snap.name))
        self.snapshots[lane] = snap
        op = self.ops.of(self.config.lanes[lane].group)
        by_laned = self.runs[lane].restart is not None or (
            op is not None and op.lane == lane and op.kind is not OpKind.DEACTIVATE
        )
        change = policy.judge_unit_change(previous, snap, self.statuses[lane].state, by_laned)
        if change is policy.UnitChange.EXITED:
            self._on_exit(lane, snap)
        elif change is policy.UnitChange.STARTED_OUTSIDE:
            self._desire_only(lane)
            self._begin_start(lane)
            self.ledger.transition(lane, LaneState.STARTING, "started outside laned")
            self._start_follow(lane)

    def _on_exit(self, lane: str, snap: UnitSnapshot, facts: exits.ExitFacts | None = None) -> None:
        spec, status, now = self.config.lanes[lane], self.statuses[lane], self.clock()
        if facts is None:
            record = steps.read_exit_record(exit_record_path(self.config, lane))
            facts = exits.exit_facts(record, self.runs[lane].started_at or 0, snap)
        counted = self._counted(lane)
        plan = policy.plan_exit(
            spec,
            facts,
            stopping_by_laned=self.runs[lane].stopping,
            state=status.state,
            desired=status.desired,
            failures=status.failures,
            now=now,
            systemd_restarts=self.systemd_restarts,
            sub_state=snap.sub_state,
            counted=counted,
            ready_at=self.runs[lane].ready_at,
        )
        why = plan.reason if plan.verdict is Verdict.FAILURE else ""
        status.last_exit = LastExit(
            facts.code, facts.signal, now, plan.verdict, facts.oom_killed, why
        )
        self.recorder.exit(lane, facts.code, facts.signal, plan.verdict.value)
        self._stop_follow(lane)
        if plan.verdict is Verdict.FAILURE and counted is None:
            self.runs[lane].failed = (self.runs[lane].number, "its exit")
            self.recorder.failure(lane, "exit")
        if plan.action is ExitAction.OWN_STOP:
            if plan.verdict is Verdict.FAILURE:
                status.failures[:] = plan.failures
                self.ledger.note(lane, EventKind.EXIT, plan.reason)
            self.writer.mark()
            return  # laned's own stop: the operation makes the transition
        if plan.action is ExitAction.STOPPED_OUTSIDE:
            self._spawn(self._stopped_outside(lane, plan.reason))
            return
        status.failures[:] = plan.failures
        if plan.action is ExitAction.SYSTEMD_RESTARTS:
            status.restarts = max(status.restarts + 1, snap.n_restarts)
            self.recorder.restart(lane, RestartKind.FAILURE.value)
            self.ledger.transition(lane, LaneState.RESTARTING, plan.reason)
            self._begin_start(lane)
            self._start_follow(lane)
        elif plan.action is ExitAction.RESTART_LATER:
            self.ledger.transition(lane, LaneState.RESTARTING, plan.reason)
            self._cancel_restart(lane)
            loop = asyncio.get_running_loop()
            self.runs[lane].restart = loop.call_later(plan.delay, self._restart_after_failure, lane)
        else:  # FAIL (not desired) or CRASH_LOOP
            self.ledger.transition(lane, LaneState.FAILED, plan.reason)
            if plan.action is ExitAction.CRASH_LOOP:
                self.ledger.fail_waiters(lane, plan.reason)

    def _counted(self, lane: str) -> str | None:
        """What counted the current run's failure already (None: not counted yet)."""
        run, seen_by = self.runs[lane].failed or (-1, "")
        return seen_by if run == self.runs[lane].number else None

    def _count_failure(self, lane: str, seen_by: str, what: str) -> policy.Counted | None:
        """Count the current run's failure, seen first by a path other than its exit
        (`seen_by`: health, stalled, start-timeout, memory-guard; `what` it saw); None when
        it was counted already."""
        if self._counted(lane) is not None:
            return None
        status = self.statuses[lane]
        counted = policy.count_failure(self.config.lanes[lane], status.failures, self.clock(), what)
        status.failures[:] = counted.failures
        self.runs[lane].failed = (self.runs[lane].number, what)
        self.recorder.failure(lane, seen_by)
        self.writer.mark()
        return counted

    async def _stopped_outside(self, lane: str, what: str) -> None:
        """A stop laned did not ask for: an operator's, unless the whole manager is going down."""
        try:
            stopping = await self.systemd.system_state() == "stopping"
        except LanedError:
            stopping = True  # the manager is unreachable: most likely on its way down
        snap = self.snapshots.get(lane)
        if lane not in self.statuses or self._closing or (snap is not None and snap.running):
            return  # gone from the config, laned is stopping, or it was started again meanwhile
        if stopping:
            # Logout, reboot or `systemctl --user exit`: the lane should come back with laned.
            self.ledger.transition(
                lane, LaneState.INACTIVE, f"stopped with the user manager ({what})"
            )
            return
        self.ledger.desire(lane, Desired.INACTIVE)
        self.ledger.transition(lane, LaneState.INACTIVE, f"stopped outside laned ({what})")
        self.ledger.fail_waiters(lane, "stopped outside laned")

    # --- what the watchers observe -----------------------------------------------------------------

    def _start_follow(self, lane: str) -> None:
        self._stop_follow(lane)
        task = asyncio.get_running_loop().create_task(
            self._follow_lane(lane, self.runs[lane].number)
        )
        task.add_done_callback(self._task_done)
        self.runs[lane].follow = task

    def _stop_follow(self, lane: str) -> None:
        task, self.runs[lane].follow = self.runs[lane].follow, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _follow_lane(self, lane: str, run: int) -> None:
        """Readiness (fast probing backing off over a long cold start), then liveness."""
        spec = self.config.lanes[lane]
        report = functools.partial(self._observe, lane, run)
        poke = self.runs[lane].poke
        expected = self.statuses[lane].last_cold_start
        if not await watchers.await_ready(self.probe, spec, poke, report, expected):
            return
        image = await steps.running_image(self.host, lane, spec)
        if report(watchers.Ready(image)):
            await watchers.watch_liveness(self.probe, spec, report)

    def _observe(self, lane: str, run: int, seen: watchers.Observation) -> bool:
        """A watcher's report on one run of the lane; True: go on watching."""
        if self._closing or lane not in self.statuses or self.runs[lane].number != run:
            return False
        if isinstance(seen, watchers.Ready):
            return self._became_ready(lane, seen.image_id)
        if isinstance(seen, watchers.Tick):
            return self._serving(lane)
        if isinstance(seen, watchers.Sampled):
            window = self.runs[lane].samples
            window.append((seen.at, seen.sample))
            while window and window[0][0] < seen.at - 60:
                window.popleft()
            return True
        if isinstance(seen, watchers.ProbeFailed):
            self.recorder.probe_failure(lane)
            if seen.failures < seen.limit:
                return True
            reason = f"health: {seen.failures} consecutive probe failures"
            self._degrade(lane, reason, RestartKind.HEALTH)
        elif isinstance(seen, watchers.Stalled):
            self.recorder.stall(lane)
            s = seen.sample
            reason = f"stalled: {s.running:g} running, {s.waiting:g} waiting and no token for {seen.after:g}s"
            self._degrade(lane, reason, RestartKind.STALLED)
        elif isinstance(seen, (watchers.StartTimedOut, watchers.MemoryLow)):
            if isinstance(seen, watchers.StartTimedOut):
                seen_by, reason = (
                    "start-timeout",
                    f"start-timeout: not ready within {seen.after:g}s",
                )
            else:
                seen_by = "memory-guard"
                reason = f"memory-guard: MemAvailable {seen.available_gib:.1f} GiB below the floor"
            # The run failed: its exit, which follows laned's stop, is this failure's end.
            self._count_failure(lane, seen_by, reason)
            self._spawn(self._give_up(lane, run, reason))
        return False

    def _became_ready(self, lane: str, image_id: str | None) -> bool:
        spec, status = self.config.lanes[lane], self.statuses[lane]
        if status.state is not LaneState.STARTING:
            return False
        now = self.clock()
        started = self.runs[lane].started_at
        status.last_cold_start = round(now - (now if started is None else started), 3)
        self.recorder.cold_start(lane, status.last_cold_start)
        if status.phases:
            status.last_phases = dict(phase_durations(status.phases, now))
        if image_id:
            status.image_id = image_id  # of a good start: a different one later is drift
        # The failures stay: an engine that dies after each good start is a crash loop too;
        # they leave the window after start_limit_interval (or at the next activate). The
        # backoff starts again from here.
        self.runs[lane].ready_at = now
        self.ledger.transition(
            lane, LaneState.READY, "health 200 and /v1/models lists " + spec.served_model_name
        )
        if spec.checks.after_activate:
            self._spawn(self._auto_check(lane))
        return True

    def _serving(self, lane: str) -> bool:
        """Ready, or degraded only by a failed acceptance check (it still serves; watch it)."""
        now = self.statuses[lane].state
        return now is LaneState.READY or (
            now is LaneState.DEGRADED and self.runs[lane].check_degraded
        )

    def _degrade(self, lane: str, reason: str, kind: RestartKind) -> None:
        """The engine stopped serving (failed probes, a stall): one failure of this run,
        then a restart, or the end of a crash loop."""
        self.ledger.transition(lane, LaneState.DEGRADED, reason)
        counted = self._count_failure(lane, kind.value, reason)
        if counted is not None and counted.crash_loop:
            self._spawn(self._give_up(lane, self.runs[lane].number, counted.reason))
            return
        self._restart(lane, reason, kind)

    def _phase_seen(self, unit: str, seen: Seen, at: float) -> None:
        lane = self.units.get(unit)
        status = self.statuses.get(lane) if lane else None
        if lane is None or status is None or at < (status.started_at or 0):
            return  # not a lane's, or an earlier run's
        # journald can hand a line over after the engine already answered (a container's
        # output arrives in bursts): what it said of this start is still this start's.
        if seen.note and seen.note not in status.notes and status.state in policy.HOLDING_STATES:
            status.notes.append(seen.note)
            self.ledger.note(lane, EventKind.STARTUP, seen.note)
        if seen.phase is None or status.state not in policy.HOLDING_STATES:
            return
        # A bar reaches the journal when it closes: it began its elapsed time before.
        since = max(at - (seen.elapsed or 0.0), status.started_at or 0)
        if status.state is LaneState.STARTING:
            status.phase, status.progress = seen.phase, seen.progress
            status.phases = add_mark(status.phases, seen.phase, since)
            if seen.phase in ALMOST_READY:
                self.runs[lane].poke.set()
        elif status.started_at is not None and status.last_cold_start is not None:
            ready_at = status.started_at + status.last_cold_start
            if since < ready_at:  # late, but of this start: its timeline gets it
                status.phases = add_mark(status.phases, seen.phase, since)
                status.last_phases = dict(phase_durations(status.phases, ready_at))

    # --- small helpers -----------------------------------------------------------------------------

    def _desire_only(self, lane: str) -> None:
        """`lane` desired active and its group peers not."""
        for peer in policy.peers(self.config, lane):
            self.ledger.desire(peer, Desired.INACTIVE)
        self.ledger.desire(lane, Desired.ACTIVE)

    def _begin_start(self, lane: str) -> None:
        """A new run of the lane: its number, its clock and its phase timeline begin again."""
        now = self.clock()
        self.runs[lane].number += 1
        self.runs[lane].started_at = now
        self.statuses[lane].started_at = now
        self.statuses[lane].phases = []
        self.statuses[lane].notes = []
        self.runs[lane].check_degraded = False

    def _cancel_restart(self, lane: str) -> None:
        timer, self.runs[lane].restart = self.runs[lane].restart, None
        if timer is not None:
            timer.cancel()

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed: %r", task.exception())

    # --- what the subclass (the requests' side) provides ---------------------------------------

    def _restart(self, lane: str, reason: str, kind: RestartKind, force: bool = False) -> None:
        """Restart a desired lane as an operation of its group (see Supervisor)."""
        raise NotImplementedError

    def _restart_after_failure(self, lane: str) -> None:
        """Start the lane again once its backoff is over (see Supervisor)."""
        raise NotImplementedError

    async def _give_up(self, lane: str, run: int, reason: str) -> None:
        """Stop the lane and leave it failed (see Supervisor)."""
        raise NotImplementedError
