"""The lane machine: one pure step over one record per lane.

    step(lane, input, ctx) -> Step(lane, effects)

`lane` is the lane's whole record (laned.core.lanes.LaneStatus, immutable), `input` what
reaches it (laned.core.inputs: a request, something seen, the result of an action of its
sequence), `ctx` what the step may read beside them (the clock, the lane's config). The
answer is the new record and the effects to run, in order (laned.core.effects): the owner's
interpreter (laned.owner.interpreter) replaces the record and runs them; nothing else
changes a lane.

Every (mode, input) pair is in `TABLE`: it acts (a handler below), is ignored on purpose
(with the reason, logged at debug), or is refused (Refusal: a pair that only a bug in laned
could bring, logged as an error with the pair; the record is kept). Before the table, a
result of an older request (its epoch) and a report of an older run (its run number) are
stale and dropped.

The requests' sequences are the table's too: a stop (`_stop_chain`), a start (`START`), a
sleep, a wake, giving up and the weight-cache daemon's part are tuples of named actions
the handlers emit (`Begin`, `Then`), each answered by its result before the next.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from laned.config.model import LaneConfig
from laned.core import inputs as i
from laned.core import policy
from laned.core.effects import (
    Action,
    Alarm,
    Answer,
    Begin,
    CancelRestart,
    CheckEnding,
    CheckSlept,
    CheckWeights,
    ChooseLevel,
    ConfirmContainerGone,
    Count,
    Drain,
    Effect,
    End,
    FailWaiters,
    Follow,
    Gate,
    Moved,
    Noted,
    Poke,
    Post,
    Prefetch,
    PutToSleep,
    ResolveWaiters,
    RunPreflight,
    ScheduleRestart,
    StartUnit,
    StartWeights,
    StopUnit,
    StopWeights,
    TakePeerOff,
    Task,
    Then,
    Unfollow,
    WakeUp,
)
from laned.core.lanes import (
    SAMPLES_KEPT,
    START_COLD,
    START_SLEEP,
    Asleep,
    Desired,
    EventKind,
    LaneStatus,
    LastExit,
    Op,
    Verdict,
    frozen,
    phase_durations,
)
from laned.core.modes import SERVING_MODES, STARTING_MODES, STOP_MODES, LaneState, Mode
from laned.core.phases import ALMOST_READY, DYING, add_mark
from laned.core.policy import ExitAction, OpKind, RestartKind, SwapResult

JOURNAL_LAG = 30.0  # seconds journald may stamp a start's log line after the engine answered
ANY = frozenset(Mode)

# --- what the step reads and answers ---------------------------------------------------------


@dataclass(frozen=True)
class Context:
    """What the step may read beside the record and the input: the clock (wall and
    monotonic), the lane's config now (None: gone from it), a fresh epoch for a request the
    step begins itself (a restart after a failure, giving up), and what the lane's weight
    cache says in the engine's log when it missed (its note)."""

    now: float
    mono: float
    spec: LaneConfig | None
    epoch: int = 0
    cache_missed: str | None = None


@dataclass(frozen=True)
class Step:
    """The step's answer: the new record and the effects to run, in order; `ignored` or
    `refused` says why nothing changed."""

    lane: LaneStatus
    effects: tuple[Effect, ...] = ()
    ignored: str = ""
    refused: str = ""


@dataclass(frozen=True)
class Ignore:
    """A pair the machine ignores on purpose, and why."""

    why: str


@dataclass(frozen=True)
class Refuse:
    """A pair that only a bug could bring, and why."""

    why: str


Handler = Callable[[LaneStatus, Any, Context], Step]
Cell = Handler | Ignore | Refuse
Error = tuple[str, str, str]  # a laned.errors class's name, the message, the hint


def step(lane: LaneStatus, event: i.Input, ctx: Context) -> Step:
    """The lane's record after `event`, and the effects to run (see the module's docstring)."""
    stale = _stale(lane, event)
    if stale:
        return Step(lane, ignored=stale)
    cell = TABLE[type(event)][lane.mode]
    if isinstance(cell, Ignore):
        return Step(lane, ignored=cell.why)
    if isinstance(cell, Refuse):
        why = cell.why or f"no {type(event).__name__} in {lane.mode.value}"
        if isinstance(event, i.Result) and lane.op is not None:
            # Its request cannot go on: it ends, and its callers hear why (nobody hangs).
            said = f"lane {lane.name}: laned cannot go on with {lane.op.kind}: {why}"
            ended, effects = _ended(lane, ctx, ("ActivationFailed", said, "see laned's log"))
            return Step(ended, tuple(effects), refused=why)
        return Step(lane, refused=why)
    return cell(lane, event, ctx)


def _stale(lane: LaneStatus, event: i.Input) -> str:
    """Why `event` belongs to an older request or run ("" when it is the lane's own now)."""
    if isinstance(event, i.Result) and (lane.op is None or lane.op.epoch != event.epoch):
        return "a result of an earlier request (a newer one won)"
    run = getattr(event, "run", None)
    if isinstance(run, int) and run != lane.run:
        return "a report of an earlier run"
    return ""


# --- the record's own changes ----------------------------------------------------------------


def _moved(lane: LaneStatus, to: Mode, reason: str, ctx: Context) -> tuple[LaneStatus, Moved]:
    """The lane in `to`, with the transition to publish."""
    changes: dict[str, Any] = {"mode": to, "since": ctx.now, "reason": reason}
    if to.visible is not LaneState.STARTING:
        changes["phase"] = changes["progress"] = None
    return dataclasses.replace(lane, **changes), Moved(lane.state, to.visible, reason)


def _new_run(lane: LaneStatus, ctx: Context, new_engine: bool) -> LaneStatus:
    """A start: the run's number, config, clock, phases and notes begin again."""
    return dataclasses.replace(
        lane,
        run=lane.run + 1,
        spec=ctx.spec,
        started_at=ctx.now,
        phases=(),
        notes=(),
        weights_at_start=None,
        start_kind="",
        counted=None,
        pinned=False if new_engine else lane.pinned,
    )


def _start(
    lane: LaneStatus, reason: str, ctx: Context, to: Mode = Mode.STARTING, new_engine: bool = True
) -> tuple[LaneStatus, list[Effect]]:
    """A new run, in `to`, watched (readiness, then liveness)."""
    lane = _new_run(lane, ctx, new_engine)
    lane, moved = _moved(lane, to, reason, ctx)
    return lane, [moved, Unfollow(), Follow()]


def _count_failure(
    lane: LaneStatus, ctx: Context, seen_by: str, what: str
) -> tuple[LaneStatus, policy.Counted | None, list[Effect]]:
    """The current run's failure, counted once (`seen_by` saw it first); None when it was
    counted already."""
    if lane.counted is not None or ctx.spec is None:
        return lane, None, []
    counted = policy.count_failure(ctx.spec, lane.failures, ctx.now, what)
    lane = dataclasses.replace(lane, failures=counted.failures, counted=what)
    return lane, counted, [Count("failure", (lane.name, seen_by))]


def _answer(
    lane: LaneStatus, ctx: Context, error: Error | None, findings: tuple[Any, ...] = ()
) -> list[Effect]:
    """The request under way ends (its callers answered, a take-off's activator told): the
    lane's record, or why not."""
    op = lane.op
    if op is None:
        return []
    out: list[Effect] = []
    for by, reply in op.takers:  # each activation taking the lane off waits for this answer
        if error is None or op.kind == GIVE_UP:  # given up: stopped, off its GPUs all the same
            out.append(Post(by, i.PeerOff(reply, lane.name)))
        else:
            out.append(Post(by, i.PeerStuck(reply, lane.name, i.Refused(error[1], error[2]))))
    if op.kind == OpKind.ACTIVATE.value:
        result = SwapResult.READY
        if error is not None:
            result = SwapResult.SUPERSEDED if error[0] == "Superseded" else SwapResult.FAILED
        seconds = max(ctx.mono - op.started, 0.0)
        out.append(Count("swap", (op.from_lane, lane.name, result.value, seconds)))
        out.append(Prefetch("end"))  # whatever ended it, its prefetch has nothing to wait for
    epochs = (op.epoch, *op.also) if op.kind != TAKE_OFF else op.also
    if epochs:
        out.append(Answer(epochs) if error is None else Answer(epochs, *error, findings))
    return out


