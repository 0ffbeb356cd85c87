"""The lane supervisor: the one owner of lane state.

Everything that changes a lane's state runs on one asyncio event loop, and every change
happens in `_transition`, a synchronous method: no decision reads state, awaits, and then
acts on what it read. After each await an operation re-checks that it is still current
(the generation of its group) before it acts again.

Activation of a lane is an operation of its group: it stops every conflicting lane and
confirms each is gone, runs the pre-start gate, starts the unit and waits for readiness
(the health path answers 200 and /v1/models lists the served model). A newer request for
the same group supersedes it. Exits are judged by `lanes.judge_exit`: only a stop somebody
asked for is `requested`; anything else — status 0 too — is a failure, restarted with
backoff, until a crash loop ends in `failed`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any

from laned import journal, render, state
from laned.acceptance import GateResult, LaneNotRunning, run_gates
from laned.config import GATES, Config, LaneConfig
from laned.engine_api import EngineClient
from laned.errors import (
    ActivationFailed,
    ConfigRefused,
    LanedError,
    PodmanError,
    PreflightFailed,
    Severity,
    Superseded,
    SystemdError,
)
from laned.host import Host, meminfo, port_busy, run_prepare
from laned.lanes import (
    RUNNING_STATES,
    Desired,
    EngineSample,
    Event,
    EventKind,
    LaneState,
    LaneStatus,
    LastExit,
    StallDetector,
    Verdict,
    backoff_delay,
    decode_status,
    is_crash_loop,
    judge_exit,
    parse_phase,
    phase_durations,
    recent,
)
from laned.metrics import Recorder
from laned.names import container_name, exit_record_path, unit_name
from laned.preflight import Finding, blocking, refusal
from laned.probes import Probe, read_api_key
from laned.systemd import CLD_DUMPED, CLD_KILLED, Systemd, UnitSnapshot
from laned.units import RESTART_STEPS_SINCE

log = logging.getLogger("laned.supervisor")

EXITED_SUBSTATES = {"dead", "failed", "auto-restart", "exited"}


@dataclass
class Operation:
    """An activate or deactivate in progress for one group."""

    lane: str
    kind: str
    generation: int
    future: asyncio.Future[LaneStatus]
    task: asyncio.Task[None] | None = None
    from_lane: str = "none"
    started: float = field(default_factory=time.monotonic)
    force: bool = False  # start despite preflight errors
    unattended: bool = False  # laned's own (at start): a refusal fails the lane, visibly
    findings: list[Finding] | None = None  # a preflight its caller already ran
    desired_before: dict[str, Desired] = field(default_factory=dict)  # restored if refused


@dataclass
class ExitRecord:
    """What the serve wrapper wrote about the engine's exit."""

    status: int
    requested: bool
    at: float
    oom_killed: bool = False


def read_exit_record(path: str) -> ExitRecord | None:
    """Parse the wrapper's `status=N requested=0|1 at=EPOCH [oom=0|1]` line."""
    try:
        with open(path, encoding="utf-8") as handle:
            fields = dict(part.split("=", 1) for part in handle.read().split() if "=" in part)
        return ExitRecord(
            int(fields["status"]),
            fields["requested"] == "1",
            float(fields["at"]),
            fields.get("oom") == "1",
        )
    except (OSError, KeyError, ValueError):
        return None


