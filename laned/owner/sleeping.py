"""Lanes that sleep instead of stopping (docs/sleep.md): putting one to sleep for a swap, and
waking it for an activation (unless its config or its checkpoint changed while it slept:
then it starts cold), each confirmed (`sleep_engine`, `wake_engine`: the engine asked through
the seam, the verdict laned.core.gpu_memory's). A part of the owner
(laned.owner.supervisor), used by its requests' side (laned.owner.requests), which keeps the
operation around each: its gate, its check that it is still current, and the stop and cold
start when a sleep or a wake fails.
"""

from __future__ import annotations

import asyncio
import functools
import time

from laned.config.model import LaneConfig, gpu_indices
from laned.config.names import unit_name
from laned.core.gpu_memory import Asleep, confirm_sleep, memory_of
from laned.core.lanes import EventKind, Refused
from laned.core.machine import Ev
from laned.core.unit_state import UnitSnapshot
from laned.errors import LanedError
from laned.owner.checkpoints import Checkpoints
from laned.owner.reactions import Reactions
from laned.owner.records import Records
from laned.owner.seam import Engines, Gpus, Note, PageCache, Seam
from laned.owner.traffic import Traffic
from laned.preflight.facts import GIB
from laned.preflight.fit import sleep_level_for
from laned.preflight.rules import model_path
from laned.render import plan as render

# What a wake would serve of a checkpoint that changed on disk while the engine slept (read in
# vLLM 0.32): level 1 copies back the weights it put in pinned host RAM at the sleep
# (vllm/device_allocator/cumem.py `wake_up`), the old ones; level 2 reads the files again,
# but into the engine its start built (laned's `reload_weights`: vllm/model_executor/
# model_loader/reload/inplace.py loads in place, into the layers, names and shapes of the old
# config.json, its tokenizer and generation config kept), and the canary kept for the old
# weights would call the new ones wrong. A cold start reads everything again.
STALE_WAKE = {
    1: "a level-1 wake gives back the copy of the old weights it keeps in host RAM",
    2: "a level-2 wake would read the new weights into the engine the old files built "
    "(in place: its config, tokenizer and layers as they were)",
}


class Sleeping:
    """Sleep and wake, each confirmed; the transitions they make."""

    def __init__(
        self,
        records: Records,
        seam: Seam,
        traffic: Traffic,
        reactions: Reactions,
        checkpoints: Checkpoints,
    ) -> None:
        self.records, self.seam = records, seam
        self.traffic, self.reactions = traffic, reactions
        self.checkpoints = checkpoints

    async def put_to_sleep(self, lane: str, reason: str, force: bool) -> Refused | None:
        """Drain the lane's requests, put its engine to sleep, confirm it sleeps (then the
        lane is `sleeping`); Refused (the lane left `stopping`) when it cannot."""
        r = self.records
        spec, ledger = r.engine_spec(lane), r.ledger
        # No restart, no waiter any more, and no watcher: a sleeping engine makes no progress.
        r.fire(lane, Ev.STOP_ASKED, reason)
        level, why = await asyncio.to_thread(
            sleep_level_now, self.seam.pages, spec, r.statuses[lane].pinned
        )
        if why:
            ledger.note(lane, EventKind.SLEEP, f"sleeping at level 2, not 1: {why}")
        r.fire(lane, Ev.SLEEP, f"{reason}: to sleep (level {level})")
        drained = functools.partial(ledger.note, lane, EventKind.DRAIN)
        await self.traffic.drain_before_stop(lane, spec.drain_timeout, force, drained)
        note = functools.partial(ledger.note, lane)
        # Its cgroup as systemd has it now (a unit's ControlGroup comes with no signal).
        try:
            seen: UnitSnapshot | None = await self.seam.units.snapshot(unit_name(lane, spec))
        except LanedError:
            seen = None  # then no per-process confirmation: /is_sleeping still decides
        began = time.monotonic()
        slept = await sleep_engine(self.seam, lane, spec, seen, note, level)
        if isinstance(slept, Refused):
            return slept
        r.recorder.sleep_mode(lane, "sleep", time.monotonic() - began)
        asleep = f"{reason}: asleep (level {level})"
        ledger.slept(lane, asleep, slept.pids, self._digest(lane), level, slept.residual)
        return None

    def changed_since(self, lane: str) -> bool:
        """Whether the lane's rendered unit or wrapper changed (a reload) since it went to
        sleep: a wake would serve the old flags, so it is started cold instead."""
        return self.records.statuses[lane].slept_as != self._digest(lane)

    async def why_cold(self, lane: str) -> tuple[str, str] | None:
        """Why the sleeping lane starts cold instead of waking (what changed, and the event's
        words): its config changed (a reload), or its checkpoint changed on disk since its
        engine read it; None: it wakes."""
        if self.changed_since(lane):
            why = "its config changed while it slept: stopping it for a cold start with the new one"
            return "its config changed", why
        moved = await self.checkpoints.since(lane)
        if moved is None:
            return None
        level = (
            self.records.statuses[lane].slept_level or self.records.config.lanes[lane].sleep_level
        )
        return "its checkpoint changed", (
            f"{moved} changed on disk while it slept: {STALE_WAKE.get(level, STALE_WAKE[1])}; "
            "stopping it for a cold start, which reads the new files"
        )

    def _digest(self, lane: str) -> str:
        return render.lane_digest(self.records.config, lane, self.records.systemd_version)

    async def wake(self, lane: str, reason: str) -> Refused | None:
        """A new run of the lane, `starting` as a wake: the wake itself (level 2: the weights
        reloaded, the prefix cache reset), then the canary before any traffic. Refused when
        either fails; the caller stops the engine and starts it cold."""
        r = self.records
        spec = r.config.lanes[lane]
        level = r.statuses[lane].slept_level or spec.sleep_level
        r.fire(lane, Ev.WAKE, f"{reason}: waking (level {level})")
        refused = await wake_engine(self.seam.engines, spec, level)
        if refused is None:  # the weights came back as they were?
            refused = await self.reactions.canary(lane, "wake", r.statuses[lane].image_id)
        return refused