def _ended(
    lane: LaneStatus, ctx: Context, error: Error | None = None, settle: bool = True
) -> tuple[LaneStatus, list[Effect]]:
    """The request under way is over: answered, the record without it, its sequence ended.

    One left in the middle of a stop (superseded, refused, its peer stuck) would leave the
    lane `stopping` with nobody to finish it: the stop is finished (SETTLE, a request of
    laned's own that a newer one replaces), unless an action broke (`settle` False: the
    host does not answer; laned.owner.outages catches the lane up once it does)."""
    effects: list[Effect] = [*_answer(lane, ctx, error), End()]
    lane = dataclasses.replace(lane, op=None)
    if settle and lane.mode in STOP_MODES | {Mode.FALLING_ASLEEP}:
        why = f"{lane.reason}: its request ended before its stop did; finishing the stop"
        lane = dataclasses.replace(lane, op=Op(SETTLE, ctx.epoch, reason=why, force=True))
        effects += [*_stop_asked(why), Begin((CheckEnding(),))]
    return lane, effects


def _failed(
    lane: LaneStatus, reason: str, ctx: Context, hint: str = ""
) -> tuple[LaneStatus, list[Effect]]:
    """Failed: everyone waiting hears why, the request under way among them."""
    lane, moved = _moved(lane, Mode.FAILED, reason, ctx)
    error = (
        "ActivationFailed",
        f"lane {lane.name}: {reason}",
        hint or f"see `laned logs {lane.name}`",
    )
    lane, ended = _ended(lane, ctx, error)
    return lane, [moved, FailWaiters(reason), *ended]


def _superseded(why: str) -> Error:
    return ("Superseded", why, "the newest request wins")


def _replace_op(
    lane: LaneStatus, op: Op, ctx: Context, why: str
) -> tuple[LaneStatus, list[Effect]]:
    """A newer request of the lane's own wins over the one under way (whose callers hear
    so, and whose sequence ends): `op` from now on."""
    effects = _answer(lane, ctx, _superseded(why)) if lane.op is not None else []
    return dataclasses.replace(lane, op=op), [*effects, End()]


TAKE_OFF = "take-off"
GIVE_UP = "give-up"
SETTLE = "settle"
STARTS_IT = (OpKind.ACTIVATE.value, OpKind.RESTART.value)

# --- the sequences (the table's) -----------------------------------------------------------

# A start: the weight-cache daemon of other weights goes first, the gate, the daemon up,
# the unit started (what it reads recorded first where the lane sleeps).
START: tuple[Action, ...] = (CheckWeights(), Gate(), StartWeights(), StartUnit())
# The rest of a confirmed stop once its unit is known to run: the requests in flight end
# first, the unit's stop job, the container gone, the weight-cache daemon gone.
STOP: tuple[Action, ...] = (StopUnit(), ConfirmContainerGone(), StopWeights())
# A restart: the requests end, the unit stopped (the daemon kept), then a start.
RESTART: tuple[Action, ...] = (StopUnit(), *START)
# Giving up: the unit stopped, and its daemon (a lane given up holds no GPU memory).
GIVING_UP: tuple[Action, ...] = (StopUnit(), StopWeights())
# A sleep: the level chosen, then its requests drained and the engine put to sleep.
SLEEP: tuple[Action, ...] = (ChooseLevel(),)


def _stop_asked(reason: str) -> list[Effect]:
    """A stop or a sleep begins: no restart, no watcher, no waiter any more."""
    return [CancelRestart(), Unfollow(), FailWaiters(reason, superseded=True)]


# --- requests --------------------------------------------------------------------------------


def _activate(lane: LaneStatus, e: i.Activate, ctx: Context) -> Step:
    """An activation, as the owner planned it across lanes (the peers it takes off, the
    requests it supersedes): desired, its failures forgiven, preflight first, then the
    peers, then its own start (a wake for a sleeper)."""
    if lane.op is not None and lane.op.kind == OpKind.ACTIVATE.value:
        op = dataclasses.replace(lane.op, also=(*lane.op.also, e.epoch))
        return Step(dataclasses.replace(lane, op=op))  # one on its way: joined
    op = Op(
        OpKind.ACTIVATE.value,
        e.epoch,
        reason=e.reason,
        force=e.force,
        unattended=e.unattended,
        evicts=e.evicts,
        stops_asleep=e.stops_asleep,
        from_lane=e.from_lane,
        desired_before=frozen(e.desired_before),
        started=e.started,
    )
    lane, effects = _replace_op(lane, op, ctx, f"superseded by activate {lane.name}")
    lane = dataclasses.replace(lane, desired=Desired.ACTIVE, failures=())
    peers = tuple(
        TakePeerOff(peer, f"swap to {lane.name}", e.force, peer in e.stops_asleep)
        for peer in e.evicts
    )
    check: Action = CheckSlept() if lane.mode is Mode.SLEEPING else CheckEnding()
    first: tuple[Action, ...] = (RunPreflight(),) if e.findings is None else ()
    if e.findings is not None:  # its caller ran preflight just now: judged as if run here
        said = _preflighted(
            lane, i.Preflighted(e.epoch, e.findings, _errors(e.findings), None), ctx
        )
        if said.lane.op is None:  # refused (the caller refuses before posting: not here)
            return Step(said.lane, (*effects, *said.effects))
        lane, effects = said.lane, [*effects, *said.effects]
    return Step(lane, (*effects, Begin((*first, *peers, check))))


def _errors(findings: Iterable[Any]) -> int:
    from laned.errors import Severity

    return sum(f.severity is Severity.ERROR for f in findings)


def _preflighted(lane: LaneStatus, e: i.Preflighted, ctx: Context) -> Step:
    """Preflight's findings said; errors refuse the activation (unless forced), nothing
    stopped, the lanes it would take off desired as before."""
    op = lane.op
    assert op is not None
    effects: list[Effect] = []
    if e.findings:
        effects.append(Noted(EventKind.PREFLIGHT, _summary(e.findings)))
    if e.errors:
        effects.append(Count("preflight_refused", (lane.name,)))
        if op.force:
            effects.append(Noted(EventKind.PREFLIGHT, "preflight errors overridden (force)"))
    if not e.errors or op.force:
        if op.from_lane != "none":  # the weights read in while the running lane goes
            effects.append(Prefetch("begin", (op.from_lane,)))
        return Step(lane, tuple(effects))
    refusal = e.refusal or i.Refused(f"lane {lane.name}: preflight found errors")
    effects += [Post(p, i.Desire(d)) for p, d in op.desired_before.items() if p != lane.name]
    lane = dataclasses.replace(lane, desired=op.desired_before.get(lane.name, lane.desired))
    if op.unattended:  # nobody waits: the refusal shows in the lane's state
        reason = refusal.reason.removeprefix(f"lane {lane.name}: ")
        lane, moved = _moved(lane, Mode.FAILED, reason, ctx)
        effects += [moved, FailWaiters(reason)]
    lane, ended = _ended(lane, ctx, ("PreflightFailed", refusal.reason, refusal.hint))
    # Its callers get the findings too.
    ended = [
        dataclasses.replace(f, findings=e.findings) if isinstance(f, Answer) else f for f in ended
    ]
    return Step(lane, (*effects, *ended))


def _summary(findings: Iterable[Any]) -> str:
    from laned.errors import Severity

    errors = [f for f in findings if f.severity is Severity.ERROR]
    warnings = [f for f in findings if f.severity is Severity.WARNING]
    said = "; ".join(f.message for f in [*errors, *warnings]) or "notes only"
    return f"preflight: {len(errors)} error(s), {len(warnings)} warning(s): {said}"


