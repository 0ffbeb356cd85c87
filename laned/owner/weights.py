"""The owner's part for the lanes that keep their weights in vLLM's weight-cache daemon
(`[lanes.X] weight_cache`, docs/weight-cache.md): the daemon comes up before the engine
and is ready first, stays up while the engine restarts, restarts itself only when what it
loads changed, goes with the lane (a stop, a swap, giving up), and its death is the lane's
failure (both restart; the crash loop counts the run once). A daemon whose checkpoint
changed on disk since it read it restarts before the engine maps its weights
(laned.owner.checkpoints).

A part of the owner (laned.owner.supervisor): it acts through the seam and moves the lane
through the lane machine's events (`Records.fire`), like the other parts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Protocol

from laned import engines
from laned.config.model import LaneConfig, gpu_indices
from laned.config.names import weights_unit_name
from laned.core.footprints import held_of
from laned.core.lanes import START_COLD, START_WEIGHT_CACHE, Desired, EventKind, LaneState, Refused
from laned.core.machine import Ev
from laned.core.policy import RestartKind
from laned.core.unit_state import ActiveState, UnitSnapshot
from laned.owner.checkpoints import Checkpoints
from laned.owner.records import Records
from laned.owner.seam import Units, WeightCaches
from laned.render.wrapper import weights_digest_path

log = logging.getLogger("laned.supervisor")

# The daemon's state as laned shows it, from its unit's (its start job ends at /health 200).
SHOWN = {
    ActiveState.ACTIVATING.value: "loading",
    ActiveState.ACTIVE.value: "ready",
    ActiveState.RELOADING.value: "ready",
    ActiveState.DEACTIVATING.value: "stopping",
    ActiveState.FAILED.value: "failed",
    ActiveState.INACTIVE.value: "stopped",
}


class Restarts(Protocol):
    """What the daemon's death asks of the requests' side (laned.owner.requests.Requests)."""

    def restart_lane(self, lane: str, reason: str, kind: RestartKind, force: bool = False) -> None:
        """Restart a desired lane as an operation of its group."""

    async def give_up(self, lane: str, run: int, reason: str) -> None:
        """Stop the lane and leave it failed until the next activate."""


class Weights:
    """Each weight-cache lane's daemon, kept beside its engine."""

    def __init__(
        self, records: Records, units: Units, caches: WeightCaches, checkpoints: Checkpoints
    ) -> None:
        self.records, self.units, self.caches = records, units, caches
        self.checkpoints = checkpoints
        self.restarts: Restarts | None = None
        self.snapshots: dict[str, UnitSnapshot] = {}  # lane -> its daemon's unit, last seen
        self.stopping: set[str] = set()  # lanes whose daemon laned is stopping

    def kept(self, lane: str) -> bool:
        """Whether the lane keeps its weights in a daemon (as configured now)."""
        return self.records.config.lanes[lane].weight_cache is not None

    def _spec(self, lane: str) -> LaneConfig:
        return self.records.config.lanes[lane]

    def running(self, lane: str) -> bool:
        """The daemon runs, as laned last saw its unit."""
        snap = self.snapshots.get(lane)
        return snap is not None and snap.running

    # --- before the engine starts ----------------------------------------------------------

    async def before_start(self, lane: str) -> Refused | None:
        """A new daemon where what it loads changed — its wrapper's digest differs from the
        one the running daemon wrote, or a file of the checkpoint it read changed on disk —
        stopped before the start gate (which then waits for its memory too); the engine then
        maps the weights of a daemon that read them now."""
        if not self.kept(lane) or not self.running(lane):
            return None
        path = weights_digest_path(self.records.config, lane)
        running = await asyncio.to_thread(self.caches.digest, path)
        if running != self.records.weights_digests.get(lane):
            self.records.ledger.note(
                lane, EventKind.WEIGHTS, "what the weight cache loads changed: its daemon restarts"
            )
            return await self.down(lane)
        moved = await self.checkpoints.since(lane)
        if moved is None:
            return None
        # vLLM's own fingerprint (protocol.py hash_checkpoint) hashes the safetensors headers
        # alone: a fine-tune copied over the same files would be mapped as the old weights.
        self.records.ledger.note(
            lane,
            EventKind.WEIGHTS,
            f"{moved} changed on disk since the weight-cache daemon read it: its daemon "
            "restarts and reads it again before the engine maps it",
        )
        return await self.down(lane)

    async def exempt(self, lane: str) -> frozenset[int]:
        """The daemon's processes, whose GPU memory the engine's start gate leaves to them
        (its unit read whole: a change signal need not carry its cgroup)."""
        if not self.kept(lane) or not self.running(lane):
            return frozenset()
        snap = await self.units.snapshot(weights_unit_name(lane, self._spec(lane)))
        pids = await self.caches.pids(lane, self._spec(lane), snap.control_group)
        return frozenset(pids)

    async def up(self, lane: str) -> Refused | None:
        """The daemon serves before the engine starts: started unless it runs (its start
        job ends when it is ready). The start is a restart from the weight cache where it
        already held the weights, else a cold one (the daemon reads them from disk now)."""
        if not self.kept(lane):
            return None
        ledger = self.records.ledger
        snap = self.snapshots.get(lane)
        if snap is not None and snap.active_state == ActiveState.ACTIVE.value:
            ledger.start_kind(lane, START_WEIGHT_CACHE)
            return None
        # Not running, or still loading (its start job is joined: the engine waits for it).
        ledger.start_kind(lane, START_COLD)
        ledger.note(lane, EventKind.WEIGHTS, "the weight-cache daemon starts (weights from disk)")
        await self.checkpoints.record(lane)  # what it reads now, for the engine's next start
        refused = await self.caches.start(lane, self._spec(lane))
        if refused is None:
            ledger.note(lane, EventKind.WEIGHTS, "the weight-cache daemon holds the weights")
        return refused

    # --- with the lane ---------------------------------------------------------------------

    async def down(self, lane: str) -> Refused | None:
        """Stop the daemon (the lane is stopped, swapped away or given up) and confirm it is
        gone: a stop of laned's, never a failure."""
        if lane not in self.records.config.lanes:
            return None
        if not self.kept(lane) and not self.running(lane):
            return None  # (a daemon left running by a reload that removed weight_cache goes)
        self.stopping.add(lane)
        try:
            note = functools.partial(self.records.ledger.note, lane)
            return await self.caches.stop(lane, self._spec(lane), note)
        finally:
            self.stopping.discard(lane)

    async def down_said(self, lane: str) -> None:
        """`down`, where nothing waits on it: a stop that fails is said in the lane's events."""
        refused = await self.down(lane)
        if refused is not None:
            self.records.ledger.note(lane, EventKind.WEIGHTS, refused.reason)

    def changed(self, unit: str, props: dict[str, object]) -> None:
        """A PropertiesChanged of a daemon's unit: shown, and its death while the lane is
        wanted is the lane's failure."""
        r = self.records
        lane = r.weights_units.get(unit)
        if lane is None or r.closing or lane not in r.statuses:
            return
        previous = self.snapshots.get(lane, UnitSnapshot(unit))
        snap = previous.update(props)
        self.snapshots[lane] = snap
        shown = SHOWN.get(snap.active_state, snap.active_state)
        r.ledger.weights_seen(lane, shown)
        if shown == "ready" and previous.active_state != snap.active_state:
            r.spawn(self._held(lane))
        if previous.running and not snap.running:
            self._ended(lane, snap)

    async def _held(self, lane: str) -> None:
        """What the ready daemon's ranks hold, by their own word (get_memory)."""
        spec = self.records.config.lanes.get(lane)
        cache = engines.for_lane(spec).weight_cache if spec is not None else None
        if cache is None:
            return
        path = weights_digest_path(self.records.config, lane)
        said = await self.caches.held(path, cache.socket_glob)
        if said is None or spec is None:
            return
        held, dropped = held_of(said, self.records.gpu_totals, gpu_indices(spec))
        ledger = self.records.ledger
        for reason in dropped:  # never shown as held: said once, in the lane's events
            ledger.note(lane, EventKind.WEIGHTS, f"weight-cache reading dropped: {reason}")
        if lane in self.records.statuses and self.records.statuses[lane].weights == "ready":
            ledger.weights_seen(lane, "ready", held)

    def seen(self, lane: str, snap: UnitSnapshot) -> None:
        """The daemon's unit as read (at start, after a resync)."""
        self.snapshots[lane] = snap
        shown = SHOWN.get(snap.active_state, snap.active_state)
        self.records.ledger.weights_seen(lane, shown)
        if shown == "ready":
            self.records.spawn(self._held(lane))

    def _ended(self, lane: str, snap: UnitSnapshot) -> None:
        r, status = self.records, self.records.statuses[lane]
        if lane in self.stopping or status.desired is not Desired.ACTIVE or status.stopping:
            return  # laned's own stop, or a lane nobody wants any more
        if status.state not in (LaneState.STARTING, LaneState.READY, LaneState.DEGRADED):
            return  # restarting or failing already: that restart brings it back
        reason = f"its weight-cache daemon exited ({snap.result}, status {snap.exec_main_status})"
        r.ledger.note(lane, EventKind.WEIGHTS, reason)
        r.fire(lane, Ev.UNHEALTHY, reason)
        counted = r.count_failure(lane, "weights", reason)
        assert self.restarts is not None
        if counted is not None and counted.crash_loop:
            r.spawn(self.restarts.give_up(lane, status.run, counted.reason))
            return
        # The engine goes too: a restart starts the daemon, then the engine (counted once).
        self.restarts.restart_lane(lane, reason, RestartKind.WEIGHTS)
