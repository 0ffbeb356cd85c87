"""The supervisor's decisions, pure: no I/O, no asyncio, no clock of its own.

Each function takes what the owner knows (lane states, the unit's last two snapshots, an
exit record, a config) and answers what to do; the owner (`laned.owner.supervisor`) acts on the
answer. Nothing here logs or changes anything, so every rule is tested without systemd.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from laned.config.model import Config, LaneConfig
from laned.config.names import unit_name
from laned.core.lanes import Desired, LaneState, Verdict
from laned.core.unit_state import AUTO_RESTART, CLD_DUMPED, CLD_KILLED, ActiveState, UnitSnapshot

# --- named state sets ---------------------------------------------------------------------

# The engine runs (or is starting): it serves, or will.
RUNNING_STATES = frozenset({LaneState.STARTING, LaneState.READY, LaneState.DEGRADED})
# The lane holds its GPUs and port, or is about to again (a restart is pending).
HOLDING_STATES = RUNNING_STATES | {LaneState.RESTARTING}
# Nothing of the lane runs and nothing is under way: a reload may change or remove it.
SETTLED_STATES = frozenset({LaneState.INACTIVE, LaneState.FAILED})


class OpKind(str, Enum):
    """What an operation of a group does."""

    ACTIVATE = "activate"
    DEACTIVATE = "deactivate"
    RESTART = "restart"


class RestartKind(str, Enum):
    """Why a lane is restarted (the `reason` label of laned_lane_restarts_total)."""

    REQUESTED = "requested"
    FAILURE = "failure"
    HEALTH = "health"
    STALLED = "stalled"


class SwapResult(str, Enum):
    """How an activation ended (the `result` label of laned_swaps_total)."""

    READY = "ready"
    SUPERSEDED = "superseded"
    FAILED = "failed"


def peers(config: Config, lane: str) -> list[str]:
    """The other lanes of the lane's group (they conflict with it), sorted."""
    group = config.lanes[lane].group
    return sorted(n for n, s in config.lanes.items() if s.group == group and n != lane)


def already_active(state: LaneState, desired: Desired) -> bool:
    """Activating this lane changes nothing: it is desired and holds its GPUs (or will).
    The one rule for "already running" (an activation joins instead; preflight is skipped)."""
    return desired is Desired.ACTIVE and state in HOLDING_STATES


def port_peer(config: Config, lane: str, states: Mapping[str, LaneState]) -> str | None:
    """The lane of the group (itself included) that holds the lane's port now, if any:
    preflight does not call a port busy that a swap is about to free."""
    port = config.lanes[lane].port
    for name in (lane, *peers(config, lane)):
        if config.lanes[name].port == port and states[name] in HOLDING_STATES:
            return name
    return None


# --- requests -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Current:
    """The operation a group has under way, as policy sees it."""

    lane: str
    kind: OpKind


class Admit(str, Enum):
    """What a new request does with the group's operation under way."""

    JOIN = "join"  # the same request is on its way: wait for it
    WAIT_READY = "wait-ready"  # nothing to do but wait until the lane is ready
    ALONGSIDE = "alongside"  # run beside the current operation, which it does not contradict
    REPLACE = "replace"  # supersede the current operation (the newest request wins)


def admit_activate(lane: str, current: Current | None, state: LaneState, desired: Desired) -> Admit:
    """An activation: join one on its way, wait if the lane already runs, else replace."""
    if current is not None and current.lane == lane and current.kind is OpKind.ACTIVATE:
        return Admit.JOIN
    if already_active(state, desired):
        return Admit.WAIT_READY  # a restart under way included: it ends with the lane ready
    return Admit.REPLACE


def admit_deactivate(lane: str, current: Current | None) -> Admit:
    """A deactivation replaces the group's operation unless that one works on another lane
    (an activation of a peer stops this lane anyway, a peer's restart is not this lane's)."""
    if current is not None and current.lane != lane:
        return Admit.ALONGSIDE
    return Admit.REPLACE


def admit_restart(lane: str, current: Current | None) -> Admit:
    """A restart of a desired lane: an activation or restart of it on its way already ends
    in a fresh ready run; anything else of the group is replaced."""
    if current is not None and current.lane == lane and current.kind is not OpKind.DEACTIVATE:
        return Admit.JOIN
    return Admit.REPLACE