def _deactivate(lane: LaneStatus, e: i.Deactivate, ctx: Context) -> Step:
    """A stop the operator asked for (never a failure); it replaces the lane's request under
    way. An activation taking the lane off (a take-off, `by`) still hears when it is off.
    An activation of this lane it supersedes leaves the peers it had not yet taken off
    desired as they were (nothing that runs is left undesired)."""
    current = lane.op
    lane = dataclasses.replace(lane, desired=Desired.INACTIVE)
    op = Op(OpKind.DEACTIVATE.value, e.epoch, reason=e.reason, force=e.force)
    if current is not None and current.takers:  # the take-off's activators hear when it is off
        op = dataclasses.replace(op, takers=current.takers, also=current.also)
        current = dataclasses.replace(current, takers=(), also=())
        lane = dataclasses.replace(lane, op=current)
    lane, effects = _replace_op(lane, op, ctx, f"superseded by deactivate {lane.name}")
    if current is not None and current.kind == OpKind.ACTIVATE.value:
        effects += [
            Post(peer, i.Desire(Desired.ACTIVE, holding_only=True, unless_by=lane.name))
            for peer, before in current.desired_before.items()
            if peer != lane.name and before is Desired.ACTIVE
        ]
    return Step(lane, (*effects, *_stop_asked(e.reason), Begin((CheckEnding(),))))


def _restart(lane: LaneStatus, e: i.Restart, ctx: Context) -> Step:
    """Stop and start a desired lane: `restarting` now, so that waiters made from now on
    wait for the new run; the requests in flight end first unless forced (a failure's
    restart is: a failed engine has none to finish)."""
    if lane.desired is not Desired.ACTIVE:
        return Step(lane, ignored="not desired: an activation, not a restart, starts it")
    if lane.op is not None and lane.op.kind in STARTS_IT:
        return Step(lane, ignored="an activation or restart under way ends in a fresh run")
    force = e.force or e.kind != RestartKind.REQUESTED.value
    op = Op(OpKind.RESTART.value, e.epoch, reason=e.reason, force=force)
    lane, effects = _replace_op(lane, op, ctx, f"superseded by restart {lane.name}")
    lane = dataclasses.replace(lane, restarts=lane.restarts + 1)
    lane, moved = _moved(lane, Mode.RESTART_STOPPING, e.reason, ctx)
    effects += [Count("restart", (lane.name, e.kind)), moved, CancelRestart(), Unfollow()]
    return Step(lane, (*effects, Begin((Drain(force), *RESTART))))


def _take_off(lane: LaneStatus, e: i.TakeOff, ctx: Context) -> Step:
    """Off its GPUs for another lane's activation (`by`): asleep where it can sleep, else
    stopped; a sleeper stays asleep unless what it keeps is in the way. `by` hears when it
    is off (PeerOff), or why not. A stop or take-off under way (an operator's, giving up,
    another activation's) goes on, and `by` hears when it ends, as its first taker does."""
    taker = (e.by, e.reply)
    if lane.op is not None and lane.op.kind in (OpKind.DEACTIVATE.value, GIVE_UP, TAKE_OFF):
        # Another activation's take-off or a stop is under way: this one waits for it too.
        op = dataclasses.replace(lane.op, takers=(*lane.op.takers, taker))
        return Step(dataclasses.replace(lane, op=op, desired=Desired.INACTIVE))
    op = Op(TAKE_OFF, e.epoch, reason=e.reason, force=e.force, takers=(taker,))
    lane, effects = _replace_op(lane, op, ctx, f"taken off for activate {e.by}")
    lane = dataclasses.replace(lane, desired=Desired.INACTIVE)
    if lane.mode is Mode.SLEEPING and not e.asleep_too:
        lane, ended = _ended(lane, ctx)
        return Step(lane, (*effects, *ended))
    if lane.mode is Mode.SLEEPING:
        why = f"{e.reason}: the GPU memory it keeps asleep leaves no room; stopping it"
        effects.append(Noted(EventKind.SLEEP, why))
    first = SLEEP if e.sleeps and lane.serving else (CheckEnding(),)
    return Step(lane, (*effects, *_stop_asked(e.reason), Begin(first)))


def _superseded_input(lane: LaneStatus, e: i.Superseded, ctx: Context) -> Step:
    """A newer request of another lane's won: the sequence under way ends, its callers and
    the lane's waiters hear why. The lane stays where it is (the newer request moves it),
    but a start on its way is stopped: nothing would follow it now."""
    mid_start = lane.mode in (Mode.STARTING, Mode.WAKING, Mode.RESTARTING)
    lane, effects = _ended(lane, ctx, _superseded(e.why))
    if mid_start:
        # Its run was on its way with nobody to follow it now: stopped (the request that won
        # takes it off, or wanted it inactive), as a request ending in a stop is finished.
        why = f"{e.why}: stopping its start"
        lane = dataclasses.replace(lane, op=Op(SETTLE, ctx.epoch, reason=why, force=True))
        effects += [*_stop_asked(why), Begin((CheckEnding(),))]
    return Step(lane, (FailWaiters(e.why, superseded=True), *effects))


def _desire(lane: LaneStatus, e: i.Desire, ctx: Context) -> Step:
    """What the lane is wanted as (those waiting for it to be ready hear when it is not any
    more); `holding_only`: kept desired only while it holds its GPUs and is not being taken
    off by `unless_by`."""
    if e.holding_only:
        # A request of its own may be under way (it decides); laned's take-off or its
        # finishing of a stop may not.
        own = lane.op is None or (
            lane.op.kind in STARTS_IT and e.unless_by not in (by for by, _ in lane.op.takers)
        )
        if lane.state not in policy.HOLDING_STATES or not own:
            return Step(lane, ignored="not holding its GPUs, or being taken off or stopped")
    dropped = lane.desired is Desired.ACTIVE and e.desired is Desired.INACTIVE
    lane = dataclasses.replace(lane, desired=e.desired)
    return Step(lane, (FailWaiters("not wanted any more", superseded=True),) if dropped else ())


def _lost(lane: LaneStatus, e: i.Lost, ctx: Context) -> Step:
    """Its run was lost while laned could not see systemd: started again at once, as a
    restart after a failure."""
    lane, moved = _moved(lane, Mode.RESTARTING, e.reason, ctx)
    return Step(lane, (moved, Unfollow(), CancelRestart(), ScheduleRestart(0.0)))


def _backoff_over(lane: LaneStatus, e: i.BackoffOver, ctx: Context) -> Step:
    """The backoff after a failure is over: started again, within the request that waits
    for it to be ready, or as a restart of its own."""
    if lane.desired is not Desired.ACTIVE:  # nothing runs: it rests
        lane, moved = _moved(lane, Mode.INACTIVE, "not wanted any more: not started again", ctx)
        return Step(lane, (moved,))
    count = lane.restarts + 1
    lane = dataclasses.replace(lane, restarts=count)
    effects: list[Effect] = [Count("restart", (lane.name, RestartKind.FAILURE.value))]
    reason = f"restart #{count} after a failure"
    if lane.op is None or lane.op.kind not in STARTS_IT:
        op = Op(OpKind.RESTART.value, ctx.epoch, reason=reason, force=True)
        lane, replaced = _replace_op(lane, op, ctx, f"superseded by a restart of {lane.name}")
        effects += replaced
    else:
        lane = dataclasses.replace(lane, op=dataclasses.replace(lane.op, reason=reason))
    return Step(lane, (*effects, Begin(START)))


def _restore(lane: LaneStatus, e: i.Restore, ctx: Context) -> Step:
    """What state.json kept; a lane that gave up stays failed until activated."""
    lane = dataclasses.replace(
        lane,
        desired=e.desired,
        restarts=e.restarts,
        last_exit=e.last_exit,
        last_cold_start=e.last_cold_start,
        last_starts=frozen(e.last_starts),
        last_phases=frozen(e.last_phases),
        image_id=e.image_id,
        checks=e.checks,
        since=ctx.now,
    )
    if e.failed is not None:
        lane = dataclasses.replace(lane, mode=Mode.FAILED, reason=e.failed)
    return Step(lane)


