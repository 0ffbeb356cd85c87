"""The owner's requests: activate, deactivate, restart. Each is an input of the lane machine
(laned.core.inputs), posted through the interpreter (laned.owner.interpreter); its caller
gets a future that the request's end answers (the lane's record, or why not).

What one lane's step cannot see is planned here, across lanes, before the input is posted:
the lanes an activation takes off (laned.core.placement: those that never run beside it,
and the cheapest set that leaves it room, and no other), the requests under way that it
wins over (posted `Superseded`), and what each of those lanes was desired as (put back if
preflight refuses). The rest — joining, superseding the lane's own request, its sequence —
is the step's. A part of the owner (laned.owner.supervisor).
"""

from __future__ import annotations

import asyncio
import time

from laned.core import inputs as i
from laned.core import policy
from laned.core.lanes import Desired, LaneStatus, Op
from laned.core.policy import Admit, OpKind, RestartKind
from laned.errors import Finding
from laned.owner.actions import Actions
from laned.owner.interpreter import Interpreter
from laned.owner.records import Records

REQUESTS = frozenset(kind.value for kind in OpKind)  # an operator's or laned's own requests


def _current(lane: str, op: Op | None) -> policy.Current | None:
    """The lane's request under way as policy sees it (a take-off or giving up is none)."""
    return None if op is None or op.kind not in REQUESTS else policy.Current(lane, OpKind(op.kind))


class Requests:
    """Activations, stops and restarts, planned across lanes and posted."""

    def __init__(self, records: Records, interpreter: Interpreter, actions: Actions) -> None:
        self.records, self.interpreter, self.actions = records, interpreter, actions

    def activate(
        self,
        lane: str,
        reason: str = "activate",
        force: bool = False,
        findings: list[Finding] | None = None,
        unattended: bool = False,
    ) -> asyncio.Future[LaneStatus]:
        """Make `lane` run, taking off the lanes it cannot run beside; the future resolves
        when it is ready.

        Preflight runs first, before anything is stopped: an error refuses the activation
        (unless `force`) and leaves the running lanes and the desired lanes as they were.
        `findings`: a preflight the caller ran just now (the API does), not run again.
        `unattended`: laned's own (at its start), whose refusal shows in the lane's state."""
        r, run = self.records, self.interpreter
        r.spec(lane)
        status = r.statuses[lane]
        admit = policy.admit_activate(lane, _current(lane, status.op), status.state, status.desired)
        if admit is Admit.WAIT_READY:
            return run.wait_ready(lane)  # idempotent: nothing is restarted
        epoch = run.epoch()
        future = run.caller(epoch)
        if admit is Admit.JOIN:  # the step joins the activation on its way
            run.post(lane, i.Activate(epoch, reason, force))
            return future
        off = set(r.evictions(lane).lanes)
        resting = r.resting()  # sleepers that stay asleep unless they are in the way
        why = f"superseded by activate {lane}"
        for name, other in list(r.statuses.items()):
            # The newest request wins: over the activations of the lanes it takes off, and
            # over an activation that would take it off (that lane goes: it was on its way
            # only). Its own lane's request is the step's to replace.
            op = other.op
            if name == lane or op is None or op.kind not in REQUESTS:
                continue
            taking = op.kind != OpKind.DEACTIVATE.value and name in off
            if taking or lane in op.evicts:
                if lane in op.evicts:
                    off.add(name)
                run.post(name, i.Superseded(why))
        peers = sorted(off)
        statuses = r.statuses
        before = {n: statuses[n].desired for n in (lane, *peers)}
        for peer in peers:
            run.post(peer, i.Desire(Desired.INACTIVE))
        holding = [p for p in peers if statuses[p].state in policy.HOLDING_STATES]
        activate = i.Activate(
            epoch,
            reason,
            force,
            unattended,
            None if findings is None else tuple(findings),
            evicts=tuple(peers),
            stops_asleep=tuple(p for p in peers if p in resting),
            from_lane=holding[0] if holding else "none",
            desired_before=before,
            started=time.monotonic(),
        )
        run.post(lane, activate)
        return future

    def deactivate(self, lane: str, force: bool = False) -> asyncio.Future[LaneStatus]:
        """Stop `lane`; a stop laned asked for is never counted as a failure. Requests in
        flight through laned's OpenAI endpoint end first (up to its drain_timeout) unless
        `force`."""
        self.records.spec(lane)
        run = self.interpreter
        epoch = run.epoch()
        future = run.caller(epoch)
        run.post(lane, i.Deactivate(epoch, "deactivate", force))
        return future

    def restart(
        self, lane: str, reason: str = "restart requested", force: bool = False
    ) -> asyncio.Future[LaneStatus]:
        """Stop and start `lane` again (it must be desired active, else it is activated);
        requests in flight through laned's OpenAI endpoint end first unless `force`."""
        self.records.spec(lane)
        if self.records.statuses[lane].desired is not Desired.ACTIVE:
            return self.activate(lane, force=force)
        run = self.interpreter
        run.post(lane, i.Restart(run.epoch(), reason, RestartKind.REQUESTED.value, force))
        return run.wait_ready(lane)

    def started_outside(self, lane: str) -> None:
        """An operator started the lane's unit: it runs, so it is desired, and the lanes it
        cannot run beside are not (they are not stopped: the start gate did not run)."""
        run = self.interpreter
        for peer in self.records.evictions(lane).lanes:
            run.post(peer, i.Desire(Desired.INACTIVE))
        run.post(lane, i.StartedOutside())

    async def preflight(self, lane: str) -> list[Finding]:
        """The lane's preflight findings as of now ([] without a host adapter)."""
        self.records.spec(lane)
        return await self.actions.preflight(lane)

    def spawn_activation(self, lane: str, reason: str) -> None:
        """An activation laned makes itself (the desired or default lane at start, a lane
        to bring back after an outage): nobody waits, a refusal shows in the lane's state."""
        self.activate(lane, reason, unattended=True)
