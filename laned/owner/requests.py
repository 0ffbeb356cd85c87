"""The owner's requests: activate, deactivate, restart, each an operation of one lane
(laned.owner.operations) made of steps on the host (laned.owner.seam, the start gate:
laned.owner.gate) that answer with values. An
activation takes off the lanes placement says must go (laned.core.placement: those that
never run beside it, and the cheapest set that leaves it room), and no other.

After every await an operation checks that it is still current, so a newer request always
wins: a deactivate that arrives while a restart waits at its start gate stops it. Every
start is part of an operation, made by `_clear_and_start` alone. A part of the owner
(laned.owner.supervisor); the reactions ask it for restarts (`Restarts`), and the lane
machine's timers call `restart_after_failure`.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Coroutine

from laned.config.names import unit_name
from laned.core import placement, policy
from laned.core.lanes import Desired, EventKind, LaneState, LaneStatus, Refused
from laned.core.machine import Ev
from laned.core.policy import Admit, OpKind, RestartKind
from laned.errors import (
    ActivationFailed,
    Finding,
    LanedError,
    PreflightFailed,
    Severity,
    Superseded,
)
from laned.owner.checkpoints import Checkpoints
from laned.owner.gate import Beside, clear_for_start
from laned.owner.operations import Operation
from laned.owner.prefetching import Prefetches
from laned.owner.records import Records
from laned.owner.seam import Seam
from laned.owner.sleeping import Sleeping
from laned.owner.traffic import Traffic
from laned.owner.weights import Weights
from laned.preflight.facts import Sleepers, blocking
from laned.preflight.rules import evaluate, refusal

log = logging.getLogger("laned.supervisor")


class Requests:
    """Activations, stops and restarts, as operations of their lane."""

    def __init__(
        self,
        records: Records,
        seam: Seam,
        traffic: Traffic,
        sleeping: Sleeping,
        prefetches: Prefetches,
        weights: Weights,
        checkpoints: Checkpoints,
    ) -> None:
        self.records, self.seam = records, seam
        self.traffic, self.weights, self.checkpoints = traffic, weights, checkpoints
        self.sleeping, self.prefetches = sleeping, prefetches
        self.ops, self.ledger = records.ops, records.ledger  # the same for the owner's life

    # --- requests from outside ---------------------------------------------------------------

    def activate(
        self,
        lane: str,
        reason: str = "activate",
        force: bool = False,
        findings: list[Finding] | None = None,
    ) -> asyncio.Future[LaneStatus]:
        """Make `lane` run, taking off the lanes it cannot run beside; the future resolves
        when it is ready.

        Preflight runs first, before anything is stopped: an error refuses the activation
        (unless `force`) and leaves the running lanes and the desired lanes as they were.
        `findings`: a preflight the caller ran just now (the API does), not run again."""
        status = self.ledger.statuses[lane]
        self.records.spec(lane)
        current = self.ops.of(lane)
        admit = policy.admit_activate(lane, self.ops.view(lane), status.state, status.desired)
        if admit is Admit.JOIN and current is not None:
            return current.future
        if admit is Admit.WAIT_READY:
            return self.ledger.wait_ready(lane)  # idempotent: nothing is restarted
        off = set(self.records.evictions(lane).lanes)
        resting = self.records.resting()  # sleepers that stay asleep unless they are in the way
        stopping = self.ops.aside.get(lane)
        if stopping is not None:  # its stop alongside another's activation: this one wins
            self.ops.supersede(stopping, f"superseded by activate {lane}")
        for other in list(self.ops.current.values()):
            # The newest request wins: over this lane's own operation, the activations of
            # the lanes it takes off, and an activation that would take it off (that lane
            # goes: it was on its way only).
            taking = other.kind is not OpKind.DEACTIVATE and other.lane in off
            if other.lane == lane or taking or lane in other.evicts:
                if lane in other.evicts:
                    off.add(other.lane)
                self.ops.supersede(other, f"superseded by activate {lane}")
        peers = sorted(off)
        before = {n: self.ledger.statuses[n].desired for n in (lane, *peers)}
        self.records.desire_only(lane, peers)
        self.ledger.failures_cleared(lane)
        op = self.ops.begin(lane, OpKind.ACTIVATE)
        op.force, op.desired_before, op.findings = force, before, findings
        op.evicts = tuple(peers)
        op.stops_asleep = tuple(p for p in peers if p in resting)
        holding = [p for p in peers if self.ledger.statuses[p].state in policy.HOLDING_STATES]
        op.from_lane = holding[0] if holding else "none"
        self.ops.run(op, self._operation(op, lambda: self._activation(op, reason)))
        return op.future

    def deactivate(self, lane: str, force: bool = False) -> asyncio.Future[LaneStatus]:
        """Stop `lane`; a stop laned asked for is never counted as a failure. Requests in
        flight through laned's OpenAI endpoint end first (up to its drain_timeout) unless
        `force`."""
        self.records.spec(lane)
        current = self.ops.of(lane)
        self.ledger.desire(lane, Desired.INACTIVE)
        self.records.cancel_restart(lane)
        taking = self.ops.evicting(lane)
        if policy.admit_deactivate(lane, taking is not None) is Admit.ALONGSIDE:
            # Another lane's activation takes it off anyway: stop it alongside without
            # displacing that operation.
            op = self.ops.alongside(lane, OpKind.DEACTIVATE)
        else:
            if current is not None:
                self.ops.supersede(current, f"superseded by deactivate {lane}")
                self._keep_untouched(current, lane)
            op = self.ops.begin(lane, OpKind.DEACTIVATE)
        op.force = force
        stop = functools.partial(self._stop_and_confirm, op.lane, "deactivate", force)
        self.ops.run(op, self._operation(op, stop))
        return op.future

    def _keep_untouched(self, superseded: Operation, stopping: str) -> None:
        """An activation a deactivate superseded before it took its peers off: the peers
        still running stay desired, as they were before it (nothing runs undesired)."""
        for name, before in superseded.desired_before.items():
            held = self.ledger.statuses[name].state in policy.HOLDING_STATES
            if name != stopping and before is Desired.ACTIVE and held:
                self.ledger.desire(name, Desired.ACTIVE)

    def restart(
        self, lane: str, reason: str = "restart requested", force: bool = False
    ) -> asyncio.Future[LaneStatus]:
        """Stop and start `lane` again (it must be desired active); requests in flight
        through laned's OpenAI endpoint end first unless `force`."""
        self.records.spec(lane)
        if self.ledger.statuses[lane].desired is not Desired.ACTIVE:
            return self.activate(lane, force=force)
        self.restart_lane(lane, reason, RestartKind.REQUESTED, force)
        return self.ledger.wait_ready(lane)

    async def preflight(self, lane: str) -> list[Finding]:
        """The lane's preflight findings as of now ([] without a host adapter)."""
        self.records.spec(lane)
        status = self.ledger.statuses[lane]
        # A sleeping lane wakes: no new engine, no free-memory check beside the sleepers.
        asleep = status.state is LaneState.SLEEPING
        r = self.records
        # The sleepers the activation stops for room keep nothing by the time it starts.
        off = r.evictions(lane).lanes
        sleepers = Sleepers() if asleep else Sleepers(r.sleepers(but=off), r.to_sleep(lane))
        config = self.records.config
        peer = policy.port_peer(config, lane, self.ledger.states())
        facts = await self.seam.facts.lane_facts(config, lane, peer, status.image_id, sleepers)
        return [] if facts is None else evaluate(lane, config.lanes[lane], facts)

    # --- operations -------------------------------------------------------------------------------

    def _ensure_current(self, op: Operation) -> None:
        self.ops.ensure_current(op)

    def _finish(self, op: Operation, error: LanedError | None = None) -> None:
        passes = (ActivationFailed, Superseded, PreflightFailed)
        if error is not None and op.kind is not OpKind.DEACTIVATE and not isinstance(error, passes):
            error = ActivationFailed(error.message, error.hint)
        self.ops.finish(op, self.ledger.statuses[op.lane], error)

    async def _operation(
        self, op: Operation, body: Callable[[], Coroutine[object, object, None]]
    ) -> None:
        """Run the operation's body (made here: an operation superseded before its task ran
        leaves no coroutine unawaited); whatever ends it, its caller hears."""
        try:
            await body()
            self._finish(op)
        except LanedError as exc:
            self._finish(op, exc)
        except Exception as exc:  # a bug: the caller still hears, and the log has it
            log.exception("%s %s failed", op.kind.value, op.lane)
            self._finish(op, ActivationFailed(f"lane {op.lane}: laned failed: {exc!r}"))
        finally:  # done, failed or superseded: a prefetch for it has nothing left to wait for
            self.prefetches.end(op.lane)

    def spawn_activation(self, lane: str, reason: str) -> None:
        """An activation laned makes itself (the desired or default lane at start)."""
        future = self.activate(lane, reason)
        op = self.ops.of(lane)
        if op is not None and op.future is future:
            op.unattended = True  # nobody waits for it: a refusal must show in the lane's state

    async def _activation(self, op: Operation, reason: str) -> None:
        lane = op.lane
        await self._preflight(op)
        if op.from_lane != "none":  # the weights read in while the running lane goes
            self.prefetches.begin(lane, [op.from_lane])
        for peer in op.evicts:
            await self._take_off(peer, f"swap to {lane}", op.force, peer in op.stops_asleep)
            self._ensure_current(op)
        asleep = self.ledger.statuses[lane].state is LaneState.SLEEPING
        cold = await self.sleeping.why_cold(lane) if asleep else None
        self._ensure_current(op)
        if cold is not None:
            what, why = cold
            self.ledger.note(lane, EventKind.SLEEP, why)
            await self._stop_and_confirm(lane, f"activate {lane}: {what}")
            self._ensure_current(op)
            asleep = False
        if asleep:
            woken = await self._wake(op, reason)
            if woken is not None:
                await woken
                return
            # The wake failed and the engine was stopped: a cold start, as for any lane.
        unit = unit_name(lane, self.records.config.lanes[lane])
        if await self.seam.units.still_ending(unit, self.records.snapshots.get(lane)):
            self._ensure_current(op)
            # Its own earlier run is still ending (the stop of a deactivate this request
            # superseded): that run's exit must reach laned before the new run is
            # followed, or it would be taken for the new run's and end its watch.
            await self._stop_and_confirm(lane, f"its earlier run ends before activate {lane}")
        self._ensure_current(op)
        ready = self.ledger.wait_ready(lane)
        await self._clear_and_start(op, reason)
        await ready

    # --- sleep mode (docs/sleep.md) ------------------------------------------------------------

    async def _take_off(self, lane: str, reason: str, force: bool, asleep_too: bool) -> None:
        """Take a peer off the GPUs for a swap: to sleep where it can (a lane with a
        sleep_level that serves), else stopped; a sleeper stays asleep, unless what it keeps
        leaves the new lane no room (`asleep_too`): then it stops."""
        spec, state = self.records.config.lanes[lane], self.ledger.statuses[lane].state
        if state is LaneState.SLEEPING and asleep_too:
            why = f"{reason}: the GPU memory it keeps asleep leaves no room; stopping it"
            self.ledger.note(lane, EventKind.SLEEP, why)
            await self._stop_and_confirm(lane, reason, force)
            return
        if state is LaneState.SLEEPING:
            return
        if spec.sleep_level and self.records.serving(lane):
            refused = await self.sleeping.put_to_sleep(lane, reason, force)
            if refused is None:
                return
            self.ledger.note(lane, EventKind.SLEEP, f"{refused.reason}: stopping it instead")
        await self._stop_and_confirm(lane, reason, force)

    async def _wake(self, op: Operation, reason: str) -> asyncio.Future[LaneStatus] | None:
        """Wake the sleeping lane instead of a cold start: the GPU-memory gate, the wake
        (level 2: the weights reloaded), the canary, then readiness as after a start (the
        future: ready). A wake that fails stops the engine (None: start it cold)."""
        lane, r = op.lane, self.records
        spec = r.config.lanes[lane]
        refused = await clear_for_start(
            self.seam,
            lane,
            spec,
            None,
            functools.partial(self.ledger.note, lane),
            r.recorder,
            waking=True,
            sleepers=r.sleepers(),  # its own residual included: it is its own
        )
        self._ensure_current(op)
        if refused is not None:
            r.fire(lane, Ev.START_REFUSED, refused.reason)
            raise ActivationFailed(f"lane {lane}: {refused.reason}", refused.hint)
        refused = await self.sleeping.wake(lane, reason)
        self._ensure_current(op)
        if refused is None:
            ready = self.ledger.wait_ready(lane)
            r.fire(lane, Ev.WOKE, f"{reason}: woken")
            return ready
        self.ledger.note(lane, EventKind.SLEEP, f"{refused.reason}: stopping it for a cold start")
        await self._stop_and_confirm(lane, f"{reason}: the wake failed")
        self._ensure_current(op)
        return None

    async def _preflight(self, op: Operation) -> None:
        """Preflight; on errors (not forced) refuse the activation and undo its desire."""
        lane = op.lane
        findings = op.findings if op.findings is not None else await self.preflight(lane)
        self._ensure_current(op)
        errors = blocking(findings)
        warnings = [f for f in findings if f.severity is Severity.WARNING]
        if findings:
            summary = "; ".join(f.message for f in [*errors, *warnings]) or "notes only"
            self.ledger.note(
                lane,
                EventKind.PREFLIGHT,
                f"preflight: {len(errors)} error(s), {len(warnings)} warning(s): {summary}",
            )
        if not errors:
            return
        self.records.recorder.preflight_refused(lane)
        if op.force:
            self.ledger.note(lane, EventKind.PREFLIGHT, "preflight errors overridden (force)")
            return
        for name, desired in op.desired_before.items():
            self.ledger.desire(name, desired)
        message, hint = refusal(lane, findings)
        if op.unattended:
            self.records.fire(lane, Ev.START_REFUSED, message.removeprefix(f"lane {lane}: "))
        raise PreflightFailed(message, hint, findings)

    def restart_lane(self, lane: str, reason: str, kind: RestartKind, force: bool = False) -> None:
        """Restart a desired lane as an operation of its own: `restarting` now (so waiters
        made after this wait for the new run), then stop and start it. A requested restart
        drains the endpoint's requests first (unless `force`); a failed engine has none to
        finish."""
        status = self.ledger.statuses[lane]
        if status.desired is not Desired.ACTIVE:
            return
        if policy.admit_restart(lane, self.ops.view(lane)) is Admit.JOIN:
            return  # an activation or restart of it is under way: it ends in a fresh run
        current = self.ops.of(lane)
        if current is not None:
            self.ops.supersede(current, f"superseded by restart {lane}")
        self.ledger.restarted(lane)
        self.records.recorder.restart(lane, kind.value)
        op = self.ops.begin(lane, OpKind.RESTART)
        op.force = force or kind is not RestartKind.REQUESTED
        self.records.fire(lane, Ev.RESTART, reason)  # a stop of laned's, the watcher ended
        self.ops.run(op, self._operation(op, lambda: self._stop_then_start(op, reason)))

    async def _stop_then_start(self, op: Operation, reason: str) -> None:
        try:
            await self._drain(op.lane, op.force)
            self._ensure_current(op)
            unit = unit_name(op.lane, self.records.engine_spec(op.lane))
            refused = await self.seam.units.stop(unit)  # the one confirmed stop
            if refused is not None:
                raise ActivationFailed(f"lane {op.lane}: {refused.reason}", refused.hint)
        finally:
            self.ledger.stop_over(op.lane)
        self._ensure_current(op)
        ready = self.ledger.wait_ready(op.lane)
        await self._clear_and_start(op, f"restart: {reason}")
        await ready

    def restart_after_failure(self, lane: str) -> None:
        """The backoff after a failure is over (a timer): start the lane again, within the
        operation that wants it ready, or as a restart operation of its own."""
        self.records.restarts.pop(lane, None)
        status = self.ledger.statuses.get(lane)
        if status is None or status.desired is not Desired.ACTIVE:
            return
        if status.state is not LaneState.RESTARTING or self.records.closing:
            return
        count = self.ledger.restarted(lane)
        self.records.recorder.restart(lane, RestartKind.FAILURE.value)
        reason = f"restart #{count} after a failure"
        current = self.ops.of(lane)
        if current is not None and current.kind is not OpKind.DEACTIVATE:
            self.ops.run(current, self._start_within(current, reason))
            return
        op = self.ops.begin(lane, OpKind.RESTART)
        ready = self.ledger.wait_ready(lane)

        async def body() -> None:
            await self._clear_and_start(op, reason)
            await ready

        self.ops.run(op, self._operation(op, body))

    async def _start_within(self, op: Operation, reason: str) -> None:
        """A start inside an operation that already waits for the lane to be ready."""
        try:
            await self._clear_and_start(op, reason)
        except (Superseded, ActivationFailed):
            pass  # superseded, or refused at the gate: the lane's waiters have heard
        except LanedError as exc:
            log.error("%s: %s failed: %s", op.lane, reason, exc)

    async def _clear_and_start(self, op: Operation, reason: str) -> None:
        """The one way a lane starts: the start gate (prepare, GPU memory, port), a check that
        the operation is still current, then the unit's start job."""
        lane = op.lane
        spec = self.records.config.lanes[lane]
        refused = await self.weights.before_start(lane)  # a daemon of other weights goes
        self._ensure_current(op)
        # The lane's own weight-cache daemon keeps its GPU memory through the gate, and so
        # do the lanes that run on beside it.
        exempt = await self.weights.exempt(lane) if refused is None else frozenset()
        if refused is None:
            beside = await self._beside(lane)
            self._ensure_current(op)
            refused = await clear_for_start(
                self.seam,
                lane,
                spec,
                self.ledger.statuses[lane].image_id,
                functools.partial(self.ledger.note, lane),
                self.records.recorder,
                sleepers=self.records.sleepers() | exempt,
                beside=beside,
            )
        self.prefetches.end(lane)  # the GPUs are free: the engine reads the rest itself
        self._ensure_current(op)
        if refused is not None:
            self.records.fire(lane, Ev.START_REFUSED, refused.reason)
            raise ActivationFailed(f"lane {lane}: {refused.reason}", refused.hint)
        self.records.fire(lane, Ev.START, reason)  # a new run of a new engine, watched
        refused = await self.weights.up(lane)  # the daemon serves first
        if refused is None and not self.weights.kept(lane):
            await self.checkpoints.record(lane)  # what the engine reads now (a lane that sleeps)
        self._ensure_current(op)
        if refused is not None:
            self._weights_failed(lane, refused)
            return
        self.prefetches.at_start(lane)
        await self.seam.units.start(unit_name(lane, spec))

    async def _beside(self, lane: str) -> Beside:
        """The lanes that stay on the GPUs `lane` starts on (desired, sharing a GPU with it):
        their processes, and the room its footprint needs beside them."""
        r = self.records
        me = r.footprints[lane]
        staying: dict[int, str] = {}
        room: dict[int, int] = {}
        names: list[str] = []
        for other in r.placed(but=lane):
            shared = placement.common(me, r.footprints[other], r.gpu_totals)
            status = r.statuses[other]
            if status.desired is not Desired.ACTIVE or status.state is LaneState.FAILED:
                continue  # taken off (its memory must go, as the gate has always asked), or none
            if not shared:
                continue
            names.append(other)
            spec = r.engine_spec(other)
            snap = await self.seam.units.snapshot(unit_name(other, spec))
            pids = set(await self.weights.exempt(other))
            if snap.control_group:
                pids |= await self.seam.containers.engine_pids(other, spec, snap.control_group)
            staying.update(dict.fromkeys(pids, other))
            for gpu in shared:
                need = me.demand(gpu, r.gpu_totals)
                if need:
                    room[gpu] = need
        return Beside(staying, room, tuple(names))

    def _weights_failed(self, lane: str, refused: Refused) -> None:
        """The daemon did not come up: the run's failure, counted; a restart after the
        backoff, or the end of a crash loop."""
        r, spec = self.records, self.records.config.lanes[lane]
        counted = r.count_failure(lane, "weights", refused.reason)
        if counted is not None and counted.crash_loop:
            r.fire(lane, Ev.CRASH_LOOP, counted.reason)
            raise ActivationFailed(f"lane {lane}: {counted.reason}", refused.hint)
        failures = len(counted.failures) if counted is not None else 1
        delay = policy.backoff_delay(spec.restart_sec, failures, spec.restart_max_delay)
        why = f"{refused.reason}; restarting in {delay:g}s"
        r.fire(lane, Ev.RESTART_LATER, why, delay=delay)

    async def _stop_and_confirm(self, lane: str, reason: str, force: bool = False) -> None:
        """Stop the lane's unit and confirm it is gone (for containers, ExecStopPost removed it).
        `stopping` first, so laned's OpenAI endpoint sends it no new request; the requests in
        flight end before the stop (drain_timeout at most) unless `force`."""
        # The engine as it runs (its container's name among the rest), whatever a reload changed.
        r, spec = self.records, self.records.engine_spec(lane)
        r.fire(lane, Ev.STOP_ASKED, reason)  # no restart, no watcher, no waiter any more
        unit = unit_name(lane, spec)
        if not await self.seam.units.still_ending(unit, r.snapshots.get(lane)):
            # Not running (a failed lane included: deactivating it acknowledges the failure).
            r.fire(lane, Ev.ALREADY_STOPPED, reason)
            await self.weights.down_said(lane)
            return
        try:
            r.fire(lane, Ev.STOP, reason)
            await self._drain(lane, force)
            refused = await self.seam.units.stop(unit)
            if refused is not None:
                raise ActivationFailed(refused.reason, refused.hint)
            note = functools.partial(self.ledger.note, lane)
            refused = await self.seam.containers.container_gone(lane, spec, note)
            if refused is None:
                refused = await self.weights.down(lane)  # its weights go with it
            if refused is not None:
                r.fire(lane, Ev.STOP_FAILED, refused.reason)  # not `stopping`
                raise ActivationFailed(f"lane {lane}: {refused.reason}", refused.hint)
        finally:
            self.ledger.stop_over(lane)
        r.fire(lane, Ev.STOPPED, reason)

    async def _drain(self, lane: str, force: bool) -> None:
        note = functools.partial(self.ledger.note, lane, EventKind.DRAIN)
        timeout = self.records.config.lanes[lane].drain_timeout
        await self.traffic.drain_before_stop(lane, timeout, force, note)

    async def give_up(self, lane: str, run: int, reason: str) -> None:
        """Stop the lane (a stop laned asked for) and leave it failed until the next activate."""
        self.records.fire(lane, Ev.GIVE_UP, reason)
        try:
            unit = unit_name(lane, self.records.engine_spec(lane))
            refused = await self.seam.units.stop(unit)  # the one confirmed stop
            await self.weights.down_said(lane)  # a lane given up holds no GPU memory
        finally:
            self.ledger.stop_over(lane)
        if refused is not None:
            reason = f"{reason}; and {refused.reason}"
        if self.ledger.statuses[lane].run == run:  # not if a newer start owns the lane by now
            self.records.fire(lane, Ev.GAVE_UP, reason)