# --- what is seen ---------------------------------------------------------------------------


def _adopt(lane: LaneStatus, e: i.Adopt, ctx: Context) -> Step:
    """Found running: desired, and followed as a start (a ready engine is ready at once)."""
    lane = dataclasses.replace(lane, desired=Desired.ACTIVE)
    lane, effects = _start(lane, e.reason, ctx, new_engine=False)
    return Step(lane, tuple(effects))


def _started_outside(lane: LaneStatus, e: i.StartedOutside, ctx: Context) -> Step:
    lane = dataclasses.replace(lane, desired=Desired.ACTIVE)
    lane, effects = _start(lane, "started outside laned", ctx)
    return Step(lane, tuple(effects))


def _found_asleep(lane: LaneStatus, e: i.FoundAsleep, ctx: Context) -> Step:
    lane = dataclasses.replace(
        lane, desired=Desired.INACTIVE, asleep=Asleep(e.pids, e.digest, e.level)
    )
    lane, moved = _moved(lane, Mode.SLEEPING, "found asleep", ctx)
    return Step(lane, (moved, Unfollow()))


def _rank_slept(lane: LaneStatus, e: i.RankSlept, ctx: Context) -> Step:
    """A worker's rank asleep with its head (docs/multinode.md): a sleeper of this host, not
    desired, as one put to sleep here is; its head's activation wakes it."""
    lane = dataclasses.replace(
        lane,
        desired=Desired.INACTIVE,
        asleep=Asleep(e.pids, e.digest, e.level),
        pinned=lane.pinned or e.level == 1,
        residual=frozen(e.residual) if e.residual else lane.residual,
    )
    lane, moved = _moved(lane, Mode.SLEEPING, f"asleep with its head (level {e.level})", ctx)
    return Step(lane, (moved, Unfollow()))


def _found_stopped(lane: LaneStatus, e: i.FoundStopped, ctx: Context) -> Step:
    lane, moved = _moved(lane, Mode.INACTIVE, e.reason, ctx)
    return Step(lane, (moved,))


def _stopped_outside(lane: LaneStatus, e: i.StoppedOutside, ctx: Context) -> Step:
    """Stopped by somebody else: the user manager going down (the lane comes back with
    laned), or an operator's stop (not desired any more; its weight cache goes too)."""
    lane, ended = _start_ends(lane, ctx, e.reason)
    if e.with_manager:
        lane, moved = _moved(lane, Mode.INACTIVE, e.reason, ctx)
        return Step(lane, (moved, *ended))
    lane = dataclasses.replace(lane, desired=Desired.INACTIVE)
    lane, moved = _moved(lane, Mode.INACTIVE, e.reason, ctx)
    return Step(lane, (moved, FailWaiters(e.reason), *ended, Task("weights-gone")))


def _start_ends(lane: LaneStatus, ctx: Context, reason: str) -> tuple[LaneStatus, list[Effect]]:
    """A start under way (an activation or restart) that something outside laned ended:
    its callers hear why (a stop of laned's own goes on: its results end it)."""
    if lane.op is None or lane.op.kind not in STARTS_IT:
        return lane, []
    error = ("ActivationFailed", f"lane {lane.name}: {reason}", f"see `laned logs {lane.name}`")
    return _ended(lane, ctx, error, settle=False)


def _exited(lane: LaneStatus, e: i.Exited, ctx: Context) -> Step:
    """The engine exited: judged (requested or a failure, whatever its status) and acted on
    (restart now, later, or never; laned's own stop goes on by itself)."""
    assert ctx.spec is not None
    plan = policy.plan_exit(
        ctx.spec,
        e.facts,
        stopping_by_laned=lane.stopping,
        state=lane.state,
        desired=lane.desired,
        failures=lane.failures,
        now=ctx.now,
        systemd_restarts=e.systemd_restarts,
        sub_state=e.sub_state,
        counted=lane.counted,
        ready_at=lane.ready_at,
    )
    failure = plan.verdict is Verdict.FAILURE
    last = LastExit(
        e.facts.code,
        e.facts.signal,
        ctx.now,
        plan.verdict,
        e.facts.oom_killed,
        plan.reason if failure else "",
    )
    # The window after it: kept for a requested stop and for a stop outside laned.
    keep = plan.action is ExitAction.STOPPED_OUTSIDE or (
        plan.action is ExitAction.OWN_STOP and not failure
    )
    counted_now = failure and lane.counted is None
    lane = dataclasses.replace(
        lane,
        last_exit=last,
        failures=lane.failures if keep else plan.failures,
        counted="its exit" if counted_now else lane.counted,
    )
    effects: list[Effect] = [
        Count("exit", (lane.name, e.facts.code, e.facts.signal, plan.verdict.value)),
        Unfollow(),
    ]
    if counted_now:
        effects.append(Count("failure", (lane.name, "exit")))
    if plan.action is ExitAction.OWN_STOP:
        if failure:
            effects.append(Noted(EventKind.EXIT, plan.reason))
        return Step(lane, tuple(effects))  # laned's own stop: its sequence moves the lane
    if plan.action is ExitAction.STOPPED_OUTSIDE:
        return Step(lane, (*effects, Task("stopped-outside", plan.reason)))
    if plan.action is ExitAction.SYSTEMD_RESTARTS:
        lane = dataclasses.replace(lane, restarts=max(lane.restarts + 1, e.n_restarts))
        lane, started = _start(lane, plan.reason, ctx, to=Mode.RESTARTING)
        restart = Count("restart", (lane.name, RestartKind.FAILURE.value))
        return Step(lane, (*effects, restart, *started))
    if plan.action is ExitAction.RESTART_LATER:
        lane, moved = _moved(lane, Mode.RESTARTING, plan.reason, ctx)
        return Step(lane, (*effects, moved, CancelRestart(), ScheduleRestart(plan.delay)))
    if plan.action is ExitAction.CRASH_LOOP:
        lane, failed = _failed(lane, plan.reason, ctx)
        return Step(lane, (*effects, *failed, Task("weights-gone")))
    lane, moved = _moved(lane, Mode.FAILED, plan.reason, ctx)  # a failure nobody wants running
    lane, ended = _start_ends(lane, ctx, plan.reason)
    return Step(lane, (*effects, moved, *ended, Task("weights-gone")))


def _ready(lane: LaneStatus, e: i.Ready, ctx: Context) -> Step:
    """The run answers: ready, and what its start took kept (a wake's apart from a cold
    start's, the phases, the image of a good start); the request that started it answered."""
    now = ctx.now
    took = round(now - (now if lane.started_at is None else lane.started_at), 3)
    woke = lane.mode is Mode.WAKING
    kind = START_SLEEP if woke else (lane.start_kind or START_COLD)
    changes: dict[str, Any] = {
        "start_kind": kind,
        "last_starts": frozen({**lane.last_starts, kind: took}),  # each kind predicts its next
        "ready_at": now,  # the backoff starts again from here
    }
    if woke:
        changes["last_wake"] = took
    elif kind == START_COLD:  # a restart from the weight cache is no cold start
        changes["last_cold_start"] = took
    if lane.phases:
        changes["last_phases"] = frozen(dict(phase_durations(lane.phases, now)))
    if e.image_id:
        changes["image_id"] = e.image_id  # of a good start: a different one later is drift
    lane = dataclasses.replace(lane, **changes)
    lane, moved = _moved(lane, Mode.READY, e.reason, ctx)
    effects: list[Effect] = [moved, ResolveWaiters(), Count("start", (lane.name, kind, took))]
    if woke:
        effects.append(Count("sleep_mode", (lane.name, "wake", took)))
    elif kind == START_COLD:
        effects.append(Count("cold_start", (lane.name, took)))
    if ctx.spec is not None and ctx.spec.checks.after_activate:
        effects.append(Task("after-activate"))
    if lane.op is not None and lane.op.kind in STARTS_IT:
        lane, ended = _ended(lane, ctx)
        effects += ended
    return Step(lane, tuple(effects))


