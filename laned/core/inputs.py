"""What reaches a lane: the lane machine's inputs (laned.core.machine.step). Pure data.

Three kinds, each a frozen dataclass:

- requests (an operator's, a peer lane's activation, laned's own at start): activate,
  deactivate, restart, take off for another lane, desire, superseded;
- what is seen (systemd's word on the unit, the watchers', the journal's, the checks',
  the peer ranks'): an exit, ready, a failed probe, a stall, a phase, a sample ...;
- the result of an action of the lane's sequence (laned.core.effects), tagged with the
  epoch of the request that asked for it (`epoch`): a result of an older request is
  stale and the step drops it before the table is read.

The step has no clock of its own and reads no config: the owner hands it both with each
input (laned.core.machine.Context).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from laned.core.exits import ExitFacts
from laned.core.lanes import Desired, LastExit
from laned.core.liveness import EngineSample
from laned.core.phases import Seen
from laned.core.unit_state import UnitSnapshot
from laned.errors import Finding


@dataclass(frozen=True)
class Input:
    """Anything that reaches a lane."""


@dataclass(frozen=True)
class Result(Input):
    """The result of an action of a request's sequence (laned.core.effects.Action)."""

    epoch: int


@dataclass(frozen=True)
class Refused:
    """An action that could not be done: why (for the lane's reason) and what to do."""

    reason: str
    hint: str = ""


# --- requests --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Activate(Input):
    """Make the lane run (its peers taken off first: `evicts`, by laned.core.placement)."""

    epoch: int
    reason: str
    force: bool = False
    unattended: bool = False
    findings: tuple[Finding, ...] | None = None  # a preflight its caller ran just now
    evicts: tuple[str, ...] = ()
    stops_asleep: tuple[str, ...] = ()
    from_lane: str = "none"
    desired_before: Mapping[str, Desired] = field(default_factory=dict)
    started: float = 0.0  # monotonic


@dataclass(frozen=True)
class Deactivate(Input):
    """Stop the lane (never a failure)."""

    epoch: int
    reason: str
    force: bool = False


@dataclass(frozen=True)
class Restart(Input):
    """Stop and start a desired lane again (`kind`: laned.core.policy.RestartKind's value)."""

    epoch: int
    reason: str
    kind: str
    force: bool = False


@dataclass(frozen=True)
class TakeOff(Input):
    """Another lane's activation (`by`) takes this one off its GPUs: to sleep where it can,
    else stopped; a sleeper stays asleep unless what it keeps is in the way (`asleep_too`)."""

    epoch: int
    by: str
    reply: int  # the epoch of `by`'s activation, which waits for this lane's answer
    reason: str
    force: bool
    asleep_too: bool
    sleeps: bool  # it has a sleep level and serves: it sleeps rather than stops


@dataclass(frozen=True)
class Superseded(Input):
    """A newer request won over the lane's request under way (its sequence ends, its caller
    hears why)."""

    why: str


@dataclass(frozen=True)
class Desire(Input):
    """What the operator asked for (or what a request's planning makes of a peer);
    `holding_only`: only while the lane holds its GPUs and no take-off by `unless_by` is
    under way (the peers an activation superseded had not taken off yet)."""

    desired: Desired
    holding_only: bool = False
    unless_by: str = ""


@dataclass(frozen=True)
class BackoffOver(Input):
    """A restart's backoff is over: start the lane again."""


@dataclass(frozen=True)
class Lost(Input):
    """Once systemd is back: the lane's run was lost meanwhile (its unit does not run, and
    it is wanted): started again at once, as after a failure."""

    reason: str


@dataclass(frozen=True)
class Restore(Input):
    """laned starts: what state.json kept of the lane."""

    desired: Desired
    restarts: int
    last_exit: LastExit | None
    last_cold_start: float | None
    last_starts: Mapping[str, float]
    last_phases: Mapping[str, float]
    image_id: str | None
    checks: Mapping[str, Any] | None
    failed: str | None  # why it was failed, when it was


# --- what is seen ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Exited(Input):
    """The lane's engine exited (its unit's main process is gone), with what laned knows."""

    facts: ExitFacts
    sub_state: str
    n_restarts: int
    systemd_restarts: bool  # the unit's own Restart= brings it back (systemd >= 254)


@dataclass(frozen=True)
class UnitSeen(Input):
    """The lane's unit as systemd shows it now (its signal, or a read after a reconnect)."""

    unit: UnitSnapshot


@dataclass(frozen=True)
class StartedOutside(Input):
    """An operator started the lane's unit."""


@dataclass(frozen=True)
class Adopt(Input):
    """Found running (at laned's start, or once systemd is back): followed as it runs."""

    reason: str


@dataclass(frozen=True)
class FoundAsleep(Input):
    """laned started and found the lane's engine asleep: it stays asleep, not desired."""

    digest: str
    level: int
    pids: frozenset[int]


@dataclass(frozen=True)
class RankSlept(Input):
    """A worker's rank of a lane over several hosts, asleep with its head: the head's engine
    put every rank to sleep at `level`, and this host read its own rank's processes (`pids`)
    holding less GPU memory than before (what stays on each GPU: `residual`)."""

    level: int
    pids: frozenset[int]
    residual: Mapping[int, int]
    digest: str


@dataclass(frozen=True)
class FoundStopped(Input):
    """Once systemd is back: the lane's unit is not running, and nothing wants it to."""

    reason: str


@dataclass(frozen=True)
class StoppedOutside(Input):
    """The unit stopped, not by laned: by an operator (`with_manager`: the user manager going
    down: logout, reboot; the lane comes back with laned)."""

    reason: str
    with_manager: bool


@dataclass(frozen=True)
class Ready(Input):
    """The run answers: health and its model listed."""

    run: int
    reason: str
    image_id: str | None


