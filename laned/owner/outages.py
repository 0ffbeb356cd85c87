"""What laned does while something it depends on is away, and when it is back: the user bus
or the user manager (re-executed, out of reach, killed and started again), journald, the
state file. Each trouble is a notice (/healthz, GET /lanes, `laned status`, the status
page) until it is over; the lanes are caught up with the last request once systemd is seen
again. The owner's; `Reactions` extends it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from laned.core import exits, resume
from laned.core.exits import ExitFacts
from laned.core.lanes import EventKind, LaneState, LaneStatus
from laned.core.phases import Seen
from laned.core.resume import CatchUp
from laned.core.unit_state import UnitSnapshot
from laned.errors import JournalUnavailable
from laned.owner import watchers
from laned.owner.runs import LaneRun

if TYPE_CHECKING:
    from laned.config.model import Config
    from laned.owner.ledger import Ledger
    from laned.owner.operations import Operations

log = logging.getLogger("laned.supervisor")
JOURNAL_RETRY = 30.0  # seconds between two tries to follow the lanes' logs without journald


class Outages:
    """Notices of what is away; catching the lanes up when systemd is back."""

    config: Config
    ledger: Ledger
    ops: Operations
    units: dict[str, str]  # unit -> lane
    snapshots: dict[str, UnitSnapshot]
    notices: dict[str, str]  # what laned itself meets, by source (/healthz)
    runs: dict[str, LaneRun]  # one record per lane (laned.owner.runs)
    _closing: bool

    if TYPE_CHECKING:

        @property
        def statuses(self) -> dict[str, LaneStatus]: ...

        def _apply(self, lane: str, snap: UnitSnapshot) -> None: ...

        def _on_exit(
            self, lane: str, snap: UnitSnapshot, facts: ExitFacts | None = None
        ) -> None: ...

        def _begin_start(self, lane: str) -> None: ...

        def _start_follow(self, lane: str) -> None: ...

        def _restart_after_failure(self, lane: str) -> None: ...

        def deactivate(self, lane: str, force: bool = False) -> asyncio.Future[LaneStatus]: ...

        def _spawn_activation(self, lane: str, reason: str) -> None: ...

        def _phase_seen(self, unit: str, seen: Seen, at: float) -> None: ...

    # --- the user manager ----------------------------------------------------------------------

    def _bus_trouble(self, why: str | None) -> None:
        """The bus keeper's trouble (None: connected again)."""
        if why is None:
            self.notices.pop("user manager", None)
        else:
            self.notices["user manager"] = why

    def _on_resync(self, why: str, snaps: dict[str, UnitSnapshot], replaced: bool) -> None:
        """Every lane unit as systemd has it after a reconnect or a re-exec (`why`). Under a
        new manager (`replaced`) a run laned saw is gone with the one before: a failure,
        restarted as any other, never taken for an operator's stop."""
        if self._closing:
            return
        for unit, snap in snaps.items():
            lane = self.units.get(unit)
            if lane is None:
                continue
            previous = self.snapshots.get(lane, UnitSnapshot(unit))
            status = self.statuses[lane]
            if previous.running or snap.running or status.state is not LaneState.INACTIVE:
                where = f"{unit} is {snap.active_state} ({snap.sub_state})"
                self.ledger.note(lane, EventKind.MANAGER, f"{why}: {where}")
            if replaced and previous.running and not snap.running:
                self.snapshots[lane] = snap
                self._on_exit(lane, snap, exits.LOST_WITH_MANAGER)
            else:
                self._apply(lane, snap)
        self._catch_up(why)

    def _catch_up(self, why: str) -> None:
        """Each lane made to match the last request again (resume.plan_catch_up)."""
        lanes = {}
        for lane, status in self.statuses.items():
            watch = self.runs[lane].follow
            busy = (
                self.ops.of(self.config.lanes[lane].group) is not None
                or self.runs[lane].restart is not None
                or (watch is not None and not watch.done())
            )
            running = self.snapshots.get(lane, UnitSnapshot("")).running
            lanes[lane] = resume.LaneNow(status.state, status.desired, running, busy)
        for lane, plan in resume.plan_catch_up(self.config, lanes).items():
            if plan is CatchUp.ADOPT:
                self._begin_start(lane)
                self.ledger.transition(lane, LaneState.STARTING, f"adopted again after {why}")
                self._start_follow(lane)
            elif plan is CatchUp.RESTART:
                self.ledger.transition(lane, LaneState.RESTARTING, f"started again after {why}")
                self.runs[lane].restart = asyncio.get_running_loop().call_later(
                    0, self._restart_after_failure, lane
                )
            elif plan is CatchUp.ACTIVATE:
                self._spawn_activation(lane, f"activated again after {why}")
            elif plan is CatchUp.STOP:
                log.info("%s: stopped again after %s (not desired, and its unit runs)", lane, why)
                self.deactivate(lane)
            elif plan is CatchUp.SETTLE:
                self.ledger.transition(lane, LaneState.INACTIVE, f"found stopped after {why}")

    # --- journald ------------------------------------------------------------------------------

    def _journal_back(self) -> None:
        self.notices.pop("journald", None)

    async def _follow_logs(self) -> None:
        """Startup phases of starting lanes, from their engines' log lines (one journalctl).
        Without journald laned runs on (readiness is probed) and says so, and tries again
        every JOURNAL_RETRY seconds from where it stopped."""
        since = None
        while not self._closing:
            try:
                await watchers.follow_phases(
                    lambda: self.units, self._phase_seen, since, self._journal_back
                )
                return  # no lane to follow
            except JournalUnavailable as exc:
                if "journald" not in self.notices:
                    log.warning("cannot follow the lanes' logs: %s", exc.message)
                self.notices["journald"] = (
                    f"cannot follow the lanes' logs: {exc.message}; startup phases are not "
                    f"shown and readiness is found by probing alone ({exc.hint})"
                )
            since = time.time()  # the next try reads the lines logged from this failure on
            await asyncio.sleep(JOURNAL_RETRY)

    # --- the state file ------------------------------------------------------------------------

    def _state_trouble(self, why: str | None) -> None:
        """The state writer's trouble (None: over), shown in /healthz until it is over."""
        if why is None:
            self.notices.pop("state.json", None)
        else:
            self.notices["state.json"] = why
