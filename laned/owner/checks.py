"""Acceptance checks of a serving lane: kept, shown, exported; a lane that fails one is
degraded and left serving (word salad, a broken tool parser: a restart would not fix them).
A part of the owner (laned.owner.supervisor): what it finds reaches the lane as inputs of
the lane machine (Checking, Checked), posted through the interpreter.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from laned.config.model import GATES
from laned.core import inputs as i
from laned.core.lanes import EventKind, LaneState
from laned.errors import LanedError, LaneNotRunning
from laned.gates.acceptance import GateResult, merge_run
from laned.owner.records import Records
from laned.owner.seam import Engines, StateStore
from laned.render import plan as render

log = logging.getLogger("laned.supervisor")


class Checks:
    """The acceptance gates run against a serving lane, and what their results do to it."""

    def __init__(self, records: Records, engines: Engines, store: StateStore) -> None:
        self.records, self.engines, self.store = records, engines, store
        self.post: Callable[[str, i.Input], object] = lambda lane, event: None  # bound

    async def check(self, lane: str, gates: Sequence[str] = GATES) -> dict[str, Any]:
        """Run acceptance gates against the lane; keep, show and export the results.

        LaneNotRunning at once when the lane is not serving, and when it stopped (a swap, a
        restart) while the gates ran: a gate cut short by a stop says nothing of the engine."""
        r = self.records
        # The engine as it runs (its port, its model), the gates' demands as configured now.
        spec = r.engine_spec(lane).model_copy(update={"checks": r.spec(lane).checks})
        status = r.statuses[lane]
        if status.state not in (LaneState.READY, LaneState.DEGRADED):
            raise LaneNotRunning(
                f"lane {lane} is {status.state.value}, not serving: no gate can run",
                f"activate it first: laned activate {lane} --wait",
            )
        run = status.run

        def still_serving() -> bool:
            return lane in r.statuses and r.statuses[lane].run == run and r.serving(lane)

        def on_result(result: GateResult) -> None:
            if still_serving():
                verdict = "passed" if result.passed else f"failed: {result.reason}"
                r.book.note(lane, EventKind.CHECK, f"{result.gate} {verdict}")

        self.post(lane, i.Checking(+1))  # busy: the scheduler does not take it for idle meanwhile
        try:
            results = await self.engines.run_checks(spec, gates, status.last_cold_start, on_result)
        finally:
            self.post(lane, i.Checking(-1))
        if not still_serving():
            now = r.statuses[lane].state.value if lane in r.statuses else "removed"
            raise LaneNotRunning(
                f"lane {lane} stopped serving while its gates ran ({now}): "
                "the results are not kept",
                f"run them again once it is ready: laned check {lane}",
            )
        return self._record(lane, results)

    def _record(self, lane: str, results: Sequence[GateResult]) -> dict[str, Any]:
        r = self.records
        status = r.statuses[lane]
        digest = render.lane_digest(r.config, lane, r.systemd_version)
        run = merge_run(
            lane, None if status.checks is None else dict(status.checks), digest, results, r.clock()
        )
        try:
            self.store.save_checks(r.config.daemon.state_dir, lane, run)
        except LanedError as exc:
            log.error("cannot save the check results of %s: %s", lane, exc)
        failed = [result for result in results if not result.passed]
        # A failed one degrades a ready lane (the step's): it serves, but not as it should.
        said = f"{failed[0].gate}: {failed[0].reason}" if failed else None
        self.post(lane, i.Checked(status.run, run, said))
        return run

    async def after_activate(self, lane: str) -> None:
        """The lane's `checks.after_activate` gates, run once it is ready."""
        try:
            await self.check(lane, self.records.config.lanes[lane].checks.after_activate)
        except LanedError as exc:
            self.records.book.note(
                lane, EventKind.CHECK, f"checks after activation did not run: {exc.message}"
            )
