"""What degrades a lane that still serves, without a restart: acceptance checks that fail
(word salad, a broken tool parser: a restart would not fix them) and, for a lane over
several hosts, a peer rank that cannot be reached (restarting this rank would not bring
the peer back). The owner's; `Reactions` extends it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from laned.adapters import state
from laned.config.model import GATES, Config, LaneConfig
from laned.core.lanes import EventKind, LaneState, LaneStatus
from laned.errors import LanedError, LaneNotRunning
from laned.gates.acceptance import GateResult, merge_run
from laned.owner import steps
from laned.owner.runs import LaneRun
from laned.render import plan as render

if TYPE_CHECKING:
    from laned.owner.ledger import Ledger

log = logging.getLogger("laned.supervisor")


class Serving:
    """Acceptance checks and peer trouble: degraded, left serving, watched."""

    config: Config
    ledger: Ledger
    systemd_version: int
    clock: Callable[[], float]
    runs: dict[str, LaneRun]  # one record per lane (laned.owner.runs)

    if TYPE_CHECKING:

        @property
        def statuses(self) -> dict[str, LaneStatus]: ...

        def spec(self, lane: str) -> LaneConfig: ...

        def _serving(self, lane: str) -> bool: ...

        def _spawn(self, coro: Coroutine[object, object, None]) -> asyncio.Task[None]: ...

    def peer_trouble(self, lane: str, reason: str | None) -> None:
        """A lane over several hosts: a peer rank out of reach (`reason`), or every one back
        (None). Degraded and left serving, never restarted for it."""
        status = self.statuses.get(lane)
        if status is None:
            return
        if reason is not None and status.state is LaneState.READY:
            self.runs[lane].check_degraded = True
            self.ledger.transition(lane, LaneState.DEGRADED, reason)
        elif (
            reason is None
            and self.runs[lane].check_degraded
            and status.state is LaneState.DEGRADED
            and status.reason.startswith("peer ")
        ):
            self.runs[lane].check_degraded = False
            self.ledger.transition(lane, LaneState.READY, "every peer rank answers again")

    async def check(self, lane: str, gates: Sequence[str] = GATES) -> dict[str, Any]:
        """Run acceptance gates against the lane; keep, show and export the results.

        LaneNotRunning at once when the lane is not serving, and when it stopped (a swap, a
        restart) while the gates ran: a gate cut short by a stop says nothing of the engine."""
        spec, status = self.spec(lane), self.statuses[lane]
        if status.state not in (LaneState.READY, LaneState.DEGRADED):
            raise LaneNotRunning(
                f"lane {lane} is {status.state.value}, not serving: no gate can run",
                f"activate it first: laned activate {lane} --wait",
            )
        run = self.runs[lane].number

        def still_serving() -> bool:
            return self.runs[lane].number == run and self._serving(lane)

        def on_result(result: GateResult) -> None:
            if still_serving():
                verdict = "passed" if result.passed else f"failed: {result.reason}"
                self.ledger.note(lane, EventKind.CHECK, f"{result.gate} {verdict}")

        results = await steps.run_checks(spec, gates, status.last_cold_start, on_result)
        if not still_serving():
            raise LaneNotRunning(
                f"lane {lane} stopped serving while its gates ran ({status.state.value}): "
                "the results are not kept",
                f"run them again once it is ready: laned check {lane}",
            )
        return self._record_checks(lane, results)

    def _record_checks(self, lane: str, results: Sequence[GateResult]) -> dict[str, Any]:
        status = self.statuses[lane]
        digest = render.lane_digest(self.config, lane, self.systemd_version)
        run = merge_run(lane, status.checks, digest, results, self.clock())
        status.checks = run
        try:
            state.save_checks(self.config.daemon.state_dir, lane, run)
        except LanedError as exc:
            log.error("cannot save the check results of %s: %s", lane, exc)
        failed = [r for r in results if not r.passed]
        if failed and status.state is LaneState.READY:
            # It serves, but not as it should (word salad, a broken tool parser...): a
            # restart would not fix that, so the lane is degraded and left running.
            self.runs[lane].check_degraded = True
            reason = f"check {failed[0].gate}: {failed[0].reason}"
            self.ledger.transition(lane, LaneState.DEGRADED, reason)
        elif not failed and self.runs[lane].check_degraded and status.state is LaneState.DEGRADED:
            self.runs[lane].check_degraded = False
            self.ledger.transition(lane, LaneState.READY, "the acceptance checks pass again")
        return run

    async def _auto_check(self, lane: str) -> None:
        try:
            await self.check(lane, self.config.lanes[lane].checks.after_activate)
        except LanedError as exc:
            self.ledger.note(
                lane, EventKind.CHECK, f"checks after activation did not run: {exc.message}"
            )