def _failing(lane: LaneStatus, e: i.Failing, ctx: Context) -> Step:
    """The engine stopped serving (its health says it is dead, failed probes, a stall, its
    daemon died): one failure of this run, then a restart, or the end of a crash loop."""
    effects: list[Effect] = [Count(e.metric, (lane.name,))] if e.metric else []
    lane, moved = _moved(lane, Mode.FAILING, e.reason, ctx)
    lane, counted, said = _count_failure(lane, ctx, e.seen_by, e.reason)
    effects += [moved, *said]
    if counted is not None and counted.crash_loop:
        return _giving_up(lane, counted.reason, ctx, effects)
    if lane.op is not None and lane.op.kind in STARTS_IT:
        # A start under way: stopped and started again within the request that waits for it.
        lane = dataclasses.replace(lane, restarts=lane.restarts + 1)
        lane, again = _moved(lane, Mode.RESTART_STOPPING, e.reason, ctx)
        effects += [Count("restart", (lane.name, e.restart_kind)), again, CancelRestart()]
        return Step(lane, (*effects, Unfollow(), Begin((Drain(True), *RESTART))))
    after = _restart(lane, i.Restart(ctx.epoch, e.reason, e.restart_kind, True), ctx)
    return Step(after.lane, (*effects, *after.effects))


def _probe_failed(lane: LaneStatus, e: i.ProbeFailed, ctx: Context) -> Step:
    """One failed health probe, counted; at the limit in a row, the run stopped serving."""
    if e.failures < e.limit:
        return Step(lane, (Count("probe_failure", (lane.name,)),))
    reason = f"health: {e.failures} consecutive probe failures"
    return _failing(
        lane, i.Failing(e.run, reason, "health", RestartKind.HEALTH.value, "probe_failure"), ctx
    )


def _weights_died(lane: LaneStatus, e: i.WeightsDied, ctx: Context) -> Step:
    """The lane's weight-cache daemon died while its lane was wanted: the lane's failure
    (the engine goes too: a restart starts the daemon, then the engine, counted once)."""
    if lane.desired is not Desired.ACTIVE:
        return Step(lane, ignored="a lane nobody wants any more")
    said = Noted(EventKind.WEIGHTS, e.reason)
    after = _failing(lane, i.Failing(lane.run, e.reason, "weights", RestartKind.WEIGHTS.value), ctx)
    return Step(after.lane, (said, *after.effects))


def _give_up(lane: LaneStatus, e: i.GiveUp, ctx: Context) -> Step:
    """A start timeout or the memory guard: counted, then stopped and failed."""
    lane, _counted, effects = _count_failure(lane, ctx, e.seen_by, e.reason)
    return _giving_up(lane, e.reason, ctx, effects)


def _giving_up(lane: LaneStatus, reason: str, ctx: Context, effects: list[Effect]) -> Step:
    """Stop the lane (a stop of laned's) and leave it failed until the next activate; whoever
    waits hears why once it is stopped."""
    takers = lane.op.takers if lane.op is not None else ()
    op = Op(GIVE_UP, ctx.epoch, reason=reason, also=_callers(lane.op), takers=takers)
    lane = dataclasses.replace(lane, op=op)
    lane, moved = _moved(lane, Mode.GIVING_UP, reason, ctx)
    return Step(lane, (*effects, moved, CancelRestart(), Unfollow(), End(), Begin(GIVING_UP)))


def _callers(op: Op | None) -> tuple[int, ...]:
    """The callers of a request that another of the lane's carries on for (they hear
    how it ends)."""
    if op is None or op.kind == TAKE_OFF:
        return ()
    return (op.epoch, *op.also)


def _phase_seen(lane: LaneStatus, e: i.PhaseSeen, ctx: Context) -> Step:
    """A startup phase or note of the engine's log, kept for the run it belongs to; the
    engine dying (its HealthRule's lines) has its health asked at once while it serves."""
    seen, at = e.seen, e.at
    if seen.note == DYING:
        return Step(lane, (Alarm(),) if lane.serving else ())
    if at < (lane.started_at or 0):
        return Step(lane, ignored="an earlier run's line")
    effects: list[Effect] = []
    if ctx.cache_missed is not None and seen.note == ctx.cache_missed and lane.start_kind:
        lane = dataclasses.replace(lane, start_kind=START_COLD)  # read from disk after all
    holding = lane.state in policy.HOLDING_STATES
    # journald can hand a line over after the engine already answered (a container's
    # output arrives in bursts): what it said of this start is still this start's.
    if seen.note and seen.note not in lane.notes and holding:
        lane = dataclasses.replace(lane, notes=(*lane.notes, seen.note))
        effects.append(Noted(EventKind.STARTUP, seen.note))
    if seen.phase is None or not holding:
        return Step(lane, tuple(effects))
    since = max(at - (seen.elapsed or 0.0), lane.started_at or 0)  # a bar arrives as it closes
    if lane.state is LaneState.STARTING:
        phases = tuple(add_mark(list(lane.phases), seen.phase, since))
        lane = dataclasses.replace(lane, phase=seen.phase, progress=seen.progress, phases=phases)
        if seen.phase in ALMOST_READY:
            effects.append(Poke())
        return Step(lane, tuple(effects))
    # Late, but of this start: a line stamped up to JOURNAL_LAG after the engine answered
    # was written before it (journald reads a busy host's burst late).
    ready_at = lane.ready_at
    this_run = lane.started_at is not None and ready_at >= lane.started_at
    if this_run and since < ready_at + JOURNAL_LAG:
        phases = tuple(add_mark(list(lane.phases), seen.phase, min(since, ready_at)))
        last = frozen(dict(phase_durations(phases, ready_at)))
        lane = dataclasses.replace(lane, phases=phases, last_phases=last)
    return Step(lane, tuple(effects))


def _start_kind(lane: LaneStatus, e: i.StartKind, ctx: Context) -> Step:
    return Step(dataclasses.replace(lane, start_kind=e.kind))


def _sampled(lane: LaneStatus, e: i.Sampled, ctx: Context) -> Step:
    window = tuple(s for s in lane.samples if s[0] >= e.at - SAMPLES_KEPT)
    return Step(dataclasses.replace(lane, samples=(*window, (e.at, e.sample))))


def _weights_at_start(lane: LaneStatus, e: i.WeightsAtStart, ctx: Context) -> Step:
    shown = None if e.shown is None else frozen(e.shown)
    return Step(dataclasses.replace(lane, weights_at_start=shown))


def _weights_seen(lane: LaneStatus, e: i.WeightsSeen, ctx: Context) -> Step:
    held = e.held if e.held is not None or e.shown != "ready" else lane.weights_held
    unit = e.unit if e.unit is not None else lane.weights_unit
    return Step(dataclasses.replace(lane, weights=e.shown, weights_held=held, weights_unit=unit))


def _unit_seen(lane: LaneStatus, e: i.UnitSeen, ctx: Context) -> Step:
    return Step(dataclasses.replace(lane, unit=e.unit))


def _checking(lane: LaneStatus, e: i.Checking, ctx: Context) -> Step:
    return Step(dataclasses.replace(lane, checking=max(lane.checking + e.delta, 0)))


def _checked(lane: LaneStatus, e: i.Checked, ctx: Context) -> Step:
    """The acceptance run kept; a ready lane that fails one is degraded and left serving
    (word salad, a broken tool parser: a restart would not fix them)."""
    lane = dataclasses.replace(lane, checks=e.results)
    if e.failed is not None and lane.mode is Mode.READY:
        lane, moved = _moved(lane, Mode.DEGRADED_CHECK, f"check {e.failed}", ctx)
        return Step(lane, (moved,))
    if e.failed is None and lane.mode is Mode.DEGRADED_CHECK:
        lane, moved = _moved(lane, Mode.READY, "the acceptance checks pass again", ctx)
        return Step(lane, (moved, ResolveWaiters()))
    return Step(lane)