# --- what systemd tells -------------------------------------------------------------------


class UnitChange(str, Enum):
    """What a change of a lane unit means to laned."""

    NOTHING = "nothing"
    EXITED = "exited"  # the main process is gone
    STARTED_OUTSIDE = "started-outside"  # `systemctl --user start` behind laned's back


def judge_unit_change(
    previous: UnitSnapshot, now: UnitSnapshot, state: LaneState, starting_by_laned: bool
) -> UnitChange:
    """Compare a unit's new snapshot with the last one seen."""
    if now.exited and not previous.exited and previous.active_state != ActiveState.INACTIVE:
        return UnitChange.EXITED
    if now.running and not previous.running and state in SETTLED_STATES and not starting_by_laned:
        return UnitChange.STARTED_OUTSIDE
    return UnitChange.NOTHING


@dataclass(frozen=True)
class ExitRecord:
    """What the serve wrapper wrote about the engine's exit: `requested` when a stop reached
    it while the engine ran, `late` when one came only after the engine had exited."""

    status: int
    requested: bool
    at: float
    oom_killed: bool = False
    late: bool = False


def parse_exit_record(text: str) -> ExitRecord | None:
    """Parse the wrapper's `status=N requested=0|1 [late=0|1] at=EPOCH [oom=0|1]` line."""
    try:
        fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
        return ExitRecord(
            int(fields["status"]),
            fields["requested"] == "1",
            float(fields["at"]),
            fields.get("oom") == "1",
            fields.get("late") == "1",
        )
    except (KeyError, ValueError):
        return None


def decode_status(status: int) -> tuple[int | None, int | None]:
    """Split a shell-style status into (code, signal): 137 -> (None, 9), 3 -> (3, None)."""
    if status > 128 and status - 128 < 65:
        return None, status - 128
    return status, None


@dataclass(frozen=True)
class ExitFacts:
    """An engine exit as far as it can be known: code or signal, who asked, OOM.

    `witnessed`: the serve wrapper saw the exit and wrote down whether a stop reached the
    engine before it (`requested_by_systemd`), so the order is known; without its record
    only systemd's Result says whether the unit was stopped. `late_stop`: a stop arrived
    after the engine had already exited (during the wrapper's clean-up)."""

    code: int | None
    signal: int | None
    requested_by_systemd: bool
    oom_killed: bool
    lost: bool = False  # its user manager went away (killed), and the engine with it
    witnessed: bool = False
    late_stop: bool = False
    timed_out: bool = False  # systemd's Result=timeout: it killed what outlived stop_timeout

    def describe(self, command: str = "") -> str:
        """`status N` or `signal N`, with what it usually means and OOM where podman said so."""
        if self.lost:
            return "no status known: the user manager that ran it went away, and the engine with it"
        what = f"signal {self.signal}" if self.signal is not None else f"status {self.code}"
        meaning = explain_exit(self.code, self.signal, command)
        if self.timed_out and self.signal == 9:  # vLLM with a wedged EngineCore (docs/simulator.md)
            meaning = (
                "SIGKILL from systemd: not gone within stop_timeout of SIGTERM (Result=timeout)"
            )
        what += f" ({meaning})" if meaning else ""
        return what + (", OOM-killed (podman: OOMKilled)" if self.oom_killed else "")


WRAPPER_EXIT_0 = 75  # the serve wrapper's status for an engine that exited 0 on its own


def explain_exit(code: int | None, signal: int | None, command: str = "") -> str:
    """What an exit status usually means: shells' 126/127, 128+N for a signal (how a
    container reports one), laned's own 75; "" when it means nothing in particular."""
    if signal is None and code is not None and code > 128:
        signal = code - 128
    if signal is not None:
        return {
            9: "SIGKILL: killed, often by the kernel's OOM killer (journalctl -k | grep -i oom)",
            11: "SIGSEGV: the engine crashed (segmentation fault)",
            6: "SIGABRT: the engine aborted (a failed assertion, often in CUDA or NCCL)",
            15: "SIGTERM: asked to stop",
        }.get(signal, "")
    named = f": {command}" if command else ""
    return {
        126: f"the command is not executable{named}",
        127: f"command not found{named}",
        WRAPPER_EXIT_0: "laned's wrapper: the engine exited with status 0 on its own",
    }.get(code or 0, "")


