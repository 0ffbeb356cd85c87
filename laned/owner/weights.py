"""The owner's part for the lanes that keep their weights in vLLM's weight-cache daemon
(`[lanes.X] weight_cache`, docs/weight-cache.md): the daemon comes up before the engine
and is ready first, stays up while the engine restarts, restarts itself only when what it
loads changed, goes with the lane (a stop, a swap, giving up), and its death is the lane's
failure (both restart; the crash loop counts the run once). A daemon whose checkpoint
changed on disk since it read it restarts before the engine maps its weights
(laned.owner.checkpoints). On a lane over several hosts, a daemon whose peers' daemons are
not ready restarts too before the engine maps: the hosts' daemons form one group, once
(docs/multinode.md).

A part of the owner (laned.owner.supervisor): it acts through the seam for the actions of a
lane's sequence (laned.owner.actions), and what its daemon's unit shows reaches the lane as
inputs of the lane machine (its death: WeightsDied, judged by the step).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable

from laned import engines
from laned.config.model import LaneConfig, gpu_indices
from laned.config.names import weights_unit_name
from laned.core import inputs as i
from laned.core.lanes import START_COLD, START_WEIGHT_CACHE, EventKind, Refused
from laned.core.unit_state import ActiveState, UnitSnapshot
from laned.engines.footprints import held_of
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


Post = Callable[[str, i.Input], object]


class Weights:
    """Each weight-cache lane's daemon, kept beside its engine: its unit as last seen, and
    what the actions of a lane's sequence ask of it (laned.owner.actions)."""

    def __init__(
        self, records: Records, units: Units, caches: WeightCaches, checkpoints: Checkpoints
    ) -> None:
        self.records, self.units, self.caches = records, units, caches
        self.checkpoints = checkpoints
        self.post: Post = lambda lane, event: None  # the interpreter's, bound by the supervisor
        self.stopping: set[str] = set()  # lanes whose daemon laned is stopping right now
        # A lane over several hosts: why this host's daemon must start again with the other
        # hosts' (their group is gone), bound by the coordinator (Coordinator.daemons_apart).
        self.apart: Callable[[str], Awaitable[str | None]] | None = None

    def kept(self, lane: str) -> bool:
        """Whether the lane keeps its weights in a daemon (as configured now)."""
        return self.records.config.lanes[lane].weight_cache is not None

    def _spec(self, lane: str) -> LaneConfig:
        return self.records.config.lanes[lane]

    def _unit(self, lane: str) -> UnitSnapshot | None:
        """The daemon's unit as laned last saw it (the lane's record keeps it)."""
        status = self.records.statuses.get(lane)
        return None if status is None else status.weights_unit

    def running(self, lane: str) -> bool:
        """The daemon runs, as laned last saw its unit."""
        snap = self._unit(lane)
        return snap is not None and snap.running

    # --- before the engine starts ----------------------------------------------------------

    async def stale(self, lane: str) -> str | None:
        """Why the running daemon must go before the engine starts — its wrapper's digest
        differs from the one the running daemon wrote (what it loads changed), or a file of
        the checkpoint it read changed on disk — or None: it serves the engine as it is."""
        if not self.kept(lane) or not self.running(lane):
            return None
        path = weights_digest_path(self.records.config, lane)
        running = await asyncio.to_thread(self.caches.digest, path)
        if running != self.records.weights_digests.get(lane):
            return "what the weight cache loads changed: its daemon restarts"
        if self._spec(lane).nodes and self.apart is not None:
            why = await self.apart(lane)  # the other hosts' daemons (laned.owner.coordinator)
            if why is not None:
                return why
        moved = await self.checkpoints.since(lane)
        if moved is None:
            return None
        # vLLM's own fingerprint (protocol.py hash_checkpoint) hashes the safetensors headers
        # alone: a fine-tune copied over the same files would be mapped as the old weights.
        return (
            f"{moved} changed on disk since the weight-cache daemon read it: its daemon "
            "restarts and reads it again before the engine maps it"
        )

    async def exempt(self, lane: str) -> frozenset[int]:
        """The daemon's processes, whose GPU memory the engine's start gate leaves to them
        (its unit read whole: a change signal need not carry its cgroup)."""
        if not self.kept(lane) or not self.running(lane):
            return frozenset()
        snap = await self.units.snapshot(weights_unit_name(lane, self._spec(lane)))
        pids = await self.caches.pids(lane, self._spec(lane), snap.control_group)
        return frozenset(pids)

    async def up(self, lane: str) -> tuple[str, Refused | None]:
        """The daemon serves before the engine starts: started unless it runs (its start
        job ends when it is ready). The start's kind: a restart from the weight cache where
        it already held the weights, else a cold one (the daemon reads them from disk now);
        "" for a lane without one."""
        if not self.kept(lane):
            return "", None
        snap = self._unit(lane)
        if snap is not None and snap.active_state == ActiveState.ACTIVE.value:
            return START_WEIGHT_CACHE, None
        # Not running, or still loading (its start job is joined: the engine waits for it).
        note = functools.partial(self.records.book.note, lane, EventKind.WEIGHTS)
        note("the weight-cache daemon starts (weights from disk)")
        await self.checkpoints.record(lane)  # what it reads now, for the engine's next start
        refused = await self.caches.start(lane, self._spec(lane))
        if refused is None:
            note("the weight-cache daemon holds the weights")
        return START_COLD, refused

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
            note = functools.partial(self.records.book.note, lane)
            return await self.caches.stop(lane, self._spec(lane), note)
        finally:
            self.stopping.discard(lane)

    async def down_said(self, lane: str) -> None:
        """`down`, where nothing waits on it: a stop that fails is said in the lane's events."""
        refused = await self.down(lane)
        if refused is not None:
            self.records.book.note(lane, EventKind.WEIGHTS, refused.reason)

    def changed(self, unit: str, props: dict[str, object]) -> None:
        """A PropertiesChanged of a daemon's unit: shown, and its death while the lane is
        wanted is the lane's failure."""
        r = self.records
        lane = r.weights_units.get(unit)
        if lane is None or r.closing or lane not in r.statuses:
            return
        previous = self._unit(lane) or UnitSnapshot(unit)
        snap = previous.update(props)
        shown = SHOWN.get(snap.active_state, snap.active_state)
        self.post(lane, i.WeightsSeen(shown, unit=snap))
        if shown == "ready" and previous.active_state != snap.active_state:
            r.spawn(self._held(lane))
        if previous.running and not snap.running and lane not in self.stopping:
            reason = (
                f"its weight-cache daemon exited ({snap.result}, status {snap.exec_main_status})"
            )
            self.post(lane, i.WeightsDied(reason))

    async def _held(self, lane: str) -> None:
        """What the ready daemon's ranks hold, by their own word (get_memory)."""
        spec = self.records.config.lanes.get(lane)
        cache = engines.for_lane(spec).weight_cache if spec is not None else None
        if cache is None:
            return
        path = weights_digest_path(self.records.config, lane)
        said = await self.caches.held(path, cache)
        if said is None or spec is None:
            return
        held, dropped = held_of(said, self.records.gpu_totals, gpu_indices(spec))
        for reason in dropped:  # never shown as held: said once, in the lane's events
            self.records.book.note(
                lane, EventKind.WEIGHTS, f"weight-cache reading dropped: {reason}"
            )
        if lane in self.records.statuses and self.records.statuses[lane].weights == "ready":
            self.post(lane, i.WeightsSeen("ready", held))

    def seen(self, lane: str, snap: UnitSnapshot) -> None:
        """The daemon's unit as read (at start, after a resync)."""
        shown = SHOWN.get(snap.active_state, snap.active_state)
        self.post(lane, i.WeightsSeen(shown, unit=snap))
        if shown == "ready":
            self.records.spawn(self._held(lane))