@dataclass
class Supervisor:
    """Owns every lane's state; talks to systemd and the engines."""

    config: Config
    systemd: Systemd
    probe: Probe
    systemd_version: int = render.DEFAULT_SYSTEMD_VERSION
    host: Host | None = None  # podman and NVML: preflight, the GPU gate, containers
    clock: Callable[[], float] = time.time
    statuses: dict[str, LaneStatus] = field(default_factory=dict)
    events: deque[Event] = field(default_factory=lambda: deque(maxlen=state.EVENTS_KEPT))
    listeners: list[Callable[[Event], None]] = field(default_factory=list)
    snapshots: dict[str, UnitSnapshot] = field(default_factory=dict)
    recorder: Recorder = field(default_factory=Recorder)

    def __post_init__(self) -> None:
        self.units = {unit_name(n, spec): n for n, spec in self.config.lanes.items()}
        self.statuses = {n: LaneStatus(n) for n in self.config.lanes}
        self.systemd_restarts = self.systemd_version >= RESTART_STEPS_SINCE
        self._ops: dict[str, Operation] = {}
        self._generation = 0
        self._stopping: set[str] = set()
        self._follow: dict[str, asyncio.Task[None]] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._waiters: dict[str, list[asyncio.Future[LaneStatus]]] = {}
        self._started_at: dict[str, float] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._pokes: dict[str, asyncio.Event] = {}
        self._log_task: asyncio.Task[None] | None = None
        self._samples: dict[str, deque[tuple[float, EngineSample]]] = {}
        self._check_degraded: set[str] = set()  # degraded by a failed check, still serving
        self._closing = False

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Load the saved state, connect to systemd, reconcile with what runs."""
        saved = state.load(self.config.daemon.state_dir)
        for name, status in self.statuses.items():
            status.desired = saved.desired.get(name, Desired.INACTIVE)
            status.restarts = saved.restarts.get(name, 0)
            status.last_exit = saved.last_exit.get(name)
            status.last_cold_start = saved.last_cold_start.get(name)
            status.last_phases = saved.last_phases.get(name, {})
            status.image_id = saved.image_ids.get(name)
            status.checks = state.load_checks(self.config.daemon.state_dir, name)
            status.since = self.clock()
            if name in saved.failed:
                # A lane that gave up (crash loop, start timeout) stays failed until activated.
                status.state, status.reason = LaneState.FAILED, saved.failed[name]
        self.events.extend(e for e in saved.events if e.lane in self.statuses)
        await self._connect()
        self._log_task = self._spawn(self._follow_logs())
        await self.reconcile(first=not saved.desired)
        self._spawn(self._keep_bus())

    async def close(self) -> None:
        """Stop watching (the lanes keep running: they are systemd's units)."""
        self._closing = True
        for timer in self._timers.values():
            timer.cancel()
        tasks = [
            *self._tasks,
            *self._follow.values(),
            *(op.task for op in self._ops.values() if op.task),
        ]
        for task in tasks:
            task.cancel()
        if tasks:
            _done, pending = await asyncio.wait(tasks, timeout=10)
            for task in pending:
                log.error("a supervisor task did not stop: %r", task)
        self.systemd.disconnect()

    async def _connect(self) -> None:
        self.systemd.on_unit_change = self._on_unit_change
        self.systemd.on_manager_restart = self._on_manager_restart
        if self.systemd.bus is None or not self.systemd.bus.connected:
            await self.systemd.connect()
        for unit in self.units:
            with contextlib.suppress(SystemdError):
                await self.systemd.ref_unit(unit)

    def _on_manager_restart(self) -> None:
        self._spawn(self._resync("the user manager was re-executed"))

    async def _keep_bus(self) -> None:
        """Reconnect when the bus connection drops, and catch up with what changed meanwhile."""
        while not self._closing:
            await self.systemd.wait_closed()
            if self._closing:
                return
            log.warning("lost the user bus; reconnecting")
            delay = 0.05
            while not self._closing:
                try:
                    await self._connect()
                    break
                except LanedError as exc:
                    log.warning("reconnect failed: %s", exc)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
            await self._resync("reconnected to the user bus")

    async def _resync(self, why: str) -> None:
        log.info("%s: re-reading every lane unit", why)
        # Right after a re-exec the manager may not have its bus name back yet; until the
        # subscription is renewed it sends no signals, so keep trying (bounded).
        delay, deadline = 0.02, time.monotonic() + 30
        while True:
            try:
                await self.systemd.subscribe()
                break
            except SystemdError as exc:
                if time.monotonic() > deadline:
                    log.error("cannot subscribe to the user manager again: %s", exc)
                    break
                await asyncio.sleep(delay)
                delay = min(delay * 2, 1.0)
        for unit, lane in self.units.items():
            try:
                await self.systemd.ref_unit(unit)  # a re-exec forgets clients' references
                snap = await self.systemd.snapshot(unit)
            except SystemdError:
                continue
            self._apply(lane, snap)

    async def reconcile(self, first: bool = False) -> None:
        """Adopt lanes that already run (never restart a healthy one); start the desired ones."""
        running: list[str] = []
        for unit, lane in self.units.items():
            snap = await self.systemd.snapshot(unit)
            self.snapshots[lane] = snap
            if snap.running:
                running.append(lane)
        for lane in running:
            status = self.statuses[lane]
            status.desired = Desired.ACTIVE
            if lane not in self._started_at:
                self._begin_start(lane)
            self._transition(lane, LaneState.STARTING, "adopted: already running")
            self._start_follow(lane)
        for lane, status in self.statuses.items():
            if (
                status.desired is Desired.ACTIVE
                and lane not in running
                and status.state is not LaneState.FAILED
            ):
                self._spawn_activation(lane, "restore the desired lane")
        if first and not running and self.config.daemon.default_lane:
            self._spawn_activation(self.config.daemon.default_lane, "default lane")

    # --- requests -------------------------------------------------------------------------

    async def reload(self, new: Config) -> dict[str, Any]:
        """Apply a new, already validated config; nothing running is disturbed.

        Refused (ConfigRefused, the running config stays in force): removing or renaming
        the unit of a lane that runs, or changing daemon settings only a restart applies.
        """
        problems = []
        for key in ("listen", "token_file", "state_dir"):
            if getattr(new.daemon, key) != getattr(self.config.daemon, key):
                problems.append(f"daemon.{key} changed: restart laned to apply it")
        for lane, status in self.statuses.items():
            busy = status.state is not LaneState.INACTIVE and status.state is not LaneState.FAILED
            if not busy:
                continue
            if lane not in new.lanes:
                problems.append(
                    f"lanes.{lane} is {status.state.value}: deactivate it before removing it"
                )
            elif unit_name(lane, new.lanes[lane]) != unit_name(lane, self.config.lanes[lane]):
                problems.append(
                    f"lanes.{lane}.unit changed while it is {status.state.value}: deactivate it first"
                )
        if problems:
            raise ConfigRefused(
                "the new config cannot be applied while laned runs", "; ".join(problems)
            )
        changes = render.apply(new, self.systemd_version)
        await self.systemd.reload()
        restart_needed = sorted(
            lane
            for lane, status in self.statuses.items()
            if lane in new.lanes
            and status.state in (*RUNNING_STATES, LaneState.RESTARTING)
            and new.lanes[lane] != self.config.lanes[lane]
        )
        self.config = new
        self.units = {unit_name(n, spec): n for n, spec in new.lanes.items()}
        for lane in list(self.statuses):
            if lane not in new.lanes:
                del self.statuses[lane]
        for lane in new.lanes:
            if lane not in self.statuses:
                self.statuses[lane] = LaneStatus(lane, since=self.clock())
        for unit in self.units:
            with contextlib.suppress(SystemdError):
                await self.systemd.ref_unit(unit)
        if self._log_task is not None:
            self._log_task.cancel()
        self._log_task = self._spawn(self._follow_logs())
        self._save()
        return {
            "applied": True,
            "changed": [path for action, path in changes if action is not render.Action.UNCHANGED],
            "restart_needed": restart_needed,
        }

    def spec(self, lane: str) -> LaneConfig:
        """The lane's config; UnknownLane with the known names otherwise."""
        return self.config.lane(lane)

    def activate(
        self,
        lane: str,
        reason: str = "activate",
        force: bool = False,
        findings: list[Finding] | None = None,
    ) -> asyncio.Future[LaneStatus]:
        """Make `lane` the running lane of its group; the future resolves when it is ready.

        Preflight runs first, before anything is stopped: an error refuses the activation
        (unless `force`) and leaves the running lane and the desired lanes as they were.
        `findings`: a preflight the caller ran just now (the API does), not run again."""
        spec = self.spec(lane)
        status = self.statuses[lane]
        current = self._ops.get(spec.group)
        if current is not None and current.lane == lane and current.kind == "activate":
            return current.future  # already on its way: join it
        if status.desired is Desired.ACTIVE and status.state in (
            *RUNNING_STATES,
            LaneState.RESTARTING,
        ):
            return self._wait_ready(lane)  # idempotent: nothing is restarted
        if current is not None:
            self._supersede(current, f"superseded by activate {lane}")
        before = {n: self.statuses[n].desired for n in (lane, *self._group(lane))}
        self._desire_only(lane)
        status.failures.clear()
        op = self._new_op(lane, "activate", spec.group)
        op.force, op.desired_before, op.findings = force, before, findings
        running = [
            p
            for p in self._group(lane)
            if self.statuses[p].state in (*RUNNING_STATES, LaneState.RESTARTING)
        ]
        op.from_lane = running[0] if running else "none"
        op.task = self._spawn(self._run_activation(op, reason))
        return op.future

    def deactivate(self, lane: str) -> asyncio.Future[LaneStatus]:
        """Stop `lane`; a stop laned asked for is never counted as a failure."""
        spec = self.spec(lane)
        current = self._ops.get(spec.group)
        self._set_desired(lane, Desired.INACTIVE)
        self._cancel_restart(lane)
        if current is not None and current.lane != lane:
            # Another lane of the group is being activated, which stops this one anyway:
            # stop it alongside without displacing that operation.
            op = Operation(lane, "deactivate", 0, asyncio.get_running_loop().create_future())
            op.future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        else:
            if current is not None:
                self._supersede(current, f"superseded by deactivate {lane}")
            op = self._new_op(lane, "deactivate", spec.group)
        op.task = self._spawn(self._run_deactivation(op))
        return op.future

    def restart(self, lane: str, reason: str = "restart requested") -> asyncio.Future[LaneStatus]:
        """Stop and start `lane` again (it must be desired active)."""
        self.spec(lane)
        if self.statuses[lane].desired is not Desired.ACTIVE:
            return self.activate(lane)
        self._restart(lane, reason)
        return self._wait_ready(lane)

    # --- operations -----------------------------------------------------------------------

    def _new_op(self, lane: str, kind: str, group: str) -> Operation:
        self._generation += 1
        op = Operation(lane, kind, self._generation, asyncio.get_running_loop().create_future())
        op.future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        self._ops[group] = op
        return op

    def _current(self, op: Operation) -> bool:
        return self._ops.get(self.config.lanes[op.lane].group) is op

    def _supersede(self, op: Operation, why: str) -> None:
        if op.task is not None:
            op.task.cancel()
        error = Superseded(why, "the newest request for a group wins")
        self._record_swap(op, error)
        if not op.future.done():
            op.future.set_exception(error)
        self._ops.pop(self.config.lanes[op.lane].group, None)

    def _record_swap(self, op: Operation, error: BaseException | None) -> None:
        if op.kind != "activate" or op.future.done():
            return
        result = (
            "ready"
            if error is None
            else "superseded"
            if isinstance(error, Superseded)
            else "failed"
        )
        self.recorder.swap(op.from_lane, op.lane, result, time.monotonic() - op.started)

    def _finish(self, op: Operation, error: LanedError | None = None) -> None:
        self._record_swap(op, error)
        if not op.future.done():
            if error is None:
                op.future.set_result(self.statuses[op.lane])
            else:
                op.future.set_exception(error)
        if self._current(op):
            self._ops.pop(self.config.lanes[op.lane].group, None)

    def _spawn_activation(self, lane: str, reason: str) -> None:
        """An activation laned makes itself (the desired or default lane at start)."""
        future = self.activate(lane, reason)
        op = self._ops.get(self.config.lanes[lane].group)
        if op is not None and op.future is future:
            op.unattended = True  # nobody waits for it: a refusal must show in the lane's state
        future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)

    async def _run_activation(self, op: Operation, reason: str) -> None:
        lane = op.lane
        try:
            if not await self._preflight_passes(op):
                return
            for peer in self._group(lane):
                await self._stop_and_confirm(peer, f"swap to {lane}")
                if not self._current(op):
                    self._finish(op, Superseded(f"activate {lane} was replaced by a newer request"))
                    return
            if await self._still_ending(lane):
                # Its own earlier run is still ending (the stop of a deactivate this request
                # superseded): that run's exit must reach laned before the new run is
                # followed, or it would be taken for the new run's and end its watch.
                await self._stop_and_confirm(lane, f"its earlier run ends before activate {lane}")
            refused = await self._clear_for_start(lane)
            if not self._current(op):
                self._finish(op, Superseded(f"activate {lane} was replaced by a newer request"))
                return
            if refused is not None:
                self._fail_start(lane, refused)
                self._finish(op, ActivationFailed(f"lane {lane}: {refused}", "see `laned events`"))
                return
            waiter = self._wait_ready(lane)
            await self._start_unit(lane, reason)
            await waiter
            self._finish(op)
        except asyncio.CancelledError:
            raise
        except LanedError as exc:
            self._finish(
                op,
                exc if isinstance(exc, ActivationFailed) else ActivationFailed(str(exc), exc.hint),
            )

    async def preflight(self, lane: str) -> list[Finding]:
        """The lane's preflight findings as of now ([] without a host adapter)."""
        spec = self.spec(lane)
        if self.host is None:
            return []
        peer = next(
            (
                p
                for p in (lane, *self._group(lane))
                if self.config.lanes[p].port == spec.port
                and self.statuses[p].state in (*RUNNING_STATES, LaneState.RESTARTING)
            ),
            None,
        )
        return await self.host.preflight(self.config, lane, peer, self.statuses[lane].image_id)

    async def _preflight_passes(self, op: Operation) -> bool:
        """Run preflight; on errors (not forced) refuse the activation and undo its desire."""
        lane = op.lane
        findings = op.findings if op.findings is not None else await self.preflight(lane)
        if not self._current(op):
            self._finish(op, Superseded(f"activate {lane} was replaced by a newer request"))
            return False
        errors = blocking(findings)
        warnings = [f for f in findings if f.severity is Severity.WARNING]
        if findings:
            summary = "; ".join(f.message for f in [*errors, *warnings]) or "notes only"
            self._note(
                lane,
                EventKind.PREFLIGHT,
                f"preflight: {len(errors)} error(s), {len(warnings)} warning(s): {summary}",
            )
        if not errors:
            return True
        self.recorder.preflight_refused(lane)
        if op.force:
            self._note(lane, EventKind.PREFLIGHT, "preflight errors overridden (force)")
            return True
        for name, desired in op.desired_before.items():
            self.statuses[name].desired = desired
        message, hint = refusal(lane, findings)
        if op.unattended:
            self._fail_start(lane, message.removeprefix(f"lane {lane}: "))
        self._save()
        self._finish(op, PreflightFailed(message, hint, findings))
        return False

    async def _clear_for_start(self, lane: str) -> str | None:
        """Before a start: `prepare` after an image change, the GPU memory released, the port
        free. The reason it cannot start, or None."""
        spec = self.config.lanes[lane]
        if self.host is not None and spec.container is not None:
            try:
                image = await self.host.image_id(spec)
            except PodmanError:
                image = None  # preflight already warned; podman itself will say at start
            last = self.statuses[lane].image_id
            if image and last and image != last and spec.prepare:
                self._note(lane, EventKind.PREPARE, "image changed: running prepare")
                try:
                    await run_prepare(
                        lane, spec, lambda line: self._note(lane, EventKind.PREPARE, line)
                    )
                except LanedError as exc:
                    return f"prepare: {exc.message}"
        if self.host is not None and spec.gpu_gate.enabled:
            result, why = await self.host.gpu_gate(spec)
            if result is None:
                self._note(lane, EventKind.GATE, f"GPU-memory gate skipped: {why}")
            else:
                self.recorder.gpu_gate(lane, result.released, result.waited)
                if not result.released:
                    self._note(lane, EventKind.GATE, "GPU-memory gate timed out")
                    return f"gpu-gate: still held after {result.waited:.1f}s: " + "; ".join(
                        result.still_held
                    )
                self._note(
                    lane,
                    EventKind.GATE,
                    f"GPU memory released after {result.waited:.3f}s ({result.polls} reading(s))",
                )
        deadline = time.monotonic() + 5
        while await asyncio.to_thread(port_busy, spec.port):
            # A stopped engine's listener is gone at once; give a slow exit a moment.
            if time.monotonic() > deadline:
                return (
                    f"port {spec.port} is still in use after the group's other lanes stopped "
                    f"(find it: ss -ltnp 'sport = :{spec.port}')"
                )
            await asyncio.sleep(0.1)
        return None

    def _fail_start(self, lane: str, reason: str) -> None:
        self._transition(lane, LaneState.FAILED, reason)
        self._fail_waiters(lane, reason)

    def _note(self, lane: str, kind: EventKind, text: str) -> None:
        """An event that changes no state (preflight, gate, prepare output, checks)."""
        state_now = self.statuses[lane].state
        event = Event(self.clock(), lane, state_now, state_now, text, kind)
        self.events.append(event)
        log.info("%s: %s: %s", lane, kind.value, text)
        for listener in list(self.listeners):
            listener(event)

    async def _run_deactivation(self, op: Operation) -> None:
        try:
            await self._stop_and_confirm(op.lane, "deactivate")
            self._finish(op)
        except asyncio.CancelledError:
            raise
        except LanedError as exc:
            self._finish(op, exc)

    async def _stop_and_confirm(self, lane: str, reason: str) -> None:
        """Stop the lane's unit and confirm it is gone (for containers, ExecStopPost removed it)."""
        status = self.statuses[lane]
        self._cancel_restart(lane)
        self._stop_follow(lane)
        self._fail_waiters(lane, reason, superseded=True)
        unit = unit_name(lane, self.config.lanes[lane])
        if not await self._still_ending(lane):
            # Not running (a failed lane included: deactivating it acknowledges the failure).
            if status.state is not LaneState.INACTIVE:
                self._transition(lane, LaneState.INACTIVE, reason)
            return
        self._stopping.add(lane)
        try:
            self._transition(lane, LaneState.STOPPING, reason)
            await self.systemd.stop_unit(unit)
            snap = await self.systemd.snapshot(unit)
            if snap.running:
                raise ActivationFailed(
                    f"{unit} is still {snap.active_state} after its stop job", "see `laned logs`"
                )
            await self._confirm_container_gone(lane)
        finally:
            self._stopping.discard(lane)
        if self.statuses[lane].state is LaneState.STOPPING:
            self._transition(lane, LaneState.INACTIVE, reason)

    async def _still_ending(self, lane: str) -> bool:
        """Whether the lane's unit runs or is stopping, by systemd or by what laned has seen.

        systemd may answer "inactive" before its signal of that change reached laned; then
        the stop job that follows ends at once, and systemd sends a unit's pending change
        before the end of a job (bus_job_send_removed_signal), so laned has seen the exit."""
        snap = await self.systemd.snapshot(unit_name(lane, self.config.lanes[lane]))
        seen = self.snapshots.get(lane, snap)
        return any(s.running or s.active_state == "deactivating" for s in (snap, seen))

    async def _confirm_container_gone(self, lane: str) -> None:
        """A stopped container lane's container must be gone before the next lane starts."""
        spec = self.config.lanes[lane]
        if self.host is None or spec.container is None:
            return
        try:
            gone = await self.host.wait_container_gone(lane, spec, spec.stop_timeout)
        except PodmanError as exc:
            self._note(lane, EventKind.GATE, f"cannot confirm the container is gone: {exc.message}")
            return
        if not gone:
            reason = f"its container is still there {spec.stop_timeout:g}s after the stop"
            self._transition(lane, LaneState.FAILED, reason)  # not left `stopping` forever
            raise ActivationFailed(
                f"lane {lane}: {reason}",
                "see `podman ps -a`; remove it with `podman rm -f` and activate again",
            )

    async def _start_unit(self, lane: str, reason: str) -> None:
        unit = unit_name(lane, self.config.lanes[lane])
        self._begin_start(lane)
        self._transition(lane, LaneState.STARTING, reason)
        self._start_follow(lane)
        await self.systemd.reset_failed_unit(unit)
        result = await self.systemd.start_unit(unit)
        if result not in ("done", "skipped"):
            log.warning("start job of %s ended %s", unit, result)

    def _restart(self, lane: str, reason: str, kind: str = "requested") -> None:
        """Restart a desired lane: `restarting` now (so waiters made after this wait for the
        new run), then stop and start it in a task."""
        status = self.statuses[lane]
        if status.desired is not Desired.ACTIVE:
            return
        status.restarts += 1
        self.recorder.restart(lane, kind)
        self._cancel_restart(lane)
        self._stop_follow(lane)
        self._stopping.add(lane)
        self._transition(lane, LaneState.RESTARTING, reason)
        self._spawn(self._stop_then_start(lane, reason))

    async def _stop_then_start(self, lane: str, reason: str) -> None:
        status = self.statuses[lane]
        try:
            await self.systemd.stop_unit(unit_name(lane, self.config.lanes[lane]))
        finally:
            self._stopping.discard(lane)
        if status.desired is Desired.ACTIVE and status.state is LaneState.RESTARTING:
            refused = await self._clear_for_start(lane)
            if refused is not None:
                self._fail_start(lane, refused)
                return
            await self._start_unit(lane, f"restart: {reason}")

    # --- readiness and liveness -------------------------------------------------------------

    def _start_follow(self, lane: str) -> None:
        self._stop_follow(lane)
        task = asyncio.get_running_loop().create_task(self._follow_lane(lane))
        task.add_done_callback(self._task_done)
        self._follow[lane] = task

    def _stop_follow(self, lane: str) -> None:
        task = self._follow.pop(lane, None)
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    async def _follow_lane(self, lane: str) -> None:
        """Readiness (fast probing backing off over a long cold start), then liveness."""
        spec = self.config.lanes[lane]
        status = self.statuses[lane]
        started = time.monotonic()
        interval = spec.probe.start_interval_min
        key = read_api_key(spec.api_key_file)
        while True:
            if await self.probe.health(spec.port, spec.health_path):
                models = await self.probe.models(spec.port, key)
                if models is not None and spec.served_model_name in models:
                    break
            if time.monotonic() - started >= spec.start_timeout:
                self._spawn(
                    self._give_up(lane, f"start-timeout: not ready within {spec.start_timeout:g}s")
                )
                return
            # Probing backs off over a long cold start, but the engine's own "startup
            # complete" log line (see _follow_logs) wakes it at once.
            poke = self._pokes.setdefault(lane, asyncio.Event())
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(poke.wait(), interval)
            poke.clear()
            interval = min(interval * 1.5, spec.probe.start_interval_max)
        if status.state is not LaneState.STARTING:
            return
        now = self.clock()
        status.last_cold_start = round(now - self._started_at.get(lane, now), 3)
        self.recorder.cold_start(lane, status.last_cold_start)
        if status.phases:
            status.last_phases = dict(phase_durations(status.phases, now))
        await self._record_image(lane)
        if status.state is not LaneState.STARTING:
            return
        status.phase, status.progress = None, None
        status.failures.clear()
        self._transition(
            lane, LaneState.READY, "health 200 and /v1/models lists " + spec.served_model_name
        )
        if spec.checks.after_activate:
            self._spawn(self._auto_check(lane))
        await self._watch_liveness(lane)

    async def _record_image(self, lane: str) -> None:
        """Remember the image of a good start: a different one later is image drift."""
        spec = self.config.lanes[lane]
        if self.host is None or spec.container is None:
            return
        try:
            # The image the container runs (it may have been rebuilt since it started).
            running = await self.host.podman.container(container_name(lane, spec))
            image = running.image_id if running else await self.host.image_id(spec)
        except PodmanError as exc:
            log.warning("%s: cannot record the image id: %s", lane, exc.message)
            return
        if image:
            self.statuses[lane].image_id = image

    async def _follow_logs(self) -> None:
        """Startup phases of starting lanes, from their engines' log lines (one journalctl)."""
        async for unit, line in journal.follow(self.units):
            lane = self.units.get(unit)
            if lane is None:
                continue
            status = self.statuses[lane]
            found = parse_phase(line) if status.state is LaneState.STARTING else None
            if found is not None:
                status.phase, status.progress = found
                if not status.phases or status.phases[-1][0] != found[0]:
                    status.phases.append((found[0], self.clock()))
                if found[0] in ("starting API server", "serving"):
                    self._pokes.setdefault(lane, asyncio.Event()).set()

    async def _watch_liveness(self, lane: str) -> None:
        spec = self.config.lanes[lane]
        probe = spec.probe
        detector = StallDetector(probe.stall_after)
        failures = 0
        low_since: float | None = None
        while True:
            await asyncio.sleep(probe.interval)
            if not self._serving(lane):
                return
            if not await self.probe.health(spec.port, spec.health_path):
                failures += 1
                self.recorder.probe_failure(lane)
                if failures >= probe.failures:
                    self._degrade(lane, f"health: {failures} consecutive probe failures", "health")
                    return
                continue
            failures = 0
            sample = await self.probe.sample(spec.port)
            if sample is not None:
                window = self._samples.setdefault(lane, deque())
                window.append((time.monotonic(), sample))
                while window and window[0][0] < time.monotonic() - 60:
                    window.popleft()
            if sample is not None and detector.observe(sample, time.monotonic()):
                self.recorder.stall(lane)
                self._degrade(
                    lane,
                    f"stalled: {sample.running:g} running, {sample.waiting:g} waiting and no token "
                    f"for {probe.stall_after:g}s",
                    "stalled",
                )
                return
            if probe.memory_floor_gib > 0:
                available = meminfo().get("MemAvailable")
                if available is not None and available < probe.memory_floor_gib:
                    low_since = low_since if low_since is not None else time.monotonic()
                    if time.monotonic() - low_since >= probe.memory_floor_for:
                        reason = f"memory-guard: MemAvailable {available:.1f} GiB below the floor"
                        self._spawn(self._give_up(lane, reason))
                        return
                else:
                    low_since = None

    def _serving(self, lane: str) -> bool:
        """Ready, or degraded only by a failed acceptance check (it still serves; watch it)."""
        state_now = self.statuses[lane].state
        return state_now is LaneState.READY or (
            state_now is LaneState.DEGRADED and lane in self._check_degraded
        )

    # --- acceptance checks ---------------------------------------------------------------

    async def check(self, lane: str, gates: Sequence[str] = GATES) -> dict[str, Any]:
        """Run acceptance gates against the lane; keep, show and export the results.

        LaneNotRunning at once when the lane is not serving."""
        spec = self.spec(lane)
        status = self.statuses[lane]
        if status.state not in (LaneState.READY, LaneState.DEGRADED):
            raise LaneNotRunning(
                f"lane {lane} is {status.state.value}, not serving: no gate can run",
                f"activate it first: laned activate {lane} --wait",
            )
        client = EngineClient(
            f"http://127.0.0.1:{spec.port}",
            spec.served_model_name,
            read_api_key(spec.api_key_file),
            timeout=max(spec.checks.deadline, spec.checks.context_deadline) + 30,
        )

        def on_result(result: GateResult) -> None:
            verdict = "passed" if result.passed else f"failed: {result.reason}"
            self._note(lane, EventKind.CHECK, f"{result.gate} {verdict}")

        try:
            results = await run_gates(
                client, spec.checks, gates, status.last_cold_start, on_result=on_result
            )
        finally:
            await client.close()
        return self._record_checks(lane, results)

    def _record_checks(self, lane: str, results: Sequence[GateResult]) -> dict[str, Any]:
        status = self.statuses[lane]
        previous = (status.checks or {}).get("gates", {})
        digest = render.lane_digest(self.config, lane, self.systemd_version)
        if (status.checks or {}).get("config_hash") != digest:
            previous = {}  # results of another configuration do not carry over
        gates = {**previous, **{r.gate: r.to_json() for r in results}}
        run = {
            "lane": lane,
            "at": self.clock(),
            "config_hash": digest,
            "passed": all(g["passed"] for g in gates.values()),
            "gates": gates,  # this run's, and the earlier results of the same configuration
            "ran": [r.gate for r in results],
        }
        status.checks = run
        try:
            state.save_checks(self.config.daemon.state_dir, lane, run)
        except LanedError as exc:
            log.error("cannot save the check results of %s: %s", lane, exc)
        failed = [r for r in results if not r.passed]
        if failed and status.state is LaneState.READY:
            # It serves, but not as it should (word salad, a broken tool parser...): a
            # restart would not fix that, so the lane is degraded and left running.
            self._check_degraded.add(lane)
            self._transition(
                lane, LaneState.DEGRADED, f"check {failed[0].gate}: {failed[0].reason}"
            )
        elif not failed and lane in self._check_degraded and status.state is LaneState.DEGRADED:
            self._check_degraded.discard(lane)
            self._transition(lane, LaneState.READY, "the acceptance checks pass again")
        return run

    async def _auto_check(self, lane: str) -> None:
        try:
            await self.check(lane, self.config.lanes[lane].checks.after_activate)
        except LanedError as exc:
            self._note(lane, EventKind.CHECK, f"checks after activation did not run: {exc.message}")

    def _degrade(self, lane: str, reason: str, kind: str) -> None:
        self._transition(lane, LaneState.DEGRADED, reason)
        self._restart(lane, reason, kind)

    async def _give_up(self, lane: str, reason: str) -> None:
        """Stop the lane (a stop laned asked for) and leave it failed until the next activate."""
        self._stopping.add(lane)
        try:
            await self.systemd.stop_unit(unit_name(lane, self.config.lanes[lane]))
        finally:
            self._stopping.discard(lane)
        self._transition(lane, LaneState.FAILED, reason)
        self._fail_waiters(lane, reason)

    # --- what systemd tells us --------------------------------------------------------------

    def _on_unit_change(self, unit: str, props: dict[str, object]) -> None:
        lane = self.units.get(unit)
        if lane is None or self._closing:
            return
        previous = self.snapshots.get(lane, UnitSnapshot(unit))
        self._apply(lane, previous.update(props))

    def _apply(self, lane: str, snap: UnitSnapshot) -> None:
        """Compare a lane unit's new state with the last one seen and act on the difference."""
        previous = self.snapshots.get(lane, UnitSnapshot(snap.name))
        self.snapshots[lane] = snap
        status = self.statuses[lane]
        exited = snap.sub_state in EXITED_SUBSTATES and previous.sub_state not in EXITED_SUBSTATES
        if exited and previous.active_state != "inactive":
            self._on_exit(lane, snap)
        elif (
            snap.running
            and not previous.running
            and status.state in (LaneState.INACTIVE, LaneState.FAILED)
        ) and not self._starting_by_laned(lane):
            # Started behind laned's back (systemctl --user start): follow it.
            self._desire_only(lane)
            self._begin_start(lane)
            self._transition(lane, LaneState.STARTING, "started outside laned")
            self._start_follow(lane)

    def _starting_by_laned(self, lane: str) -> bool:
        op = self._ops.get(self.config.lanes[lane].group)
        return (
            op is not None and op.lane == lane and op.kind == "activate"
        ) or lane in self._timers

    def _on_exit(self, lane: str, snap: UnitSnapshot) -> None:
        spec = self.config.lanes[lane]
        status = self.statuses[lane]
        now = self.clock()
        record = read_exit_record(exit_record_path(self.config, lane))
        fresh = record is not None and record.at >= self._started_at.get(lane, 0) - 2
        oom = False
        if record is not None and fresh:
            code, signal = decode_status(record.status)
            by_systemd = record.requested
            oom = record.oom_killed
        elif snap.exec_main_code in (CLD_KILLED, CLD_DUMPED):
            code, signal, by_systemd = None, snap.exec_main_status, snap.result == "success"
        else:
            code, signal, by_systemd = snap.exec_main_status, None, snap.result == "success"
        verdict = judge_exit(lane in self._stopping, by_systemd)
        status.last_exit = LastExit(code, signal, now, verdict, oom)
        self.recorder.exit(lane, code, signal, verdict.value)
        what = f"signal {signal}" if signal is not None else f"status {code}"
        if oom:
            what += ", OOM-killed (podman: OOMKilled)"
        self._stop_follow(lane)
        if verdict is Verdict.REQUESTED:
            if lane in self._stopping or status.state in (LaneState.STOPPING, LaneState.RESTARTING):
                self._save()
                return  # laned's own stop: the operation makes the transition
            self._spawn(self._stopped_outside(lane, what))
            return
        status.failures.append(now)
        status.failures[:] = recent(status.failures, now, spec.start_limit_interval)
        reason = f"engine exited with {what} (failure)"
        if status.desired is not Desired.ACTIVE:
            self._transition(lane, LaneState.FAILED, reason)
            return
        if self.systemd_restarts and snap.sub_state == "auto-restart":
            status.restarts = max(status.restarts + 1, snap.n_restarts)
            self.recorder.restart(lane, "failure")
            self._transition(lane, LaneState.RESTARTING, f"{reason}; systemd restarts it")
            self._start_follow_after_restart(lane)
            return
        if is_crash_loop(status.failures, now, spec.start_limit_burst, spec.start_limit_interval):
            reason = (
                f"crash-loop: {len(status.failures)} failures within {spec.start_limit_interval:g}s; "
                f"last {reason}"
            )
            self._transition(lane, LaneState.FAILED, reason)
            self._fail_waiters(lane, reason)
            return
        delay = backoff_delay(spec.restart_sec, len(status.failures), spec.restart_max_delay)
        self._transition(lane, LaneState.RESTARTING, f"{reason}; restarting in {delay:g}s")
        self._cancel_restart(lane)
        loop = asyncio.get_running_loop()
        self._timers[lane] = loop.call_later(
            delay, lambda: self._spawn(self._restart_after_failure(lane))
        )

    async def _stopped_outside(self, lane: str, what: str) -> None:
        """A stop laned did not ask for: an operator's, unless the whole manager is going down."""
        try:
            stopping = await self.systemd.system_state() == "stopping"
        except LanedError:
            stopping = True  # the manager is unreachable: most likely on its way down
        status = self.statuses.get(lane)
        snap = self.snapshots.get(lane)
        if status is None or self._closing or (snap is not None and snap.running):
            return  # gone from the config, laned is stopping, or it was started again meanwhile
        if stopping:
            # Logout, reboot or `systemctl --user exit`: the lane should come back with laned.
            self._transition(lane, LaneState.INACTIVE, f"stopped with the user manager ({what})")
            return
        self._set_desired(lane, Desired.INACTIVE)
        self._transition(lane, LaneState.INACTIVE, f"stopped outside laned ({what})")
        self._fail_waiters(lane, "stopped outside laned")

    def _start_follow_after_restart(self, lane: str) -> None:
        self._begin_start(lane)
        self._start_follow(lane)

    def _begin_start(self, lane: str) -> None:
        """A new start of the lane: its clock and its phase timeline begin again."""
        now = self.clock()
        self._started_at[lane] = now
        self.statuses[lane].started_at = now
        self.statuses[lane].phases = []
        self._check_degraded.discard(lane)

    async def _restart_after_failure(self, lane: str) -> None:
        self._timers.pop(lane, None)
        status = self.statuses[lane]
        if status.desired is not Desired.ACTIVE or status.state is not LaneState.RESTARTING:
            return
        status.restarts += 1
        self.recorder.restart(lane, "failure")
        refused = await self._clear_for_start(lane)
        if refused is not None:
            self._fail_start(lane, refused)
            return
        await self._start_unit(lane, f"restart #{status.restarts} after a failure")

    def _cancel_restart(self, lane: str) -> None:
        timer = self._timers.pop(lane, None)
        if timer is not None:
            timer.cancel()

    def engine_summary(self, lane: str) -> dict[str, float] | None:
        """The engine's load from its /metrics (running lanes only), with tokens/s over a minute."""
        window = self._samples.get(lane)
        if not window or self.statuses[lane].state not in RUNNING_STATES:
            return None
        (t0, first), (t1, last) = window[0], window[-1]
        rate = (last.generation_tokens - first.generation_tokens) / (t1 - t0) if t1 > t0 else 0.0
        return {
            "requests_running": last.running,
            "requests_waiting": last.waiting,
            "kv_cache_usage": last.kv_cache_usage,
            "generation_tokens_per_second": round(max(rate, 0.0), 3),
        }

    # --- state, events, waiters --------------------------------------------------------------

    def _group(self, lane: str) -> list[str]:
        group = self.config.lanes[lane].group
        return sorted(n for n, s in self.config.lanes.items() if s.group == group and n != lane)

    def _set_desired(self, lane: str, desired: Desired) -> None:
        self.statuses[lane].desired = desired
        self._save()

    def _desire_only(self, lane: str) -> None:
        """`lane` desired active and its group peers not, saved once."""
        for peer in self._group(lane):
            self.statuses[peer].desired = Desired.INACTIVE
        self._set_desired(lane, Desired.ACTIVE)

    def _transition(self, lane: str, to: LaneState, reason: str) -> None:
        """The only place a lane's state changes: record the event, persist, notify."""
        status = self.statuses[lane]
        event = Event(self.clock(), lane, status.state, to, reason)
        status.state, status.since, status.reason = to, event.at, reason
        if to is not LaneState.STARTING:
            status.phase, status.progress = None, None
        self.events.append(event)
        log.info("%s: %s -> %s (%s)", lane, event.from_state.value, to.value, reason)
        self._save()
        if to is LaneState.READY:
            for waiter in self._waiters.pop(lane, []):
                if not waiter.done():
                    waiter.set_result(status)
        for listener in list(self.listeners):
            listener(event)

    def _wait_ready(self, lane: str) -> asyncio.Future[LaneStatus]:
        future: asyncio.Future[LaneStatus] = asyncio.get_running_loop().create_future()
        future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)
        if self.statuses[lane].state is LaneState.READY:
            future.set_result(self.statuses[lane])
        else:
            self._waiters.setdefault(lane, []).append(future)
        return future

    def _fail_waiters(self, lane: str, reason: str, superseded: bool = False) -> None:
        for waiter in self._waiters.pop(lane, []):
            if waiter.done():
                continue
            if superseded:
                waiter.set_exception(
                    Superseded(f"lane {lane}: {reason}", "the newest request for a group wins")
                )
            else:
                waiter.set_exception(
                    ActivationFailed(f"lane {lane}: {reason}", f"see `laned logs {lane}`")
                )

    def _save(self) -> None:
        saved = state.Saved(
            desired={n: s.desired for n, s in self.statuses.items()},
            restarts={n: s.restarts for n, s in self.statuses.items()},
            last_exit={n: s.last_exit for n, s in self.statuses.items() if s.last_exit},
            last_cold_start={
                n: s.last_cold_start for n, s in self.statuses.items() if s.last_cold_start
            },
            last_phases={n: s.last_phases for n, s in self.statuses.items() if s.last_phases},
            image_ids={n: s.image_id for n, s in self.statuses.items() if s.image_id},
            failed={n: s.reason for n, s in self.statuses.items() if s.state is LaneState.FAILED},
            events=list(self.events),
        )
        try:
            state.save(self.config.daemon.state_dir, saved)
        except LanedError as exc:
            log.error("cannot save state: %s", exc)

    def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("supervisor task failed: %r", task.exception())
