"""The owner's reactions to what happens to a lane's run: its unit's changes as systemd
reports them, its exit, what the watchers observe (ready, failed probes, a stall, a start
that takes too long, memory running low), its startup phases from the journal, and a peer
rank out of reach.

Each report is handled on the owner's loop, judged by `laned.core.policy` and
`laned.core.exits`, and acted on here; a report about an older run of the lane (its run
number) is dropped. What needs an operation (a restart, giving up) is asked of the
requests' side through `Restarts`. A part of the owner (laned.owner.supervisor).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine
from typing import Protocol

from laned.adapters.host import Host
from laned.adapters.probes import Probe
from laned.adapters.systemd import Systemd
from laned.config.names import exit_record_path
from laned.core import canary, exits, policy
from laned.core.lanes import Desired, EventKind, LaneState, LastExit, Verdict, phase_durations
from laned.core.phases import ALMOST_READY, Seen, add_mark
from laned.core.policy import ExitAction, OpKind, RestartKind
from laned.core.unit_state import UnitSnapshot, systemd_restarts
from laned.errors import LanedError
from laned.owner import steps, watchers
from laned.owner.checks import Checks
from laned.owner.records import Records
from laned.render import plan as render

log = logging.getLogger("laned.supervisor")


class Restarts(Protocol):
    """What the reactions ask of the requests' side (laned.owner.requests.Requests)."""

    def restart_lane(self, lane: str, reason: str, kind: RestartKind, force: bool = False) -> None:
        """Restart a desired lane as an operation of its group."""

    def restart_after_failure(self, lane: str) -> None:
        """Start the lane again once its backoff is over."""

    def give_up(self, lane: str, run: int, reason: str) -> Coroutine[object, object, None]:
        """Stop the lane and leave it failed until the next activate."""