@dataclass(frozen=True)
class Failing(Input):
    """The run stopped serving (its health says it is dead, failed probes, a stall, its
    weight-cache daemon died): `metric` counted (laned.core.recorder: probe_failure,
    stall; "" for none), `seen_by` counts the run's failure once, then a restart follows
    (or giving up, at the end of a crash loop)."""

    run: int
    reason: str
    seen_by: str  # health, stalled, weights
    restart_kind: str
    metric: str = ""


@dataclass(frozen=True)
class ProbeFailed(Input):
    """One failed health probe of a serving run; at `limit` in a row it stopped serving."""

    run: int
    failures: int
    limit: int


@dataclass(frozen=True)
class GiveUp(Input):
    """A start timeout or the memory guard: the run failed, and the lane is stopped and
    left failed until the next activate."""

    run: int
    reason: str
    seen_by: str  # start-timeout, memory-guard


@dataclass(frozen=True)
class PhaseSeen(Input):
    """A startup phase or note of the engine's log, logged at `at`."""

    seen: Seen
    at: float  # when journald says it was logged


@dataclass(frozen=True)
class StartKind(Input):
    """What the current start is after all (the engine's log says the weight cache was
    missed: its weights read from disk)."""

    run: int
    kind: str


@dataclass(frozen=True)
class Sampled(Input):
    """A scrape of the engine's /metrics."""

    run: int
    at: float
    sample: EngineSample


@dataclass(frozen=True)
class WeightsAtStart(Input):
    """How much of the lane's weights was in the page cache as run `run` began."""

    run: int
    shown: Mapping[str, Any] | None


@dataclass(frozen=True)
class WeightsDied(Input):
    """The lane's weight-cache daemon exited, not by laned's stop."""

    reason: str


@dataclass(frozen=True)
class WeightsSeen(Input):
    """The lane's weight-cache daemon as its unit shows it (`unit`, when read), and what
    its ranks hold."""

    shown: str | None
    held: int | None = None
    unit: UnitSnapshot | None = None


@dataclass(frozen=True)
class Checking(Input):
    """Acceptance checks begin (+1) or end (-1) against the lane."""

    delta: int


@dataclass(frozen=True)
class Checked(Input):
    """The lane's acceptance run, kept; `failed`: the first gate that failed and why."""

    run: int
    results: Mapping[str, Any]
    failed: str | None


@dataclass(frozen=True)
class PeerTrouble(Input):
    """A lane over several hosts: a peer rank out of reach (`reason`), or all back (None)."""

    reason: str | None


# --- results of a request's actions ----------------------------------------------------------


@dataclass(frozen=True)
class Preflighted(Result):
    """Preflight's findings (`errors`: how many block)."""

    findings: tuple[Finding, ...]
    errors: int
    refusal: Refused | None  # what to answer when the errors refuse it


@dataclass(frozen=True)
class PeerOff(Result):
    """A peer this activation takes off is off its GPUs (asleep or stopped)."""

    peer: str


@dataclass(frozen=True)
class PeerStuck(Result):
    """A peer this activation takes off could not be stopped."""

    peer: str
    refused: Refused


@dataclass(frozen=True)
class SleptAs(Result):
    """A sleeper about to be activated, against what it slept as: the digest of its unit
    and wrapper now, and the checkpoint files that changed on disk since it read them."""

    digest: str
    moved: str | None


@dataclass(frozen=True)
class Ending(Result):
    """Whether the lane's unit runs or is still stopping."""

    ending: bool


@dataclass(frozen=True)
class WeightsStale(Result):
    """Before a start: why the running weight-cache daemon must go first (None: it serves)."""

    why: str | None


@dataclass(frozen=True)
class Cleared(Result):
    """The start gate passed (prepare, GPU memory, port), or refused; `waking`: the gate
    before a sleeper's wake."""

    refused: Refused | None
    waking: bool = False


@dataclass(frozen=True)
class WeightsUp(Result):
    """The weight-cache daemon serves (`kind`: the start maps from it, or reads from disk
    because the daemon reads them now), or did not come up."""

    kind: str
    refused: Refused | None


@dataclass(frozen=True)
class UnitStarted(Result):
    """The unit's start job ended."""


@dataclass(frozen=True)
class Drained(Result):
    """The requests in flight through laned's endpoint ended (or were cut at the timeout)."""


@dataclass(frozen=True)
class UnitStopped(Result):
    """The unit's stop job ended: stopped, or still running (`refused`)."""

    refused: Refused | None


@dataclass(frozen=True)
class ContainerGone(Result):
    """A container lane's container is gone after its stop, or not (`refused`)."""

    refused: Refused | None


@dataclass(frozen=True)
class WeightsDown(Result):
    """The lane's weight-cache daemon is gone (`refused`: it did not stop)."""

    refused: Refused | None


@dataclass(frozen=True)
class LevelChosen(Result):
    """The level the lane sleeps at now, and why when not its own."""

    level: int
    why: str


@dataclass(frozen=True)
class Slept(Result):
    """The engine sleeps, confirmed: its processes, what they keep on each GPU, the digest
    of its unit and wrapper, how long the sleep took; or not (`refused`)."""

    refused: Refused | None
    pids: frozenset[int] = frozenset()
    residual: Mapping[int, int] = field(default_factory=dict)
    digest: str = ""


@dataclass(frozen=True)
class Broken(Result):
    """An action that broke (a call to systemd failed: the bus lost, say): its request ends
    with the error (`error`: the name of a class of laned.errors, its message and hint)."""

    error: str
    message: str
    hint: str


@dataclass(frozen=True)
class Woken(Result):
    """The engine is awake and its canary answered as kept, or not (`refused`)."""

    refused: Refused | None