def exit_facts(record: ExitRecord | None, started_at: float, snap: UnitSnapshot) -> ExitFacts:
    """The wrapper's record of this run where there is one (the engine's own status, not the
    wrapper's mapping of it), else what systemd says about the unit's main process."""
    if record is not None and record.at >= started_at - 2:
        code, signal = decode_status(record.status)
        return ExitFacts(
            code, signal, record.requested, record.oom_killed, witnessed=True, late_stop=record.late
        )
    by_systemd = snap.result == "success"
    timed_out = snap.result == "timeout"
    if snap.exec_main_code in (CLD_KILLED, CLD_DUMPED):
        return ExitFacts(None, snap.exec_main_status, by_systemd, False, timed_out=timed_out)
    return ExitFacts(snap.exec_main_status, None, by_systemd, False, timed_out=timed_out)


# A run that a new user manager knows nothing of (the one that ran it was killed): a failure.
LOST_WITH_MANAGER = ExitFacts(None, None, False, False, lost=True)


def judge_exit(requested_by_laned: bool, facts: ExitFacts) -> Verdict:
    """An exit is `requested` only when a stop somebody asked for reached the engine before
    it exited; anything else — status 0 too — fails. Where the wrapper saw the exit, its
    record decides: an engine that exited before laned's stop reached it (laned restarting
    it after failed probes, say) exited on its own. Without the record, a stop laned or
    systemd was making is taken as the cause."""
    if facts.witnessed:
        return Verdict.REQUESTED if facts.requested_by_systemd else Verdict.FAILURE
    return (
        Verdict.REQUESTED if requested_by_laned or facts.requested_by_systemd else Verdict.FAILURE
    )


def recent(failures: Iterable[float], now: float, interval: float) -> list[float]:
    """The failure times within the last `interval` seconds."""
    return [t for t in failures if now - t <= interval]


def is_crash_loop(failures: Iterable[float], now: float, burst: int, interval: float) -> bool:
    """`burst` failures within `interval` seconds: stop restarting (systemd's StartLimitBurst rule)."""
    return len(recent(failures, now, interval)) >= burst


@dataclass(frozen=True)
class Counted:
    """A failure of a run added to the lane's window: the window after it, and whether it
    makes a crash loop (`reason` then says so)."""

    failures: tuple[float, ...]
    crash_loop: bool
    reason: str


def count_failure(spec: LaneConfig, failures: Iterable[float], now: float, what: str) -> Counted:
    """Add one failure (`what`: how it was seen) to the lane's recent failures. A run fails
    once, whichever path saw it first: the owner calls this once per run."""
    window = tuple(recent([*failures, now], now, spec.start_limit_interval))
    if is_crash_loop(window, now, spec.start_limit_burst, spec.start_limit_interval):
        reason = (
            f"crash-loop: {len(window)} failures within {spec.start_limit_interval:g}s; last {what}"
        )
        return Counted(window, True, reason)
    return Counted(window, False, what)


def backoff_delay(base: float, failures: int, cap: float) -> float:
    """Exponential backoff: base, 2×base, 4×base … up to `cap`, for the n-th failure in a row."""
    if failures <= 1:
        return min(base, cap)
    return float(min(base * 2.0 ** (failures - 1), cap))


class ExitAction(str, Enum):
    """What laned does after an engine exit."""

    OWN_STOP = "own-stop"  # laned stopped it: the operation that did makes the transition
    STOPPED_OUTSIDE = "stopped-outside"  # an operator's stop (or the manager going down)
    FAIL = "fail"  # a failure of a lane nobody wants running: failed, not restarted
    SYSTEMD_RESTARTS = "systemd-restarts"  # the unit's own Restart= brings it back
    CRASH_LOOP = "crash-loop"  # too many failures: give up, loudly
    RESTART_LATER = "restart-later"  # restart after a backoff delay


@dataclass(frozen=True)
class ExitPlan:
    """The verdict on an exit and what follows from it."""

    verdict: Verdict
    action: ExitAction
    reason: str
    failures: tuple[float, ...]  # the lane's recent failures, this one included
    delay: float = 0.0