class Reactions:
    """What the owner does about each report on a lane's run."""

    def __init__(
        self,
        records: Records,
        systemd: Systemd,
        probe: Probe,
        host: Host | None,
        checks: Checks,
        restarts: Restarts,
    ) -> None:
        self.records, self.systemd, self.probe, self.host = records, systemd, probe, host
        self.checks, self.restarts = checks, restarts
        self.systemd_restarts = systemd_restarts(records.systemd_version)

    # --- what systemd tells ---------------------------------------------------------------------

    def unit_changed(self, unit: str, props: dict[str, object]) -> None:
        """A PropertiesChanged signal of a lane's unit."""
        r = self.records
        lane = r.units.get(unit)
        if lane is None or r.closing:
            return
        self.apply(lane, r.snapshots.get(lane, UnitSnapshot(unit)).update(props))

    def apply(self, lane: str, snap: UnitSnapshot) -> None:
        """Compare a lane unit's new state with the last one seen and act on the difference."""
        r = self.records
        previous = r.snapshots.get(lane, UnitSnapshot(snap.name))
        r.snapshots[lane] = snap
        op = r.ops.of(r.config.lanes[lane].group)
        by_laned = r.runs[lane].restart is not None or (
            op is not None and op.lane == lane and op.kind is not OpKind.DEACTIVATE
        )
        change = policy.judge_unit_change(previous, snap, r.statuses[lane].state, by_laned)
        if change is policy.UnitChange.EXITED:
            self.exited(lane, snap)
        elif change is policy.UnitChange.STARTED_OUTSIDE:
            r.desire_only(lane)
            r.begin_start(lane)
            r.ledger.transition(lane, LaneState.STARTING, "started outside laned")
            self.follow(lane)

    def exited(self, lane: str, snap: UnitSnapshot, facts: exits.ExitFacts | None = None) -> None:
        """The lane's engine exited: judged (requested or a failure, whatever its status)
        and acted on (restart now, later, or never)."""
        r = self.records
        spec, status, run, now = r.config.lanes[lane], r.statuses[lane], r.runs[lane], r.clock()
        if facts is None:
            record = steps.read_exit_record(exit_record_path(r.config, lane))
            facts = exits.exit_facts(record, run.started_at or 0, snap)
        counted = r.counted(lane)
        plan = policy.plan_exit(
            spec,
            facts,
            stopping_by_laned=run.stopping,
            state=status.state,
            desired=status.desired,
            failures=status.failures,
            now=now,
            systemd_restarts=self.systemd_restarts,
            sub_state=snap.sub_state,
            counted=counted,
            ready_at=run.ready_at,
        )
        why = plan.reason if plan.verdict is Verdict.FAILURE else ""
        status.last_exit = LastExit(
            facts.code, facts.signal, now, plan.verdict, facts.oom_killed, why
        )
        r.recorder.exit(lane, facts.code, facts.signal, plan.verdict.value)
        self.unfollow(lane)
        if plan.verdict is Verdict.FAILURE and counted is None:
            run.failed = (run.number, "its exit")
            r.recorder.failure(lane, "exit")
        if plan.action is ExitAction.OWN_STOP:
            if plan.verdict is Verdict.FAILURE:
                status.failures[:] = plan.failures
                r.ledger.note(lane, EventKind.EXIT, plan.reason)
            r.writer.mark()
            return  # laned's own stop: the operation makes the transition
        if plan.action is ExitAction.STOPPED_OUTSIDE:
            r.spawn(self._stopped_outside(lane, plan.reason))
            return
        status.failures[:] = plan.failures
        if plan.action is ExitAction.SYSTEMD_RESTARTS:
            status.restarts = max(status.restarts + 1, snap.n_restarts)
            r.recorder.restart(lane, RestartKind.FAILURE.value)
            r.ledger.transition(lane, LaneState.RESTARTING, plan.reason)
            r.begin_start(lane)
            self.follow(lane)
        elif plan.action is ExitAction.RESTART_LATER:
            r.ledger.transition(lane, LaneState.RESTARTING, plan.reason)
            r.cancel_restart(lane)
            loop = asyncio.get_running_loop()
            run.restart = loop.call_later(plan.delay, self.restarts.restart_after_failure, lane)
        else:  # FAIL (not desired) or CRASH_LOOP
            r.ledger.transition(lane, LaneState.FAILED, plan.reason)
            if plan.action is ExitAction.CRASH_LOOP:
                r.ledger.fail_waiters(lane, plan.reason)

    async def _stopped_outside(self, lane: str, what: str) -> None:
        """A stop laned did not ask for: an operator's, unless the whole manager is going down."""
        r = self.records
        try:
            stopping = await self.systemd.system_state() == "stopping"
        except LanedError:
            stopping = True  # the manager is unreachable: most likely on its way down
        snap = r.snapshots.get(lane)
        if lane not in r.statuses or r.closing or (snap is not None and snap.running):
            return  # gone from the config, laned is stopping, or it was started again meanwhile
        if stopping:
            # Logout, reboot or `systemctl --user exit`: the lane should come back with laned.
            r.ledger.transition(lane, LaneState.INACTIVE, f"stopped with the user manager ({what})")
            return
        r.ledger.desire(lane, Desired.INACTIVE)
        r.ledger.transition(lane, LaneState.INACTIVE, f"stopped outside laned ({what})")
        r.ledger.fail_waiters(lane, "stopped outside laned")

    # --- what the watchers observe -----------------------------------------------------------------

    def follow(self, lane: str) -> None:
        """Watch the lane's current run: readiness, then liveness."""
        self.unfollow(lane)
        run = self.records.runs[lane]
        task = asyncio.get_running_loop().create_task(self._follow(lane, run.number))
        task.add_done_callback(self.records.task_done)
        run.follow = task

    def unfollow(self, lane: str) -> None:
        run = self.records.runs[lane]
        task, run.follow = run.follow, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _follow(self, lane: str, run: int) -> None:
        """Readiness (fast probing backing off over a long cold start), then liveness."""
        r = self.records
        spec = r.engine_spec(lane)  # the engine as its run started, whatever a reload changed
        report = functools.partial(self._observe, lane, run)
        expected = r.statuses[lane].last_cold_start
        if not await watchers.await_ready(self.probe, spec, r.runs[lane].poke, report, expected):
            return
        image = await steps.running_image(self.host, lane, spec)
        if spec.sleep_level and not r.runs[lane].waking:
            # Before any traffic: kept at the first good start, compared at later ones (a
            # difference after a cold start is said, and the lane serves on).
            await self.canary(lane, "start", image)
        if report(watchers.Ready(image)):
            await watchers.watch_liveness(self.probe, spec, report)

    def _observe(self, lane: str, run: int, seen: watchers.Observation) -> bool:
        """A watcher's report on one run of the lane; True: go on watching."""
        r = self.records
        if r.closing or lane not in r.statuses or r.runs[lane].number != run:
            return False
        if isinstance(seen, watchers.Ready):
            return self._became_ready(lane, seen.image_id)
        if isinstance(seen, watchers.Tick):
            return r.serving(lane)
        if isinstance(seen, watchers.Sampled):
            window = r.runs[lane].samples
            window.append((seen.at, seen.sample))
            while window and window[0][0] < seen.at - 60:
                window.popleft()
            return True
        if isinstance(seen, watchers.ProbeFailed):
            r.recorder.probe_failure(lane)
            if seen.failures < seen.limit:
                return True
            reason = f"health: {seen.failures} consecutive probe failures"
            self._degrade(lane, reason, RestartKind.HEALTH)
        elif isinstance(seen, watchers.Stalled):
            r.recorder.stall(lane)
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
            r.count_failure(lane, seen_by, reason)
            r.spawn(self.restarts.give_up(lane, run, reason))
        return False

    def _became_ready(self, lane: str, image_id: str | None) -> bool:
        r = self.records
        spec, status = r.config.lanes[lane], r.statuses[lane]
        if status.state is not LaneState.STARTING:
            return False
        now, run = r.clock(), r.runs[lane]
        took = round(now - (now if run.started_at is None else run.started_at), 3)
        run.woke = run.waking  # what this run's swap in cost: a wake or a cold start
        if run.waking:  # a wake from sleep: its own figure, not the cold start's prediction
            status.last_wake, run.waking = took, False
            r.recorder.sleep_mode(lane, "wake", took)
        else:
            status.last_cold_start = took
            r.recorder.cold_start(lane, took)
        if status.phases:
            status.last_phases = dict(phase_durations(status.phases, now))
        if image_id:
            status.image_id = image_id  # of a good start: a different one later is drift
        # The failures stay: an engine that dies after each good start is a crash loop too;
        # they leave the window after start_limit_interval (or at the next activate). The
        # backoff starts again from here.
        r.runs[lane].ready_at = now
        r.ledger.transition(
            lane, LaneState.READY, "health 200 and /v1/models lists " + spec.served_model_name
        )
        if spec.checks.after_activate:
            r.spawn(self.checks.after_activate(lane))
        return True

    def _degrade(self, lane: str, reason: str, kind: RestartKind) -> None:
        """The engine stopped serving (failed probes, a stall): one failure of this run,
        then a restart, or the end of a crash loop."""
        r = self.records
        r.ledger.transition(lane, LaneState.DEGRADED, reason)
        counted = r.count_failure(lane, kind.value, reason)
        if counted is not None and counted.crash_loop:
            r.spawn(self.restarts.give_up(lane, r.runs[lane].number, counted.reason))
            return
        self.restarts.restart_lane(lane, reason, kind)

    async def canary(self, lane: str, after: str, image: str | None) -> steps.Refused | None:
        """The canary after a `start` or a `wake` (laned.core.canary): an event when it is
        kept or differs, a metric when it differs; Refused when it differs."""
        r = self.records
        digest = f"{render.lane_digest(r.config, lane, r.systemd_version)}:{image or ''}"
        spec, note = r.config.lanes[lane], functools.partial(r.ledger.note, lane, EventKind.CANARY)
        outcome, detail = await steps.canary_check(self.probe, r.config, lane, spec, digest)
        if outcome is None:
            note(f"the canary could not be asked after a {after}: {detail}")
        elif outcome is canary.Outcome.RECORDED:
            note(f"canary kept at this first good start: {detail}")
        elif outcome is canary.Outcome.DIFFERENT:
            r.recorder.canary_mismatch(lane, after)
            note(f"the canary differs after a {after}: {detail}")
            return steps.Refused(f"the canary differs after a {after}", "see docs/runbook.md")
        return None

    # --- what the journal and the peers tell ----------------------------------------------------

    def phase_seen(self, unit: str, seen: Seen, at: float) -> None:
        """A startup phase or note from the engine's log line, logged at `at`."""
        r = self.records
        lane = r.units.get(unit)
        status = r.statuses.get(lane) if lane else None
        if lane is None or status is None or at < (status.started_at or 0):
            return  # not a lane's, or an earlier run's
        # journald can hand a line over after the engine already answered (a container's
        # output arrives in bursts): what it said of this start is still this start's.
        if seen.note and seen.note not in status.notes and status.state in policy.HOLDING_STATES:
            status.notes.append(seen.note)
            r.ledger.note(lane, EventKind.STARTUP, seen.note)
        if seen.phase is None or status.state not in policy.HOLDING_STATES:
            return
        # A bar reaches the journal when it closes: it began its elapsed time before.
        since = max(at - (seen.elapsed or 0.0), status.started_at or 0)
        if status.state is LaneState.STARTING:
            status.phase, status.progress = seen.phase, seen.progress
            status.phases = add_mark(status.phases, seen.phase, since)
            if seen.phase in ALMOST_READY:
                r.runs[lane].poke.set()
        elif status.started_at is not None and status.last_cold_start is not None:
            ready_at = status.started_at + status.last_cold_start
            if since < ready_at:  # late, but of this start: its timeline gets it
                status.phases = add_mark(status.phases, seen.phase, since)
                status.last_phases = dict(phase_durations(status.phases, ready_at))

    def peer_trouble(self, lane: str, reason: str | None) -> None:
        """A lane over several hosts: a peer rank out of reach (`reason`), or every one back
        (None). Degraded and left serving, never restarted for it: restarting this rank
        would not bring the peer back."""
        r = self.records
        status = r.statuses.get(lane)
        if status is None:
            return
        if reason is not None and status.state is LaneState.READY:
            r.runs[lane].check_degraded = True
            r.ledger.transition(lane, LaneState.DEGRADED, reason)
        elif (
            reason is None
            and r.runs[lane].check_degraded
            and status.state is LaneState.DEGRADED
            and status.reason.startswith("peer ")
        ):
            r.runs[lane].check_degraded = False
            r.ledger.transition(lane, LaneState.READY, "every peer rank answers again")
