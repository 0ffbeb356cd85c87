"""What the lane machine's step asks for (laned.core.machine.step): its effects, as data. The
owner's interpreter (laned.owner.interpreter) runs them; none changes a lane's record.

Two kinds:

- bookkeeping, done at once and in order: a transition or a note published, the run
  watched or not, a restart scheduled or dropped, waiters answered, the request's caller
  answered, a figure counted, an input posted to another lane;
- the sequence of a request (`Begin`, `Then`, `End`): named actions done one after another
  on the host, each answered by a result input (laned.core.inputs.Result) that the step
  reads before the next. The sequences themselves are the table's: `STOP`, `START`, ...
  below, built by laned.core.machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from laned.core.inputs import Input
from laned.core.lanes import EventKind
from laned.core.modes import LaneState
from laned.errors import Finding

# --- bookkeeping -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Effect:
    """Anything the step asks for."""


@dataclass(frozen=True)
class Moved(Effect):
    """A transition to publish (the event log, listeners, the day's timeline, the log)."""

    was: LaneState
    now: LaneState
    reason: str


@dataclass(frozen=True)
class Noted(Effect):
    """An event that changes no state."""

    kind: EventKind
    text: str


@dataclass(frozen=True)
class Follow(Effect):
    """Watch the lane's current run: readiness, then liveness."""


@dataclass(frozen=True)
class Unfollow(Effect):
    """The run's watcher ends."""


@dataclass(frozen=True)
class CancelRestart(Effect):
    """A restart waiting for its backoff is dropped."""


@dataclass(frozen=True)
class ScheduleRestart(Effect):
    """Start the lane again after `delay` seconds (laned.core.inputs.BackoffOver)."""

    delay: float


@dataclass(frozen=True)
class ResolveWaiters(Effect):
    """Those waiting for the lane to be ready hear it is."""


@dataclass(frozen=True)
class FailWaiters(Effect):
    """Those waiting hear why it will not be ready (`superseded`: a newer request won)."""

    reason: str
    superseded: bool = False


@dataclass(frozen=True)
class Answer(Effect):
    """The requests `epochs` end: their callers hear the lane's record, or the error
    (`error`: the name of a class of laned.errors, its message and hint; `findings`: what
    preflight found, for PreflightFailed)."""

    epochs: tuple[int, ...]
    error: str | None = None
    message: str = ""
    hint: str = ""
    findings: tuple[Finding, ...] = ()


@dataclass(frozen=True)
class Count(Effect):
    """A figure for laned's metrics: a Recorder method of laned.core.recorder and its
    arguments, as it takes them."""

    what: str
    args: tuple[object, ...] = ()


@dataclass(frozen=True)
class Post(Effect):
    """An input for another lane (a peer's request, a peer's answer)."""

    lane: str
    input: Input


@dataclass(frozen=True)
class Poke(Effect):
    """The readiness watcher looks again now (the engine said it is about to answer)."""


@dataclass(frozen=True)
class Alarm(Effect):
    """The liveness watcher asks the engine's health now (the engine says it is dying)."""


@dataclass(frozen=True)
class Prefetch(Effect):
    """The lane's weights: read ahead while `taking_off` stop (`begin`), or no more
    (`end`), and what was resident as the engine starts (`at_start`)."""

    what: str  # begin, end, at-start
    taking_off: tuple[str, ...] = ()


@dataclass(frozen=True)
class Task(Effect):
    """Work beside the lane's sequence, whose result (if any) comes back as an input:
    `after-activate` (its acceptance gates), `weights-gone` (its daemon stopped, a failure
    said in its events), `stopped-outside` (was the user manager going down?)."""

    what: str
    reason: str = ""


# --- the sequence of a request ---------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One named step of a request's sequence, done on the host; answered by a result."""


@dataclass(frozen=True)
class RunPreflight(Action):
    """The lane's preflight, before anything is stopped."""


@dataclass(frozen=True)
class TakePeerOff(Action):
    """Take a peer off its GPUs (laned.core.inputs.TakeOff) and wait until it is off."""

    peer: str
    reason: str
    force: bool
    asleep_too: bool


@dataclass(frozen=True)
class CheckSlept(Action):
    """A sleeper about to be activated: what it slept as against now."""


@dataclass(frozen=True)
class CheckEnding(Action):
    """Whether the lane's unit runs or is stopping (an earlier run still ending)."""


@dataclass(frozen=True)
class CheckWeights(Action):
    """Before a start: must the running weight-cache daemon go (other weights, a changed
    checkpoint)?"""


@dataclass(frozen=True)
class Gate(Action):
    """The start gate: prepare after an image change, the GPU memory released (beside the
    lanes that stay), the port free; before a wake (`waking`), the GPU memory only."""

    waking: bool = False


@dataclass(frozen=True)
class StartWeights(Action):
    """The weight-cache daemon serves before the engine starts (started unless it runs)."""


@dataclass(frozen=True)
class StartUnit(Action):
    """The lane's unit started (its checkpoint recorded first where it sleeps)."""


@dataclass(frozen=True)
class Drain(Action):
    """The requests in flight through laned's endpoint end first (unless `force`)."""

    force: bool


@dataclass(frozen=True)
class StopUnit(Action):
    """The lane's unit stopped, and its stop confirmed."""


@dataclass(frozen=True)
class ConfirmContainerGone(Action):
    """A container lane's container is gone before anything starts on its GPUs."""


@dataclass(frozen=True)
class StopWeights(Action):
    """The lane's weight-cache daemon stopped and gone (`why`: for the lane's events)."""

    why: str = ""


@dataclass(frozen=True)
class ChooseLevel(Action):
    """The level the lane sleeps at now: its own, or 2 where host RAM cannot hold level 1."""


@dataclass(frozen=True)
class PutToSleep(Action):
    """The engine put to sleep at `level`, and that confirmed."""

    level: int


@dataclass(frozen=True)
class WakeUp(Action):
    """The engine woken from `level`, and its canary asked before any traffic."""

    level: int


@dataclass(frozen=True)
class Begin(Effect):
    """A new sequence for the request under way (one running before it ends)."""

    actions: tuple[Action, ...]


@dataclass(frozen=True)
class Then(Effect):
    """The rest of the running sequence, from now on."""

    actions: tuple[Action, ...]


@dataclass(frozen=True)
class End(Effect):
    """The running sequence ends here."""
