"""The supervisor's decisions, pure: no I/O, no asyncio, no clock of its own.

Each function takes what the owner knows (lane states, the unit's last two snapshots, an
exit record, a config) and answers what to do; the owner (`laned.owner.supervisor`) acts on the
answer. Nothing here logs or changes anything, so every rule is tested without systemd.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from laned.config.applied import Applied, Change, applied_of, changed_keys
from laned.config.groups import port_sharers
from laned.config.model import Config, DaemonConfig, LaneConfig
from laned.config.names import unit_name
from laned.core.exits import ExitFacts, judge_exit
from laned.core.lanes import Desired, LaneState, Verdict
from laned.core.unit_state import AUTO_RESTART, ActiveState, UnitSnapshot

# --- named state sets ---------------------------------------------------------------------

# The engine runs (or is starting): it serves, or will.
RUNNING_STATES = frozenset({LaneState.STARTING, LaneState.READY, LaneState.DEGRADED})
# The lane holds its GPUs and port, or is about to again (a restart is pending).
HOLDING_STATES = RUNNING_STATES | {LaneState.RESTARTING}
PORT_STATES = HOLDING_STATES | {LaneState.SLEEPING}  # its engine's process listens
# Nothing of the lane runs and nothing is under way: a reload may change or remove it.
SETTLED_STATES = frozenset({LaneState.INACTIVE, LaneState.FAILED})


class OpKind(str, Enum):
    """What an operation of a group does."""

    ACTIVATE = "activate"
    DEACTIVATE = "deactivate"
    RESTART = "restart"


class RestartKind(str, Enum):
    """Why a lane is restarted (the `reason` label of laned_restarts_total)."""

    REQUESTED = "requested"
    FAILURE = "failure"
    HEALTH = "health"
    STALLED = "stalled"
    WEIGHTS = "weights"  # its weight-cache daemon died (docs/weight-cache.md)


class SwapResult(str, Enum):
    """How an activation ended (the `result` label of laned_swaps_total)."""

    READY = "ready"
    SUPERSEDED = "superseded"
    FAILED = "failed"


def already_active(state: LaneState, desired: Desired) -> bool:
    """Activating this lane changes nothing: it is desired and holds its GPUs (or will).
    The one rule for "already running" (an activation joins instead; preflight is skipped)."""
    return desired is Desired.ACTIVE and state in HOLDING_STATES


def port_peer(config: Config, lane: str, states: Mapping[str, LaneState]) -> str | None:
    """The lane of the group (itself included) that holds the lane's port now, if any:
    preflight does not call a port busy that a swap is about to free."""
    for name in (lane, *port_sharers(config, lane)):
        if states[name] in PORT_STATES:
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
    REPLACE = "replace"  # supersede the current operation (the newest request wins)


def admit_activate(lane: str, current: Current | None, state: LaneState, desired: Desired) -> Admit:
    """An activation: join one on its way, wait if the lane already runs, else replace."""
    if current is not None and current.lane == lane and current.kind is OpKind.ACTIVATE:
        return Admit.JOIN
    if already_active(state, desired):
        return Admit.WAIT_READY  # a restart under way included: it ends with the lane ready
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


def reload_changes(old: Config, new: Config) -> list[Change]:
    """Every daemon and lane key a reload changes, with how it is applied (declared on the
    field: laned.config.applied); a lane added or removed is one change of its own."""
    out = [
        Change(f"daemon.{key}", applied_of(DaemonConfig, key))
        for key in changed_keys(DaemonConfig, old.daemon, new.daemon)
    ]
    if old.groups != new.groups:
        out.append(Change("groups", Applied.LIVE))
    for lane in sorted(old.lanes.keys() | new.lanes.keys()):
        before, after = old.lanes.get(lane), new.lanes.get(lane)
        if before is None or after is None:
            out.append(Change(f"lanes.{lane}", Applied.LIVE, lane))
            continue
        out.extend(
            Change(f"lanes.{lane}.{key}", applied_of(LaneConfig, key), lane)
            for key in changed_keys(LaneConfig, before, after)
        )
    return out


def reload_problems(
    old: Config,
    new: Config,
    states: Mapping[str, LaneState],
    under_way: Iterable[str] = (),
) -> list[str]:
    """Why a new config cannot be applied while laned runs ([] when it can): settings only
    a restart of laned applies, or a lane that runs, or has an operation or restart under
    way, removed or renamed."""
    problems = [
        f"{change.key} changed: only a restart of laned applies it (systemctl --user restart laned)"
        for change in reload_changes(old, new)
        if change.applied is Applied.RESTART and (change.lane is None or change.lane in new.lanes)
    ]
    problems += [
        f"lanes.{lane} is a new lane over several hosts: only a restart of laned starts "
        "coordinating it (systemctl --user restart laned)"
        for lane, spec in new.lanes.items()
        if spec.nodes and lane not in old.lanes
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
    """The running lanes (sleeping ones too) whose changed keys only their next start
    applies: a restart applies them (a sleeping lane is started cold at its next activation
    instead of woken); until then the engine runs, and is reached, as it started."""
    return sorted(
        {
            change.lane
            for change in reload_changes(old, new)
            if change.applied is Applied.NEXT_START
            and change.lane is not None
            and states.get(change.lane) in PORT_STATES
        }
    )
