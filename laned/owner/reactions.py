"""The owner's reactions to what happens to a lane's run: its unit's changes as systemd
reports them, its exit, what the watchers observe (ready, failed probes, a dead engine, a
stall, a start that takes too long, memory running low), its startup phases from the
journal, and a peer rank out of reach.

Each report becomes an input of the lane machine (laned.core.inputs), posted through the
interpreter (laned.owner.interpreter), which the step judges (with laned.core.policy and
laned.core.exits); a report about an older run of the lane (its run number) is dropped by
the step. What is read on the way (an exit's record, the manager's state) is read here. A
part of the owner (laned.owner.supervisor).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable

from laned.config.model import Config, LaneConfig
from laned.config.names import exit_record_path
from laned.core import canary, exits, policy
from laned.core import inputs as i
from laned.core.lanes import EventKind, Mode, Refused
from laned.core.phases import Seen
from laned.core.policy import OpKind, RestartKind
from laned.core.unit_state import UnitSnapshot, systemd_restarts
from laned.engines import headless
from laned.errors import LanedError
from laned.owner import watchers
from laned.owner.checkpoints import Checkpoints
from laned.owner.records import Records
from laned.owner.seam import Seam
from laned.owner.weights import Weights
from laned.render import plan as render

log = logging.getLogger("laned.supervisor")

Post = Callable[[str, i.Input], object]


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


class Reactions:
    """What the owner makes of each report on a lane's run: inputs of the lane machine."""

    def __init__(
        self, records: Records, seam: Seam, weights: Weights, checkpoints: Checkpoints
    ) -> None:
        self.records, self.seam = records, seam
        self.weights, self.checkpoints = weights, checkpoints
        self.systemd_restarts = systemd_restarts(records.systemd_version)
        # Bound by the supervisor: the interpreter's post, a started-outside lane's planning,
        # the readiness and liveness pokes, whether a restart of the lane waits.
        self.post: Post = lambda lane, event: None
        self.started_outside: Callable[[str], None] = lambda lane: None
        self.poke: Callable[[str], asyncio.Event] = lambda lane: asyncio.Event()
        self.alarm: Callable[[str], asyncio.Event] = lambda lane: asyncio.Event()
        self.restart_waiting: Callable[[str], bool] = lambda lane: False

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
        self.apply(lane, (r.statuses[lane].unit or UnitSnapshot(unit)).update(props))

    def apply(self, lane: str, snap: UnitSnapshot) -> None:
        """Compare a lane unit's new state with the last one seen and report the difference."""
        r = self.records
        previous = r.statuses[lane].unit or UnitSnapshot(snap.name)
        self.post(lane, i.UnitSeen(snap))
        op = r.statuses[lane].op
        by_laned = self.restart_waiting(lane) or (
            op is not None and op.kind != OpKind.DEACTIVATE.value
        )
        change = policy.judge_unit_change(previous, snap, r.statuses[lane].state, by_laned)
        if change is policy.UnitChange.EXITED:
            self.exited(lane, snap)
        elif change is policy.UnitChange.STARTED_OUTSIDE:
            self.started_outside(lane)

    def exited(self, lane: str, snap: UnitSnapshot, facts: exits.ExitFacts | None = None) -> None:
        """The lane's engine exited: what laned knows of it (the serve wrapper's record,
        systemd's word), for the step to judge."""
        r = self.records
        if facts is None:
            record = self.seam.units.exit_record(exit_record_path(r.config, lane))
            facts = exits.exit_facts(record, r.statuses[lane].started_at or 0, snap)
        self.post(lane, i.Exited(facts, snap.sub_state, snap.n_restarts, self.systemd_restarts))

    async def stopped_outside(self, lane: str, what: str) -> None:
        """A stop laned did not ask for: an operator's, unless the whole manager is going down."""
        r = self.records
        try:
            stopping = await self.seam.manager.system_state() == "stopping"
        except LanedError:
            stopping = True  # the manager is unreachable: most likely on its way down
        snap = r.statuses[lane].unit if lane in r.statuses else None
        if lane not in r.statuses or r.closing or (snap is not None and snap.running):
            return  # gone from the config, laned is stopping, or it was started again meanwhile
        if stopping:
            # Logout, reboot or `systemctl --user exit`: the lane should come back with laned.
            self.post(lane, i.StoppedOutside(f"stopped with the user manager ({what})", True))
        else:
            self.post(lane, i.StoppedOutside(f"stopped outside laned ({what})", False))

    # --- what the watchers observe -----------------------------------------------------------------

    async def watch(self, lane: str, run: int) -> None:
        """Follow run `run` of the lane (the lane machine's Follow): readiness (fast probing
        backing off over a long cold start), then liveness."""
        r = self.records
        spec = r.engine_spec(lane)  # the engine as its run started, whatever a reload changed
        report = functools.partial(self._observe, lane, run)
        expected = r.statuses[lane].last_cold_start
        if not await watchers.await_ready(
            self.seam.engines, spec, self.poke(lane), report, expected
        ):
            return
        image = await self.seam.containers.running_image(lane, spec)
        if spec.sleep_level and r.statuses[lane].mode is not Mode.WAKING and not headless(spec):
            # Before any traffic: kept at the first good start, compared at later ones (a
            # difference after a cold start is said, and the lane serves on).
            await self.canary(lane, "start", image)
        if report(watchers.Ready(image)):
            alarm = self.alarm(lane)
            alarm.clear()  # what an earlier run's engine said is not this one's
            await watchers.watch_liveness(
                self.seam.engines, self.seam.pages, spec, report, alarm, self.seam.gpus
            )

    def _observe(self, lane: str, run: int, seen: watchers.Observation) -> bool:
        """A watcher's report on one run of the lane, as an input; True: go on watching."""
        r = self.records
        if r.closing or lane not in r.statuses or r.statuses[lane].run != run:
            return False
        if isinstance(seen, watchers.Tick):
            return r.serving(lane)
        if isinstance(seen, watchers.Ready):
            spec = r.config.lanes[lane]
            said = "health 200 and /v1/models lists " + spec.served_model_name
            self.post(lane, i.Ready(run, said, seen.image_id))
            return r.statuses[lane].mode is Mode.READY
        if isinstance(seen, watchers.Sampled):
            self.post(lane, i.Sampled(run, seen.at, seen.sample))
            return True
        if isinstance(seen, watchers.ProbeFailed):
            self.post(lane, i.ProbeFailed(run, seen.failures, seen.limit))
            return seen.failures < seen.limit
        if isinstance(seen, watchers.SaidDead):
            # Not a probe failure of three: the engine says it will serve no more (its
            # profile's HealthRule). Its exit, if one follows, is this same failure's end.
            reason = f"health {seen.status}: {seen.why}"
            self.post(
                lane, i.Failing(run, reason, "health", RestartKind.HEALTH.value, "probe_failure")
            )
        elif isinstance(seen, watchers.Stalled):
            s = seen.sample
            load = "" if s is None else f"{s.running:g} running, {s.waiting:g} waiting"
            if seen.unanswered:
                reason = (
                    f"stalled: /metrics unanswered for {seen.unanswered:.0f}s while /health answers"
                )
                reason += f" (last read: {load})" if load else ""
            else:
                reason = f"stalled: {load} and no token for {seen.after:g}s"
            self.post(lane, i.Failing(run, reason, "stalled", RestartKind.STALLED.value, "stall"))
        elif isinstance(seen, watchers.StartTimedOut):
            reason = f"start-timeout: not ready within {seen.after:g}s"
            self.post(lane, i.GiveUp(run, reason, "start-timeout"))
        elif isinstance(seen, watchers.MemoryLow):
            reason = f"memory-guard: MemAvailable {seen.available_gib:.1f} GiB below the floor"
            if seen.unified:
                reason = (
                    f"memory-guard: the unified memory pool its GPUs share with the host has "
                    f"{seen.available_gib:.1f} GiB available, below the floor of "
                    f"{seen.floor_gib:g} GiB for {seen.for_seconds:g}s: stopped before the "
                    "engine outgrows the pool and the OOM takes the host down"
                )
            self.post(lane, i.GiveUp(run, reason, "memory-guard"))
        return False

    async def canary(self, lane: str, after: str, image: str | None) -> Refused | None:
        """The canary after a `start` or a `wake` (laned.core.canary): an event when it is
        kept or differs, a metric when it differs; Refused when it differs."""
        r = self.records
        # Kept per rendered lane, image and checkpoint: a fine-tune copied over the model's
        # files answers differently, and its first good start keeps its own answer.
        files = await self.checkpoints.digest(lane)
        digest = f"{render.lane_digest(r.config, lane, r.systemd_version)}:{image or ''}:{files}"
        spec, note = r.config.lanes[lane], functools.partial(r.book.note, lane, EventKind.CANARY)
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
        lane = self.records.all_units().get(unit)
        if lane is not None and lane in self.records.statuses:
            self.post(lane, i.PhaseSeen(seen, at))

    def peer_trouble(self, lane: str, reason: str | None) -> None:
        """A lane over several hosts: a peer rank out of reach (`reason`), or every one back
        (None). Degraded and left serving, never restarted for it: restarting this rank
        would not bring the peer back."""
        if lane in self.records.statuses:
            self.post(lane, i.PeerTrouble(reason))
