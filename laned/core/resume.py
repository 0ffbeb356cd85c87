"""How laned takes the lanes up again, pure: at its own start (`plan_reconcile`: adopt what
runs, start what should) and when it sees systemd again after losing sight of it
(`plan_catch_up`: the bus dropped, the user manager re-executed or started anew). The owner
acts on the answers (`Supervisor.reconcile`, `Outages._catch_up`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from laned.config.model import Config
from laned.core.lanes import Desired, LaneState
from laned.core.policy import HOLDING_STATES, SETTLED_STATES

# --- after laned lost sight of systemd ------------------------------------------------------


class CatchUp(str, Enum):
    """What a lane needs once laned sees systemd again (see plan_catch_up)."""

    NOTHING = "nothing"
    ADOPT = "adopt"  # desired, its unit runs and nothing watches it: follow it again
    RESTART = "restart"  # desired, its own run lost (no peer holds the GPUs): start it again
    ACTIVATE = "activate"  # desired, never got going: activate it (its peers stop first)
    STOP = "stop"  # not desired, and its unit still runs: stop it
    SETTLE = "settle"  # not desired, its unit stopped, its state not yet inactive


@dataclass(frozen=True)
class LaneNow:
    """A lane as the owner knows it when systemd is seen again."""

    state: LaneState
    desired: Desired
    running: bool  # its unit runs, as systemd now says
    busy: bool  # an operation of its group, a pending restart or a watch is under way


def plan_catch_up(
    config: Config, lanes: Mapping[str, LaneNow], *, workers: Collection[str]
) -> dict[str, CatchUp]:
    """After the user bus came back or the manager was re-executed or replaced: what each
    lane needs to match the last request. Busy lanes carry on by themselves. An operation
    the lost bus broke left its lanes in between (restarting with the unit still running,
    a swap that stopped nothing or started nothing, a stop not done): a desired lane is
    followed again if its unit runs, started again if it does not (activated, stopping its
    peers, unless it held the GPUs itself); a lane not desired is stopped if its unit runs
    (unless a peer's activation stops it anyway, or it sleeps) and marked inactive if not. A failed lane
    stays failed until activated; a worker rank of a lane over several hosts (`workers`:
    laned.engines.headless) is its head's."""
    plans: dict[str, CatchUp] = {}
    for lane, now in lanes.items():
        plan = CatchUp.NOTHING
        if now.busy or lane in workers:
            pass
        elif now.desired is not Desired.ACTIVE:
            if now.running and now.state is LaneState.SLEEPING:
                pass  # asleep, as laned left it
            elif now.running:
                plan = CatchUp.STOP
            elif now.state not in SETTLED_STATES:
                plan = CatchUp.SETTLE
        elif now.state is not LaneState.FAILED:
            if now.running:
                plan = CatchUp.ADOPT
            else:
                plan = CatchUp.RESTART if now.state in HOLDING_STATES else CatchUp.ACTIVATE
        plans[lane] = plan
    activating = {config.lanes[n].group for n, p in plans.items() if p is CatchUp.ACTIVATE}
    for lane, plan in plans.items():
        group = config.lanes[lane].group
        if plan is CatchUp.STOP and group is not None and group in activating:
            plans[lane] = CatchUp.NOTHING  # the activation of its group's lane stops it first
    return plans


# --- at start ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reconcile:
    """What a starting laned does: adopt what runs, start what should run."""

    adopt: tuple[str, ...]
    start: tuple[tuple[str, str], ...]  # (lane, reason)


def plan_reconcile(
    config: Config,
    running: Iterable[str],
    desired: Mapping[str, Desired],
    states: Mapping[str, LaneState],
    first: bool,
    *,
    workers: Collection[str],
) -> Reconcile:
    """Adopt the lanes that run (never restart a healthy one); start desired lanes that do
    not (a failed one stays failed until activated); on a first start, the default lane.
    A worker rank of a lane over several hosts (`workers`: laned.engines.headless) is never
    started here: its head's laned starts it when the head says the lane is desired
    (docs/multinode.md)."""
    adopt = tuple(sorted(running))
    start = [
        (lane, "restore the desired lane")
        for lane in sorted(config.lanes)
        if desired.get(lane) is Desired.ACTIVE
        and lane not in adopt
        and states.get(lane) is not LaneState.FAILED
        and lane not in workers
    ]
    default = config.daemon.default_lane
    if first and not adopt and default and default not in workers:
        start.append((default, "default lane"))
    return Reconcile(adopt, tuple(start))
