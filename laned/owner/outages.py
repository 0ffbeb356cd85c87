"""What laned does while something it depends on is away, and when it is back: the user bus
or the user manager (re-executed, out of reach, killed and started again), journald, the
state file. Each trouble is a notice (/healthz, GET /lanes, `laned status`, the status
page) until it is over (`Records.trouble`); the lanes are caught up with the last request
once systemd is seen again (inputs of the lane machine, posted through the interpreter). A
part of the owner (laned.owner.supervisor).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from laned import engines
from laned.core import exits, resume
from laned.core import inputs as i
from laned.core.lanes import EventKind, LaneState
from laned.core.phases import Seen
from laned.core.resume import CatchUp
from laned.core.unit_state import UnitSnapshot
from laned.errors import JournalUnavailable
from laned.owner import watchers
from laned.owner.interpreter import Interpreter
from laned.owner.reactions import Reactions
from laned.owner.records import Records
from laned.owner.requests import Requests
from laned.owner.seam import Journal

log = logging.getLogger("laned.supervisor")
JOURNAL_RETRY = 30.0  # seconds between two tries to follow the lanes' logs without journald


class Outages:
    """Notices of what is away; catching the lanes up when systemd is back."""

    def __init__(
        self,
        records: Records,
        journal: Journal,
        reactions: Reactions,
        requests: Requests,
        interpreter: Interpreter,
    ) -> None:
        self.records, self.journal = records, journal
        self.reactions, self.requests, self.interpreter = reactions, requests, interpreter

    # --- the user manager ----------------------------------------------------------------------

    def resynced(self, why: str, snaps: dict[str, UnitSnapshot], replaced: bool) -> None:
        """Every lane unit as systemd has it after a reconnect or a re-exec (`why`). Under a
        new manager (`replaced`) a run laned saw is gone with the one before: a failure,
        restarted as any other, never taken for an operator's stop."""
        r = self.records
        if r.closing:
            return
        for unit, snap in snaps.items():
            if unit in r.weights_units:  # a weight-cache daemon: shown as it is now
                self.reactions.weights.seen(r.weights_units[unit], snap)
                continue
            lane = r.units.get(unit)
            if lane is None:
                continue
            previous = r.statuses[lane].unit or UnitSnapshot(unit)
            status = r.statuses[lane]
            if previous.running or snap.running or status.state is not LaneState.INACTIVE:
                where = f"{unit} is {snap.active_state} ({snap.sub_state})"
                r.book.note(lane, EventKind.MANAGER, f"{why}: {where}")
            if replaced and previous.running and not snap.running:
                self.interpreter.post(lane, i.UnitSeen(snap))
                self.reactions.exited(lane, snap, exits.LOST_WITH_MANAGER)
            else:
                self.reactions.apply(lane, snap)
        self._catch_up(why)

    def _catch_up(self, why: str) -> None:
        """Each lane made to match the last request again (resume.plan_catch_up)."""
        r, run = self.records, self.interpreter
        lanes = {}
        for lane, status in r.statuses.items():
            busy = status.op is not None or run.restart_waiting(lane) or run.watching(lane)
            running = status.unit is not None and status.unit.running
            lanes[lane] = resume.LaneNow(status.state, status.desired, running, busy)
        for lane, plan in resume.plan_catch_up(
            r.config, lanes, workers=engines.workers(r.config.lanes)
        ).items():
            if plan is CatchUp.ADOPT:
                run.post(lane, i.Adopt(f"adopted again after {why}"))
            elif plan is CatchUp.RESTART:  # at once, as a restart after a failure
                run.post(lane, i.Lost(f"started again after {why}"))
            elif plan is CatchUp.ACTIVATE:
                self.requests.spawn_activation(lane, f"activated again after {why}")
            elif plan is CatchUp.STOP:
                log.info("%s: stopped again after %s (not desired, and its unit runs)", lane, why)
                self.requests.deactivate(lane)
            elif plan is CatchUp.SETTLE:
                run.post(lane, i.FoundStopped(f"found stopped after {why}"))

    def _reader(self, unit: str) -> Callable[[str], Seen | None]:
        """How the engine of `unit`'s lane writes its start, and its dying, in its log
        (laned.engines)."""
        r = self.records
        return engines.for_lane(r.config.lanes[r.all_units()[unit]]).read_log

    # --- journald ------------------------------------------------------------------------------

    async def follow_logs(self) -> None:
        """Startup phases of starting lanes, from their engines' log lines (one journalctl).
        Without journald laned runs on (readiness is probed) and says so, and tries again
        every JOURNAL_RETRY seconds from where it stopped."""
        r = self.records
        since = None
        while not r.closing:
            try:
                await watchers.follow_phases(
                    self.journal,
                    r.all_units,
                    self._reader,
                    self.reactions.phase_seen,
                    since,
                    lambda: r.trouble("journald", None),
                )
                return  # no lane to follow
            except JournalUnavailable as exc:
                if "journald" not in r.notices:
                    log.warning("cannot follow the lanes' logs: %s", exc.message)
                r.trouble(
                    "journald",
                    f"cannot follow the lanes' logs: {exc.message}; startup phases are not "
                    f"shown and readiness is found by probing alone ({exc.hint})",
                )
            since = time.time()  # the next try reads the lines logged from this failure on
            await asyncio.sleep(JOURNAL_RETRY)