def _peer_trouble(lane: LaneStatus, e: i.PeerTrouble, ctx: Context) -> Step:
    """A peer rank out of reach degrades a ready lane, left serving (restarting this rank
    would not bring the peer back); all back makes it ready again."""
    if e.reason is not None and lane.mode is Mode.READY:
        lane, moved = _moved(lane, Mode.DEGRADED_PEER, e.reason, ctx)
        return Step(lane, (moved,))
    if e.reason is None and lane.mode is Mode.DEGRADED_PEER:
        lane, moved = _moved(lane, Mode.READY, "every peer rank answers again", ctx)
        return Step(lane, (moved, ResolveWaiters()))
    return Step(lane, ignored="no change to what the lane serves")


# --- results of a request's actions ----------------------------------------------------------


def _next(lane: LaneStatus, e: i.Result, ctx: Context) -> Step:
    """A result that says go on: the next action of the sequence follows."""
    return Step(lane)


def _peer_stuck(lane: LaneStatus, e: i.PeerStuck, ctx: Context) -> Step:
    """A peer this activation takes off outlived its stop: the activation fails."""
    error = ("ActivationFailed", e.refused.reason, e.refused.hint)
    lane, ended = _ended(lane, ctx, error)
    return Step(lane, tuple(ended))


def _slept_as(lane: LaneStatus, e: i.SleptAs, ctx: Context) -> Step:
    """A sleeper about to be activated: woken, or started cold where its config (a reload)
    or its checkpoint on disk changed while it slept."""
    if lane.mode is not Mode.SLEEPING:  # its engine ended meanwhile (its exit was judged)
        return _cold(
            lane,
            "the sleeper's engine ended before its wake: a cold start",
            lane.op.reason if lane.op else "",
        )
    asleep = lane.asleep or Asleep()
    level = asleep.level or (ctx.spec.sleep_level if ctx.spec else 1)
    if asleep.digest != e.digest:
        why = "its config changed while it slept: stopping it for a cold start with the new one"
        return _cold(lane, why, f"activate {lane.name}: its config changed")
    if e.moved is not None:
        stale = STALE_WAKE.get(level, STALE_WAKE[1])
        why = (
            f"{e.moved} changed on disk while it slept: {stale}; "
            "stopping it for a cold start, which reads the new files"
        )
        return _cold(lane, why, f"activate {lane.name}: its checkpoint changed")
    return Step(lane, (Then((Gate(waking=True), WakeUp(level))),))


def _cold(lane: LaneStatus, why: str, reason: str) -> Step:
    """A sleeper (or a wake that failed) stopped, then started cold."""
    op = lane.op
    assert op is not None
    op = dataclasses.replace(op, reason=reason)
    lane = dataclasses.replace(lane, op=op)
    return Step(lane, (Noted(EventKind.SLEEP, why), Then((CheckEnding(),))))


# What a wake would serve of a checkpoint that changed on disk while the engine slept (read in
# vLLM 0.32): level 1 copies back the weights it put in pinned host RAM at the sleep
# (vllm/device_allocator/cumem.py `wake_up`), the old ones; level 2 reads the files again,
# but into the engine its start built (vllm/model_executor/model_loader/reload/inplace.py
# loads in place), and the canary kept for the old weights would call the new ones wrong.
STALE_WAKE = {
    1: "a level-1 wake gives back the copy of the old weights it keeps in host RAM",
    2: "a level-2 wake would read the new weights into the engine the old files built "
    "(in place: its config, tokenizer and layers as they were)",
}


def _ending(lane: LaneStatus, e: i.Ending, ctx: Context) -> Step:
    """Is the lane's unit still running? For a stop: stopped (STOP), or it is over already.
    Before a start: an earlier run still ending is stopped first (its exit must reach laned
    before the new run is followed, or it would be taken for the new run's)."""
    op = lane.op
    assert op is not None
    starting = op.kind in STARTS_IT
    reason = _stop_reason(lane)
    if not e.ending:
        if starting:
            return Step(lane, (Then(START),))
        # Not running (a failed lane included: deactivating it acknowledges the failure).
        effects: list[Effect] = [Task("weights-gone")]
        if lane.mode is not Mode.INACTIVE:
            lane, moved = _moved(lane, Mode.INACTIVE, reason, ctx)
            effects.insert(0, moved)
        lane, ended = _ended(lane, ctx)
        return Step(lane, (*effects, *ended))
    effects = _stop_asked(reason) if starting else []
    lane, moved = _moved(lane, Mode.STOPPING, reason, ctx)
    force = op.force and not starting
    rest = START if starting else ()
    return Step(lane, (*effects, moved, Then((Drain(force), *STOP, *rest))))


def _stop_reason(lane: LaneStatus) -> str:
    """Why the lane stops, for its transitions."""
    op = lane.op
    assert op is not None
    if op.kind == OpKind.ACTIVATE.value:
        if op.reason.startswith(f"activate {lane.name}:"):
            return op.reason  # a sleeper started cold
        return f"its earlier run ends before activate {lane.name}"
    return op.reason or "deactivate"


def _weights_stale(lane: LaneStatus, e: i.WeightsStale, ctx: Context) -> Step:
    """Before a start: the daemon of other weights (or of a checkpoint changed on disk)
    goes first; the gate then waits for its memory too."""
    if e.why is None:
        return Step(lane)
    then = Then((StopWeights(e.why), Gate(), StartWeights(), StartUnit()))
    return Step(lane, (Noted(EventKind.WEIGHTS, e.why), then))


def _cleared(lane: LaneStatus, e: i.Cleared, ctx: Context) -> Step:
    """The start gate passed: a new run of a new engine, watched (for a sleeper: woken
    next); or refused: failed, whoever waits told why."""
    op = lane.op
    assert op is not None
    waking = e.waking
    if waking and lane.mode is not Mode.SLEEPING:  # its engine ended while the gate ran
        return _cold(lane, "the sleeper's engine ended before its wake: a cold start", op.reason)
    effects: list[Effect] = [] if waking else [Prefetch("end")]
    if e.refused is not None:
        lane, failed = _failed(lane, e.refused.reason, ctx, e.refused.hint)
        return Step(lane, (*effects, *failed))
    if waking:
        level = (lane.asleep or Asleep()).level or (ctx.spec.sleep_level if ctx.spec else 1)
        lane, started = _start(
            lane, f"{op.reason}: waking (level {level})", ctx, Mode.WAKING, False
        )
        lane = dataclasses.replace(lane, asleep=None)
        return Step(lane, tuple(started[:2]))  # watched once awake (Woken)
    lane, started = _start(lane, _start_reason(lane), ctx)
    # Watched once its unit started (UnitStarted): a worker rank shows nothing but its unit
    # running, and a port that answers before its unit runs is not this run's.
    return Step(lane, (*effects, *(e for e in started if not isinstance(e, Follow))))


def _unit_started(lane: LaneStatus, e: i.UnitStarted, ctx: Context) -> Step:
    """Its unit runs: the run is watched (readiness, then liveness)."""
    return Step(lane, (Follow(),) if lane.mode is Mode.STARTING else ())


def _start_reason(lane: LaneStatus) -> str:
    op = lane.op
    assert op is not None
    if op.kind == OpKind.RESTART.value and not op.reason.startswith("restart #"):
        return f"restart: {op.reason}"
    return op.reason


def _weights_up(lane: LaneStatus, e: i.WeightsUp, ctx: Context) -> Step:
    """The daemon serves (the start maps from it), or it did not come up: the run's failure,
    counted; a restart after the backoff, or the end of a crash loop."""
    lane = dataclasses.replace(lane, start_kind=e.kind) if e.kind else lane
    if e.refused is None:
        return Step(lane)
    lane, counted, effects = _count_failure(lane, ctx, "weights", e.refused.reason)
    if counted is not None and counted.crash_loop:
        lane, failed = _failed(lane, counted.reason, ctx, e.refused.hint)
        return Step(lane, (*effects, *failed))
    assert ctx.spec is not None
    failures = len(counted.failures) if counted is not None else 1
    delay = policy.backoff_delay(ctx.spec.restart_sec, failures, ctx.spec.restart_max_delay)
    why = f"{e.refused.reason}; restarting in {delay:g}s"
    lane, moved = _moved(lane, Mode.RESTARTING, why, ctx)
    # The request goes on: it waits for the start after the backoff (BackoffOver).
    return Step(lane, (*effects, moved, CancelRestart(), ScheduleRestart(delay), End()))


