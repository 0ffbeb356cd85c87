"""Which lane gets the GPU memory when requests at laned's OpenAI endpoint ask for several
lanes that cannot run together (docs/proxy.md, "Several models"). Pure: a snapshot in, a decision out; the owner's
scheduler (laned.owner.scheduler) gathers the snapshot and acts, the proxy asks `admit`.

laned's policy ("laned"): requests wait per lane; a lane whose waiting requests need memory
that others hold (the residents: those placement would take off for it, laned.core.placement)
gets it once each of them has had nothing in flight or queued for a moment (its idle grace),
or has been resident long enough to have paid for its swap (its min residency: what its own
swap in cost, measured, unless the lane says). A lane that fits beside the running ones
starts with no swap at all (the owner's scheduler sees to that).
The next lane is the one whose oldest request has waited longest, a lane's `priority` worth
PRIORITY_STEP seconds of waiting a point, so that no lane starves: a waiting lane's score
grows while the others' reset when they are served. A pinned resident is never swapped out
by requests. Many requests that arrive together make one swap.

"fifo" is what a queue in arrival order does (llama-swap's): the head of the queue decides,
and a swap happens as soon as the resident has nothing in flight. bench/schedule.py runs
both side by side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

PRIORITY_STEP = 60.0  # seconds of waiting one point of `priority` is worth
IDLE_GRACE = 0.1  # of the resident's min residency: how long "idle" must last before a swap
UNMEASURED_RESIDENCY = 30.0  # seconds, for a lane whose swap in was never measured


class Verdict(str, Enum):
    GO = "go"  # to the engine now
    WAIT = "wait"  # in the lane's queue
    REFUSE = "refuse"  # answered at once, with why


@dataclass(frozen=True)
class Admission:
    verdict: Verdict
    why: str = ""
    hint: str = ""


@dataclass(frozen=True)
class LaneView:
    """One lane of a group, as a decision sees it (times in the caller's clock, seconds)."""

    name: str
    serving: bool = False  # ready, or degraded but serving
    resident: bool = False  # desired active and not failed: it holds the GPUs or is on its way
    blocked: str = ""  # why a request may not start it ("": it may)
    pinned: bool = False
    priority: int = 0
    min_residency: float = UNMEASURED_RESIDENCY
    ready_since: float | None = None  # when it last became ready
    quiet_since: float | None = None  # since when nothing was in flight or queued (None: busy)
    in_flight: int = 0
    arrivals: tuple[float, ...] = ()  # its waiting requests' arrival times, oldest first


@dataclass(frozen=True)
class Decision:
    swap_to: str | None = None
    reason: str = ""
    cause: str = ""  # empty, idle, residency, fifo, idle_return (laned_schedule_swaps_total)
    again_at: float | None = None  # decide again then, even if nothing else happens


def min_residency(
    override: float | None, woke: bool, last_wake: float | None, last_cold_start: float | None
) -> tuple[float, str]:
    """How long a lane stays once in while others wait, and where the figure comes from:
    the lane's own `min_residency`, else what its swap in cost (its last wake when it came
    from sleep, its last cold start otherwise), else UNMEASURED_RESIDENCY."""
    if override is not None:
        return override, "its min_residency"
    measured = last_wake if woke else last_cold_start
    if measured is not None:
        return measured, f"its measured {'wake' if woke else 'cold start'}"
    return UNMEASURED_RESIDENCY, "not measured yet"


def admit(lane: LaneView, peers: Sequence[LaneView], policy: str, arrived: float) -> Admission:
    """Whether a request for `lane` that arrived at `arrived` goes to its engine now, waits
    in its queue, or is refused. `peers`: the other lanes of its group."""
    if lane.serving:
        if policy == "fifo" and any(p.arrivals and p.arrivals[0] < arrived for p in peers):
            return Admission(Verdict.WAIT)  # an older request for another lane goes first
        return Admission(Verdict.GO)
    if lane.resident:
        return Admission(Verdict.WAIT)  # starting, restarting, or a swap towards it
    if lane.blocked:
        return Admission(Verdict.REFUSE, lane.blocked)
    pinned = next((p for p in peers if p.resident and p.pinned), None)
    if pinned is not None:
        return Admission(
            Verdict.REFUSE, f"{pinned.name} is pinned in its group: only an operator swaps it out"
        )
    return Admission(Verdict.WAIT)


def decide(
    lanes: Sequence[LaneView],
    now: float,
    policy: str = "laned",
    default_lane: str | None = None,
    idle_return: float | None = None,
    last_request: float | None = None,
) -> Decision:
    """The next swap among `lanes` (the lanes that compete for the same GPU memory: a lane
    that waits and those it would take off), if one is due now (no operation is under way
    on them). The residents are the lanes that hold the memory; all of them must give way.
    `last_request`: when these lanes last had a request (for `idle_return`)."""
    residents = [v for v in lanes if v.resident]
    waiting = [v for v in lanes if v.arrivals and not v.resident and not v.blocked]
    if any(not r.serving or r.pinned for r in residents):
        return Decision()  # on its way, or restarting: it comes first; pinned: it stays
    if not waiting:
        return _idle_return(residents, lanes, now, default_lane, idle_return, last_request)
    if policy == "fifo":
        return _fifo(residents, lanes, waiting)
    best = max(waiting, key=lambda v: (now - v.arrivals[0] + v.priority * PRIORITY_STEP, v.name))
    asked = f"swap to {best.name}: {len(best.arrivals)} request(s) waiting {now - best.arrivals[0]:.0f} s"
    if not residents:
        return Decision(best.name, f"{asked}; nothing runs in its place", "empty")
    reasons: list[str] = []
    causes: set[str] = set()
    again: float | None = None
    for resident in residents:
        grace = resident.min_residency * IDLE_GRACE
        quiet = resident.quiet_since
        held = now - (resident.ready_since if resident.ready_since is not None else now)
        if quiet is not None and now - quiet >= grace:
            reasons.append(f"{resident.name} idle {now - quiet:.0f} s")
            causes.add("idle")
        elif held >= resident.min_residency:
            reasons.append(
                f"{resident.name} resident {held:.0f} s, past its min residency "
                f"{resident.min_residency:.0f} s"
            )
            causes.add("residency")
        else:
            later = now + resident.min_residency - held
            if quiet is not None:
                later = min(later, quiet + grace)
            again = later if again is None else max(again, later)
    if again is not None:
        return Decision(again_at=again)
    cause = "idle" if causes == {"idle"} else "residency"
    return Decision(best.name, f"{asked}; {', '.join(reasons)}", cause)


def _fifo(
    residents: list[LaneView], lanes: Sequence[LaneView], waiting: list[LaneView]
) -> Decision:
    """The head of the queue decides: swap to its lane once the residents have nothing in
    flight (their own requests queue behind it meanwhile)."""
    heads = [v for v in lanes if v.arrivals and (v.resident or not v.blocked)]
    head = min(heads, key=lambda v: (v.arrivals[0], v.name))
    if head.resident:
        return Decision()
    why = f"swap to {head.name}: fifo, the oldest request waiting is for it"
    if not residents:
        return Decision(head.name, why, "fifo")
    if any(r.in_flight for r in residents):
        return Decision()  # decided again when their last request ends
    names = ", ".join(r.name for r in residents)
    return Decision(head.name, f"{why}; {names} has nothing in flight", "fifo")


def _idle_return(
    residents: list[LaneView],
    lanes: Sequence[LaneView],
    now: float,
    default_lane: str | None,
    idle_return: float | None,
    last_request: float | None,
) -> Decision:
    """Back to the default lane after `idle_return` with no request: only from lanes that
    serve and are not pinned (nothing running stays so; an operator's choice stays)."""
    if not residents or default_lane is None or idle_return is None:
        return Decision()
    if any(r.name == default_lane or r.quiet_since is None for r in residents):
        return Decision()
    if not any(v.name == default_lane for v in lanes):
        return Decision()
    times = [last_request] + [t for r in residents for t in (r.ready_since, r.quiet_since)]
    since = max(t for t in times if t is not None)
    if now - since >= idle_return:
        return Decision(
            default_lane,
            f"back to the default lane {default_lane}: no request for {now - since:.0f} s "
            f"(idle_return {idle_return:.0f} s)",
            "idle_return",
        )
    return Decision(again_at=since + idle_return)