def plan_exit(
    spec: LaneConfig,
    facts: ExitFacts,
    *,
    stopping_by_laned: bool,
    state: LaneState,
    desired: Desired,
    failures: Iterable[float],
    now: float,
    systemd_restarts: bool,
    sub_state: str,
    counted: str | None = None,
    ready_at: float = 0.0,
) -> ExitPlan:
    """Judge an exit (only a stop somebody asked for is not a failure) and plan what follows.

    `ready_at`: when the lane last became ready (the backoff restarts from there).
    `counted`: this run's failure was already counted by another path (failed health
    probes, a stall, a start timeout, the memory guard; its reason): the exit is that
    failure's end, judged a failure and not counted again. A failure that ends a stop laned
    was making (the engine died before the stop reached it) is counted, and the operation
    that stops the lane goes on (OWN_STOP)."""
    container = spec.container
    command = (
        spec.exec.command[0]
        if spec.exec
        else (container.entrypoint or container.image)
        if container
        else ""
    )
    what = facts.describe(command)
    own = stopping_by_laned or state in (LaneState.STOPPING, LaneState.RESTARTING)
    verdict = judge_exit(stopping_by_laned, facts)
    if counted is not None:
        # Not counted again; with laned's stop under way, its operation goes on, else (that
        # operation broke, e.g. on a lost bus) the exit is handled as any failure.
        verdict = Verdict.FAILURE
        seen_first = f"the failure was seen first as {counted} (counted once)"
        window = tuple(recent(failures, now, spec.start_limit_interval))
        failure = Counted(window, False, f"engine exited with {what}; {seen_first}")
    elif verdict is Verdict.REQUESTED:
        action = ExitAction.OWN_STOP if own else ExitAction.STOPPED_OUTSIDE
        return ExitPlan(verdict, action, what, tuple(failures))
    else:
        before = " before laned's stop reached it" if stopping_by_laned else ""
        late = "; a stop arrived only after it" if facts.late_stop else ""
        failure = count_failure(spec, failures, now, f"engine exited with {what}{before}{late}")
    reason, window = f"{failure.reason} (failure)", failure.failures
    if stopping_by_laned:
        return ExitPlan(verdict, ExitAction.OWN_STOP, reason, window)
    if desired is not Desired.ACTIVE:
        return ExitPlan(verdict, ExitAction.FAIL, reason, window)
    if systemd_restarts and sub_state == AUTO_RESTART:
        return ExitPlan(
            verdict, ExitAction.SYSTEMD_RESTARTS, f"{reason}; systemd restarts it", window
        )
    if failure.crash_loop:
        return ExitPlan(verdict, ExitAction.CRASH_LOOP, reason, window)
    # The backoff grows with the failures since the last run that became ready (`ready_at`);
    # the crash loop counts every failure within start_limit_interval.
    in_a_row = len([t for t in window if t >= ready_at])
    delay = backoff_delay(spec.restart_sec, in_a_row, spec.restart_max_delay)
    return ExitPlan(
        verdict, ExitAction.RESTART_LATER, f"{reason}; restarting in {delay:g}s", window, delay
    )


# --- reload ---------------------------------------------------------------------------------

RESTART_ONLY_DAEMON_KEYS = ("listen", "token_file", "state_dir")


def reload_problems(
    old: Config,
    new: Config,
    states: Mapping[str, LaneState],
    under_way: Iterable[str] = (),
) -> list[str]:
    """Why a new config cannot be applied while laned runs ([] when it can): daemon settings
    only a restart applies, or a lane that runs, or has an operation or restart under way,
    removed or renamed."""
    problems = [
        f"daemon.{key} changed: restart laned to apply it"
        for key in RESTART_ONLY_DAEMON_KEYS
        if getattr(new.daemon, key) != getattr(old.daemon, key)
    ]
    busy = set(under_way)
    for lane, state in states.items():
        if state in SETTLED_STATES and lane not in busy:
            continue
        if lane not in new.lanes:
            problems.append(f"lanes.{lane} is {state.value}: deactivate it before removing it")
        elif unit_name(lane, new.lanes[lane]) != unit_name(lane, old.lanes[lane]):
            problems.append(
                f"lanes.{lane}.unit changed while it is {state.value}: deactivate it first"
            )
    return problems


def restart_needed(old: Config, new: Config, states: Mapping[str, LaneState]) -> list[str]:
    """The running lanes whose config changed: a restart applies the change."""
    return sorted(
        lane
        for lane, state in states.items()
        if lane in new.lanes and state in HOLDING_STATES and new.lanes[lane] != old.lanes[lane]
    )