def _unit_stopped(lane: LaneStatus, e: i.UnitStopped, ctx: Context) -> Step:
    """The unit's stop job ended: stopped (a restart starts it next), or still running."""
    op = lane.op
    assert op is not None
    if op.kind == OpKind.RESTART.value:
        if lane.mode is Mode.RESTART_STOPPING:
            lane = dataclasses.replace(lane, mode=Mode.RESTARTING)  # its stop is over
        if e.refused is None:
            return Step(lane)
        return _stop_failed(lane, e.refused, ctx)  # its waiters hear why
    if op.kind == GIVE_UP:  # failed all the same; its stop's failure said with why
        if e.refused is not None:
            op = dataclasses.replace(op, reason=f"{op.reason}; and {e.refused.reason}")
            lane = dataclasses.replace(lane, op=op)
        return Step(lane)
    if e.refused is None:
        return Step(lane)
    return _stop_failed(lane, e.refused, ctx)


def _stop_failed(lane: LaneStatus, refused: i.Refused, ctx: Context) -> Step:
    """The unit, its container or its daemon outlived the stop: failed, and whoever asked
    hears why."""
    lane, failed = _failed(lane, refused.reason, ctx, refused.hint)
    return Step(lane, tuple(failed))


def _container_gone(lane: LaneStatus, e: i.ContainerGone, ctx: Context) -> Step:
    return Step(lane) if e.refused is None else _stop_failed(lane, e.refused, ctx)


def _weights_down(lane: LaneStatus, e: i.WeightsDown, ctx: Context) -> Step:
    """The daemon is gone: the end of a stop (the lane inactive), of giving up (failed, its
    stop said if it failed), or of the old daemon before a start (the gate follows)."""
    if lane.op is not None and lane.op.kind == GIVE_UP:
        op = lane.op
        said: list[Effect] = [Noted(EventKind.WEIGHTS, e.refused.reason)] if e.refused else []
        lane, failed = _failed(lane, op.reason, ctx)
        return Step(lane, (*said, *failed))
    if e.refused is not None:
        return _stop_failed(lane, e.refused, ctx)
    starting = lane.op is not None and lane.op.kind in STARTS_IT
    if starting and lane.mode is not Mode.STOPPING:
        return Step(lane)  # the daemon of other weights gone before a start: the gate next
    effects: list[Effect] = []
    if lane.mode is not Mode.INACTIVE:  # (a stop outside laned may have said so already)
        lane, moved = _moved(lane, Mode.INACTIVE, _stop_reason(lane), ctx)
        effects.append(moved)
    if starting:
        return Step(lane, tuple(effects))  # an activation: its start follows
    lane, ended = _ended(lane, ctx)
    return Step(lane, (*effects, *ended))


def _level_chosen(lane: LaneStatus, e: i.LevelChosen, ctx: Context) -> Step:
    """Into sleep at the level chosen: `stopping` (no new request), its requests drained,
    then the engine put to sleep."""
    op = lane.op
    assert op is not None
    effects: list[Effect] = []
    if e.why:
        effects.append(Noted(EventKind.SLEEP, f"sleeping at level 2, not 1: {e.why}"))
    lane, moved = _moved(lane, Mode.FALLING_ASLEEP, f"{op.reason}: to sleep (level {e.level})", ctx)
    lane = dataclasses.replace(lane, asleep=Asleep(level=e.level))
    return Step(lane, (*effects, moved, Unfollow(), Then((Drain(op.force), PutToSleep(e.level)))))


def _not_serving_now(lane: LaneStatus, e: i.LevelChosen, ctx: Context) -> Step:
    """A sleep was to begin, but the lane stopped serving meanwhile: stopped instead."""
    said = Noted(EventKind.SLEEP, "it stopped serving before its sleep: stopping it instead")
    return Step(lane, (said, Then((CheckEnding(),))))


def _gone_before_sleep(lane: LaneStatus, e: i.Slept, ctx: Context) -> Step:
    """Its engine ended while it was being put to sleep (its exit was judged): off its GPUs
    all the same, and the take-off is over."""
    lane, ended = _ended(lane, ctx)
    return Step(lane, tuple(ended))


def _slept(lane: LaneStatus, e: i.Slept, ctx: Context) -> Step:
    """The engine sleeps, confirmed (the activation that asked goes on); or it did not, and
    it is stopped instead."""
    op = lane.op
    assert op is not None
    if e.refused is not None:
        said = Noted(EventKind.SLEEP, f"{e.refused.reason}: stopping it instead")
        return Step(lane, (said, Then((CheckEnding(),))))
    level = (lane.asleep or Asleep()).level
    lane = dataclasses.replace(
        lane,
        asleep=Asleep(e.pids, e.digest, level),
        pinned=lane.pinned or level == 1,  # torch keeps those until the engine ends
        residual=frozen(e.residual) if e.residual else lane.residual,
    )
    lane, moved = _moved(lane, Mode.SLEEPING, f"{op.reason}: asleep (level {level})", ctx)
    lane, ended = _ended(lane, ctx)
    return Step(lane, (moved, *ended))


def _woken(lane: LaneStatus, e: i.Woken, ctx: Context) -> Step:
    """Awake, its canary as kept: readiness is watched as after a start; or the wake
    failed, and it is stopped for a cold start."""
    op = lane.op
    assert op is not None
    if e.refused is None:
        return Step(lane, (Follow(),))
    said = Noted(EventKind.SLEEP, f"{e.refused.reason}: stopping it for a cold start")
    op = dataclasses.replace(op, reason=f"{op.reason}: the wake failed")
    lane = dataclasses.replace(lane, op=op)
    return Step(lane, (said, Then((CheckEnding(),))))


# The errors of a host away (laned.errors): the action broke because the bus or podman was
# out of reach, not because the host said no; laned.owner.outages catches the lane up.
HOST_AWAY = frozenset({"BusUnavailable", "PodmanUnavailable", "JournalUnavailable"})


def _broken(lane: LaneStatus, e: i.Broken, ctx: Context) -> Step:
    """An action broke: its request ends with the error (an activation's as ActivationFailed,
    as its callers expect), and the lane stays where it is for laned.owner.outages to catch
    up once the host answers again; a stop of laned's that broke is over all the same."""
    op = lane.op
    assert op is not None
    name = e.error
    if op.kind in STARTS_IT and name not in ("ActivationFailed", "Superseded", "PreflightFailed"):
        name = "ActivationFailed"
    if lane.mode is Mode.RESTART_STOPPING:
        lane = dataclasses.replace(lane, mode=Mode.RESTARTING)
    if op.kind == GIVE_UP:
        lane, failed = _failed(lane, f"{op.reason}; and {e.message}", ctx, e.hint)
        return Step(lane, tuple(failed))
    if lane.mode in (Mode.STARTING, Mode.WAKING, Mode.RESTARTING) and e.error not in HOST_AWAY:
        # In the middle of a start, nothing would move it (no watcher yet, no timer): failed,
        # whoever waits told why; the next activate starts it again. (A host away — the bus,
        # podman — leaves it for laned.owner.outages to catch up once it is back.)
        lane, failed = _failed(lane, e.message, ctx, e.hint)
        return Step(lane, (Unfollow(), *failed))
    lane, ended = _ended(lane, ctx, (name, e.message, e.hint), settle=False)
    return Step(lane, tuple(ended))


# --- the table -------------------------------------------------------------------------------


def _rows(acts: Mapping[frozenset[Mode], Handler], otherwise: Ignore | Refuse) -> dict[Mode, Cell]:
    """A row of the table: the handler in the modes it acts in, `otherwise` in the rest."""
    row: dict[Mode, Cell] = dict.fromkeys(Mode, otherwise)
    for modes, handler in acts.items():
        for mode in modes:
            row[mode] = handler
    return row