def sleep_level_now(pages: PageCache, spec: LaneConfig, pinned: bool = False) -> tuple[int, str]:
    """The level the lane sleeps at now (laned.preflight.fit.sleep_level_for): its own, or 2
    where host RAM cannot hold its weights at level 1 (`pinned`: its engine holds its pinned
    buffers from an earlier level-1 sleep); and why, when the level is not its own. Blocking
    (it reads the model directory): call it off the loop."""
    weights = pages.weights_gib(model_path(spec))
    available = pages.mem_available()
    gib = None if available is None else available / GIB
    return sleep_level_for(spec.sleep_level, weights, gib, pinned)


async def sleep_engine(
    seam: Seam, lane: str, spec: LaneConfig, seen: UnitSnapshot | None, note: Note, level: int
) -> Refused | Asleep:
    """Put the lane's engine to sleep at `level` (its requests drained first) and confirm it
    (laned.core.gpu_memory.confirm_sleep): the engine's own word where it has one (vLLM's
    /is_sleeping), and where NVML lists processes, less GPU memory held by the engine's
    processes (its unit's cgroup, as `seen`) than before; what stays is its residual, said
    in a note."""
    pids: set[int] = set()
    if seen is not None:
        pids = await seam.containers.engine_pids(lane, spec, seen.control_group)
    before = await _held_by(seam.gpus, spec, pids)
    try:
        asleep = await seam.engines.sleep(spec, level)
    except LanedError as exc:
        return Refused(f"sleep (level {level}): {exc.message}", exc.hint)
    # No second reading where the engine says it is awake: that is the verdict.
    after = None if asleep is False else await _held_by(seam.gpus, spec, pids)
    slept = confirm_sleep(level, asleep, pids, before, after)
    if isinstance(slept, Asleep) and slept.said:
        note(EventKind.SLEEP, slept.said)
    return slept


async def _held_by(gpus: Gpus, spec: LaneConfig, pids: set[int]) -> dict[int, int] | None:
    """What the processes `pids` hold on each of the lane's GPUs (by index); None where NVML
    is absent or cannot list processes."""
    if gpus.unread() is not None or not pids:
        return None
    return memory_of(await asyncio.to_thread(gpus.read, gpu_indices(spec)), pids)


async def wake_engine(engines: Engines, spec: LaneConfig, level: int) -> Refused | None:
    """Wake the engine asleep at `level` and confirm it: its own word that it is awake."""
    try:
        woke = await engines.wake(spec, level)
    except LanedError as exc:
        return Refused(f"wake: {exc.message}", exc.hint)
    return None if woke else Refused("wake: the engine still says it sleeps after the wake")
