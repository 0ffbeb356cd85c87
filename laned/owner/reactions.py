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

from laned import engines
from laned.config.model import Config, LaneConfig
from laned.config.names import exit_record_path
from laned.core import canary, exits, policy
from laned.core.lanes import START_COLD, Desired, EventKind, LastExit, Mode, Refused, Verdict
from laned.core.machine import Ev
from laned.core.phases import DYING, Seen
from laned.core.policy import ExitAction, OpKind, RestartKind
from laned.core.unit_state import UnitSnapshot, systemd_restarts
from laned.errors import LanedError
from laned.owner import watchers
from laned.owner.checkpoints import Checkpoints
from laned.owner.checks import Checks
from laned.owner.records import Records
from laned.owner.seam import Seam
from laned.owner.weights import Weights
from laned.render import plan as render

log = logging.getLogger("laned.supervisor")


async def canary_check(
    seam: Seam, config: Config, lane: str, spec: LaneConfig, digest: str
) -> tuple[canary.Outcome | None, str]:
    """Ask the canary and judge the answer against what is kept for `digest` (a first answer
    is kept, in the state directory). (None, why) when it could not be asked."""
    try:
        answer = await seam.engines.canary(spec)
    except LanedError as exc:
        return None, exc.message
    state_dir = config.daemon.state_dir
    kept = await asyncio.to_thread(seam.state.load_canary, state_dir, lane)
    outcome, detail = canary.judge(kept, digest, answer)
    if outcome is canary.Outcome.RECORDED:
        try:
            await asyncio.to_thread(seam.state.save_canary, state_dir, lane, answer.to_json(digest))
        except LanedError as exc:
            return outcome, f"{detail} (not kept: {exc.message})"
    return outcome, detail


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
        seam: Seam,
        checks: Checks,
        restarts: Restarts,
        weights: Weights,
        checkpoints: Checkpoints,
    ) -> None:
        self.records, self.seam = records, seam
        self.checks, self.restarts = checks, restarts
        self.weights, self.checkpoints = weights, checkpoints
        self.systemd_restarts = systemd_restarts(records.systemd_version)

    # --- what systemd tells ---------------------------------------------------------------------

    def unit_changed(self, unit: str, props: dict[str, object]) -> None:
        """A PropertiesChanged signal of a lane's unit."""
        r = self.records
        if unit in r.weights_units:
            self.weights.changed(unit, props)
            return
        lane = r.units.get(unit)
        if lane is None or r.closing:
            return
        self.apply(lane, r.snapshots.get(lane, UnitSnapshot(unit)).update(props))

    def apply(self, lane: str, snap: UnitSnapshot) -> None:
        """Compare a lane unit's new state with the last one seen and act on the difference."""
        r = self.records
        previous = r.snapshots.get(lane, UnitSnapshot(snap.name))
        r.snapshots[lane] = snap
        op = r.ops.of(lane)
        by_laned = r.restart_waiting(lane) or (
            op is not None and op.lane == lane and op.kind is not OpKind.DEACTIVATE
        )
        change = policy.judge_unit_change(previous, snap, r.statuses[lane].state, by_laned)
        if change is policy.UnitChange.EXITED:
            self.exited(lane, snap)
        elif change is policy.UnitChange.STARTED_OUTSIDE:
            r.desire_only(lane, r.evictions(lane).lanes)
            r.fire(lane, Ev.STARTED_OUTSIDE, "started outside laned")

    def exited(self, lane: str, snap: UnitSnapshot, facts: exits.ExitFacts | None = None) -> None:
        """The lane's engine exited: judged (requested or a failure, whatever its status)
        and acted on (restart now, later, or never)."""
        r = self.records
        spec, status, now = r.config.lanes[lane], r.statuses[lane], r.clock()
        if facts is None:
            record = self.seam.units.exit_record(exit_record_path(r.config, lane))
            facts = exits.exit_facts(record, status.started_at or 0, snap)
        counted = r.counted(lane)
        plan = policy.plan_exit(
            spec,
            facts,
            stopping_by_laned=status.stopping,
            state=status.state,
            desired=status.desired,
            failures=status.failures,
            now=now,
            systemd_restarts=self.systemd_restarts,
            sub_state=snap.sub_state,
            counted=counted,
            ready_at=status.ready_at,
        )
        failure = plan.verdict is Verdict.FAILURE
        last = LastExit(
            facts.code,
            facts.signal,
            now,
            plan.verdict,
            facts.oom_killed,
            plan.reason if failure else "",
        )
        # The window after it: kept as it was for a requested stop and for a stop outside laned.
        keep_window = plan.action is ExitAction.STOPPED_OUTSIDE or (
            plan.action is ExitAction.OWN_STOP and not failure
        )
        counted_now = failure and counted is None
        r.ledger.exited(lane, last, None if keep_window else plan.failures, counted_now)
        r.recorder.exit(lane, facts.code, facts.signal, plan.verdict.value)
        r.unfollow(lane)
        if counted_now:
            r.recorder.failure(lane, "exit")
        if plan.action is ExitAction.OWN_STOP:
            if failure:
                r.ledger.note(lane, EventKind.EXIT, plan.reason)
            return  # laned's own stop: the operation makes the transition
        if plan.action is ExitAction.STOPPED_OUTSIDE:
            r.spawn(self._stopped_outside(lane, plan.reason))
        elif plan.action is ExitAction.SYSTEMD_RESTARTS:
            r.ledger.restarted(lane, at_least=snap.n_restarts)
            r.recorder.restart(lane, RestartKind.FAILURE.value)
            r.fire(lane, Ev.SYSTEMD_RESTARTS, plan.reason)
        elif plan.action is ExitAction.RESTART_LATER:
            r.fire(lane, Ev.RESTART_LATER, plan.reason, delay=plan.delay)
        elif plan.action is ExitAction.CRASH_LOOP:
            r.fire(lane, Ev.CRASH_LOOP, plan.reason)
            r.spawn(self.weights.down_said(lane))  # a lane given up holds no GPU memory
        else:  # FAIL: not desired
            r.fire(lane, Ev.EXIT_FAILED, plan.reason)
            r.spawn(self.weights.down_said(lane))

    async def _stopped_outside(self, lane: str, what: str) -> None:
        """A stop laned did not ask for: an operator's, unless the whole manager is going down."""
        r = self.records
        try:
            stopping = await self.seam.manager.system_state() == "stopping"
        except LanedError:
            stopping = True  # the manager is unreachable: most likely on its way down
        snap = r.snapshots.get(lane)
        if lane not in r.statuses or r.closing or (snap is not None and snap.running):
            return  # gone from the config, laned is stopping, or it was started again meanwhile
        if stopping:
            # Logout, reboot or `systemctl --user exit`: the lane should come back with laned.
            r.fire(lane, Ev.STOPPED_WITH_MANAGER, f"stopped with the user manager ({what})")
            return
        r.ledger.desire(lane, Desired.INACTIVE)
        r.fire(lane, Ev.STOPPED_OUTSIDE, f"stopped outside laned ({what})")
        await self.weights.down_said(lane)  # its weights go with it

    # --- what the watchers observe -----------------------------------------------------------------

    async def watch(self, lane: str, run: int) -> None:
        """Follow run `run` of the lane (the lane machine's FOLLOW): readiness (fast probing
        backing off over a long cold start), then liveness."""
        r = self.records
        spec = r.engine_spec(lane)  # the engine as its run started, whatever a reload changed
        report = functools.partial(self._observe, lane, run)
        expected = r.statuses[lane].last_cold_start
        if not await watchers.await_ready(self.seam.engines, spec, r.poke(lane), report, expected):
            return
        image = await self.seam.containers.running_image(lane, spec)
        if spec.sleep_level and r.statuses[lane].mode is not Mode.WAKING:
            # Before any traffic: kept at the first good start, compared at later ones (a
            # difference after a cold start is said, and the lane serves on).
            await self.canary(lane, "start", image)
        if report(watchers.Ready(image)):
            alarm = r.alarm(lane)
            alarm.clear()  # what an earlier run's engine said is not this one's
            await watchers.watch_liveness(self.seam.engines, self.seam.pages, spec, report, alarm)

    def _observe(self, lane: str, run: int, seen: watchers.Observation) -> bool:
        """A watcher's report on one run of the lane; True: go on watching."""
        r = self.records
        if r.closing or lane not in r.statuses or r.statuses[lane].run != run:
            return False
        if isinstance(seen, watchers.Ready):
            return self._became_ready(lane, seen.image_id)
        if isinstance(seen, watchers.Tick):
            return r.serving(lane)
        if isinstance(seen, watchers.Sampled):
            r.ledger.sampled(lane, seen.at, seen.sample)
            return True
        if isinstance(seen, watchers.ProbeFailed):
            r.recorder.probe_failure(lane)
            if seen.failures < seen.limit:
                return True
            reason = f"health: {seen.failures} consecutive probe failures"
            self._degrade(lane, reason, RestartKind.HEALTH)
        elif isinstance(seen, watchers.SaidDead):
            # Not a probe failure to count: the engine says it will serve no more (its
            # profile's HealthRule). Its exit, if one follows, is this same failure's end.
            r.recorder.probe_failure(lane)
            self._degrade(lane, f"health {seen.status}: {seen.why}", RestartKind.HEALTH)
        elif isinstance(seen, watchers.Stalled):
            r.recorder.stall(lane)
            s = seen.sample
            load = "" if s is None else f"{s.running:g} running, {s.waiting:g} waiting"
            if seen.unanswered:
                reason = (
                    f"stalled: /metrics unanswered for {seen.unanswered:.0f}s while /health answers"
                )
                reason += f" (last read: {load})" if load else ""
            else:
                reason = f"stalled: {load} and no token for {seen.after:g}s"
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
        spec = r.config.lanes[lane]
        took = r.ledger.ready(
            lane, "health 200 and /v1/models lists " + spec.served_model_name, image_id
        )
        if took is None:
            return False  # not starting any more
        status = r.statuses[lane]
        r.recorder.start(lane, status.start_kind, took)
        if status.woke:
            r.recorder.sleep_mode(lane, "wake", took)
        elif status.start_kind == START_COLD:
            r.recorder.cold_start(lane, took)
        if spec.checks.after_activate:
            r.spawn(self.checks.after_activate(lane))
        return True

    def _degrade(self, lane: str, reason: str, kind: RestartKind) -> None:
        """The engine stopped serving (failed probes, a stall): one failure of this run,
        then a restart, or the end of a crash loop."""
        r = self.records
        r.fire(lane, Ev.UNHEALTHY, reason)
        counted = r.count_failure(lane, kind.value, reason)
        if counted is not None and counted.crash_loop:
            r.spawn(self.restarts.give_up(lane, r.statuses[lane].run, counted.reason))
            return
        self.restarts.restart_lane(lane, reason, kind)

    async def canary(self, lane: str, after: str, image: str | None) -> Refused | None:
        """The canary after a `start` or a `wake` (laned.core.canary): an event when it is
        kept or differs, a metric when it differs; Refused when it differs."""
        r = self.records
        # Kept per rendered lane, image and checkpoint: a fine-tune copied over the model's
        # files answers differently, and its first good start keeps its own answer.
        files = await self.checkpoints.digest(lane)
        digest = f"{render.lane_digest(r.config, lane, r.systemd_version)}:{image or ''}:{files}"
        spec, note = r.config.lanes[lane], functools.partial(r.ledger.note, lane, EventKind.CANARY)
        outcome, detail = await canary_check(self.seam, r.config, lane, spec, digest)
        if outcome is None:
            note(f"the canary could not be asked after a {after}: {detail}")
        elif outcome is canary.Outcome.RECORDED:
            note(f"canary kept at this first good start: {detail}")
        elif outcome is canary.Outcome.DIFFERENT:
            r.recorder.canary_mismatch(lane, after)
            note(f"the canary differs after a {after}: {detail}")
            return Refused(f"the canary differs after a {after}", "see docs/runbook.md")
        return None

    # --- what the journal and the peers tell ----------------------------------------------------

    def phase_seen(self, unit: str, seen: Seen, at: float) -> None:
        """A startup phase or note from the engine's log line, logged at `at`."""
        r = self.records
        lane = r.all_units().get(unit)
        if lane is None or lane not in r.statuses:
            return  # not a lane's
        if seen.note == DYING:
            # Its liveness watcher asks its health now rather than at the next interval.
            if r.serving(lane):
                r.alarm(lane).set()
            return
        cache = engines.for_lane(r.config.lanes[lane]).weight_cache
        if cache is not None and seen.note == cache.missed and r.statuses[lane].start_kind:
            r.ledger.start_kind(lane, START_COLD)  # the engine reads the weights from disk
        if r.ledger.phase_seen(lane, seen, at):
            r.poke(lane).set()

    def peer_trouble(self, lane: str, reason: str | None) -> None:
        """A lane over several hosts: a peer rank out of reach (`reason`), or every one back
        (None). Degraded and left serving, never restarted for it: restarting this rank
        would not bring the peer back."""
        r = self.records
        if lane not in r.statuses:
            return
        if reason is not None:
            r.fire(lane, Ev.PEER_LOST, reason)
        else:
            r.fire(lane, Ev.PEER_BACK, "every peer rank answers again")