def _only(cell: Ignore | Refuse, row: dict[Mode, Cell], *modes: Mode) -> dict[Mode, Cell]:
    """`row` with `cell` in `modes`."""
    return {**row, **dict.fromkeys(modes, cell)}


RUNNING = frozenset(
    {
        Mode.STARTING,
        Mode.WAKING,
        Mode.READY,
        Mode.FAILING,
        Mode.DEGRADED_CHECK,
        Mode.DEGRADED_PEER,
        Mode.RESTARTING,
    }
)
SETTLED = frozenset({Mode.INACTIVE, Mode.FAILED})
ASLEEP = frozenset({Mode.SLEEPING, Mode.FALLING_ASLEEP})
ENGINE_RUNS = RUNNING | STOP_MODES | ASLEEP
SLEEPS = SERVING_MODES | {Mode.FAILING}  # what a take-off puts to sleep

TABLE: dict[type[i.Input], dict[Mode, Cell]] = {
    # Requests, as the owner planned them across lanes. Each applies in any mode a newer
    # request can meet (the newest wins over whatever the lane is doing).
    i.Activate: _rows({ANY: _activate}, Refuse("")),
    i.Deactivate: _rows({ANY: _deactivate}, Refuse("")),
    i.Restart: _rows({ANY: _restart}, Refuse("")),  # the handler: desired lanes only
    i.TakeOff: _rows({ANY - SETTLED: _take_off}, Ignore("off its GPUs already")),
    i.Superseded: _rows({ANY: _superseded_input}, Refuse("")),
    i.Desire: _rows({ANY: _desire}, Refuse("")),  # what is wanted holds in any mode
    i.Lost: _rows({RUNNING: _lost}, Ignore("not holding its GPUs: nothing of it to start again")),
    i.BackoffOver: _rows(
        {frozenset({Mode.RESTARTING}): _backoff_over},
        Ignore("not waiting for a restart any more (a newer request moved the lane)"),
    ),
    i.Restore: _rows(
        {frozenset({Mode.INACTIVE}): _restore},
        Refuse("state.json is read once, before any lane moved"),
    ),
    # What systemd says of the unit.
    i.Exited: _only(
        Ignore("failed already: an exit of the run given up"),
        _rows({ENGINE_RUNS: _exited}, Ignore("no engine of the lane runs")),
        Mode.FAILED,
    ),
    i.UnitSeen: _rows({ANY: _unit_seen}, Refuse("")),  # what systemd shows, kept in any mode
    i.StartedOutside: _rows({SETTLED: _started_outside}, Ignore("laned starts or runs it")),
    i.Adopt: _rows({ANY - ASLEEP: _adopt}, Ignore("asleep: found so, it stays so")),
    i.FoundAsleep: _rows(
        {frozenset({Mode.INACTIVE}): _found_asleep},
        Refuse("found asleep only as laned starts, before any lane moved"),
    ),
    i.RankSlept: _rows(
        {SERVING_MODES: _rank_slept},
        Ignore("not serving: a rank sleeps with its head only from where it serves"),
    ),
    i.FoundStopped: _rows({ANY - {Mode.INACTIVE}: _found_stopped}, Ignore("inactive already")),
    i.StoppedOutside: _rows({ANY - SETTLED: _stopped_outside}, Ignore("settled already")),
    # What the watchers and the journal see of the run (an older run's report is dropped).
    i.Ready: _rows(  # `restarting`: a run systemd restarted (Restart=on-failure) is followed
        {STARTING_MODES | {Mode.RESTARTING}: _ready},
        Ignore("a readiness report counts only while the lane starts"),
    ),
    i.ProbeFailed: _rows(
        {SERVING_MODES: _probe_failed},
        Ignore("not serving: liveness is judged while the engine serves"),
    ),
    i.Failing: _rows(
        {SERVING_MODES | STARTING_MODES: _failing},
        Ignore("not serving or starting: a restart or a stop is under way"),
    ),
    i.WeightsDied: _rows(
        {SERVING_MODES | STARTING_MODES: _weights_died},
        Ignore("restarting, stopping or settled: that brings its daemon back or not"),
    ),
    i.GiveUp: _rows({RUNNING: _give_up}, Ignore("laned stops it, or it is settled, already")),
    i.PhaseSeen: _rows({ANY: _phase_seen}, Refuse("")),  # kept for its run in any mode
    i.StartKind: _rows({STARTING_MODES: _start_kind}, Ignore("the start is over")),
    i.Sampled: _rows({RUNNING: _sampled}, Ignore("its engine does not serve")),
    i.WeightsAtStart: _rows({ANY: _weights_at_start}, Refuse("")),  # of its run (tagged)
    i.WeightsSeen: _rows({ANY: _weights_seen}, Refuse("")),  # the daemon's own unit, shown
    i.Checking: _rows({ANY: _checking}, Refuse("")),  # checks keep it busy in any mode
    i.Checked: _rows({ANY: _checked}, Refuse("")),  # kept; it degrades a ready lane only
    i.PeerTrouble: _rows(
        {SERVING_MODES: _peer_trouble},
        Ignore("not serving: a peer out of reach degrades a ready lane only"),
    ),
    # Results of the actions of the lane's own request (an older request's are dropped
    # before the table, by their epoch). A request goes on from whatever mode what was seen
    # meanwhile moved the lane to (an activation begins in any mode; an exit, a stop outside
    # laned can come while an action runs), so most results act in every mode and their
    # handler reads the mode; the rest act where their action runs, and where only a bug
    # could bring them, are refused: the request then ends with the error (nobody hangs).
    i.Preflighted: _rows({ANY: _preflighted}, Refuse("")),
    i.PeerOff: _rows({ANY: _next}, Refuse("")),
    i.PeerStuck: _rows({ANY: _peer_stuck}, Refuse("")),
    i.SleptAs: _rows({ANY: _slept_as}, Refuse("")),  # not asleep any more: a cold start
    i.Ending: _rows({ANY: _ending}, Refuse("")),
    i.WeightsStale: _rows({ANY: _weights_stale}, Refuse("")),
    i.Cleared: _rows({ANY: _cleared}, Refuse("")),  # a wake's gate: asleep, else cold
    i.WeightsUp: _rows(
        {frozenset({Mode.STARTING}): _weights_up},
        Ignore("the run ended meanwhile and its exit was judged: the request waits on that"),
    ),
    i.UnitStarted: _rows({ANY: _unit_started}, Refuse("")),  # the last of a start
    i.Drained: _rows({ANY: _next}, Refuse("")),  # the stop or sleep goes on
    i.UnitStopped: _rows(
        {STOP_MODES | SETTLED: _unit_stopped},
        Refuse("a stop job runs in a stop, and only an exit or a stop outside laned moves it"),
    ),
    i.ContainerGone: _rows(
        {frozenset({Mode.STOPPING}) | SETTLED: _container_gone},
        Refuse("confirmed in a stop, and only an exit or a stop outside laned moves it"),
    ),
    i.WeightsDown: _rows(
        {ANY - ASLEEP: _weights_down},
        Refuse("a sleeper is woken or stopped before its daemon stops"),
    ),
    i.LevelChosen: _rows(  # a sleep of a lane that stopped serving meanwhile: stopped instead
        {SLEEPS: _level_chosen, ANY - SLEEPS: _not_serving_now}, Refuse("")
    ),
    i.Slept: _rows(
        {frozenset({Mode.FALLING_ASLEEP}): _slept, SETTLED: _gone_before_sleep},
        Refuse("put to sleep in its sleep's mode; only its exit moves it from there"),
    ),
    i.Woken: _rows(
        {frozenset({Mode.WAKING}): _woken},
        Ignore("its run ended while it woke and its exit was judged: the request waits on that"),
    ),
    i.Broken: _rows({ANY: _broken}, Refuse("")),  # any action breaks in whatever mode it runs
}
