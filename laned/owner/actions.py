"""The actions of a request's sequence, done on the host: one method each, answering with the
result input the lane machine reads next (laned.core.effects names them, laned.core.machine
orders them, laned.owner.interpreter runs them one after another).

An action reads and acts through the seam's protocols (laned.owner.seam), the start gate
(laned.owner.gate) and the owner's parts that hold their own state (the weight-cache daemons' units, the checkpoints on disk, the traffic it
drains); it decides nothing and changes no lane: what it found is its result, and the step
decides what follows. Notes it has to say on the way (a drain, the gate, prepare's output)
are published as it goes.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable

from laned.config.model import LaneConfig, gpu_indices
from laned.config.names import unit_name
from laned.core import effects as fx
from laned.core import inputs as i
from laned.core import placement, policy
from laned.core.facts import GIB, Sleepers, blocking
from laned.core.gpu_memory import Asleep, confirm_sleep, memory_of
from laned.core.lanes import Desired, EventKind, LaneState, Refused
from laned.core.unified import pool_available
from laned.core.unit_state import UnitSnapshot
from laned.engines import for_lane, headless
from laned.errors import Finding, LanedError
from laned.owner.checkpoints import Checkpoints
from laned.owner.gate import Beside, clear_for_start
from laned.owner.prefetching import Prefetches
from laned.owner.records import Records
from laned.owner.seam import Engines, Gpus, Note, PageCache, Ranks, Seam
from laned.owner.traffic import Traffic
from laned.owner.weights import Weights
from laned.preflight.fit import sleep_level_for
from laned.preflight.rules import evaluate, model_path, refusal
from laned.render import plan as render


def _refused(refused: Refused | None) -> i.Refused | None:
    return None if refused is None else i.Refused(refused.reason, refused.hint)


class Actions:
    """Each action of a sequence, on the host."""

    def __init__(
        self,
        records: Records,
        seam: Seam,
        traffic: Traffic,
        weights: Weights,
        checkpoints: Checkpoints,
        prefetches: Prefetches,
    ) -> None:
        self.records, self.seam, self.traffic = records, seam, traffic
        self.weights, self.checkpoints, self.prefetches = weights, checkpoints, prefetches
        # Bound by the supervisor: the take-off of a peer (the interpreter's), the canary.
        self.take_off: Callable[[str, int, str, i.TakeOff], asyncio.Future[i.Result]] | None = None
        self.epoch: Callable[[], int] = lambda: 0
        self.canary: Callable[[str, str, str | None], Awaitable[Refused | None]] | None = None
        self.ranks: Ranks | None = None  # the head's word with its workers (a sleep, a wake)
        self._do: dict[type[fx.Action], Callable[..., Awaitable[i.Result]]] = {
            fx.RunPreflight: self._run_preflight,
            fx.TakePeerOff: self._take_peer_off,
            fx.CheckSlept: self._check_slept,
            fx.CheckEnding: self._check_ending,
            fx.CheckWeights: self._check_weights,
            fx.Gate: self._gate,
            fx.StartWeights: self._start_weights,
            fx.StartUnit: self._start_unit,
            fx.Drain: self._drain,
            fx.StopUnit: self._stop_unit,
            fx.ConfirmContainerGone: self._confirm_container_gone,
            fx.StopWeights: self._stop_weights,
            fx.ChooseLevel: self._choose_level,
            fx.PutToSleep: self._put_to_sleep,
            fx.WakeUp: self._wake_up,
        }

    async def do(self, lane: str, action: fx.Action, epoch: int) -> i.Result:
        """Do `action` for the lane's request `epoch`; its result."""
        return await self._do[type(action)](lane, action, epoch)

    def _note(self, lane: str) -> Callable[[EventKind, str], None]:
        return functools.partial(self.records.book.note, lane)

    # --- an activation ------------------------------------------------------------------------

    async def _run_preflight(self, lane: str, action: fx.RunPreflight, epoch: int) -> i.Result:
        findings = await self.preflight(lane)
        errors = blocking(findings)
        said = None
        if errors:
            message, hint = refusal(lane, findings)
            said = i.Refused(message, hint)
        return i.Preflighted(epoch, tuple(findings), len(errors), said)

    async def preflight(self, lane: str) -> list[Finding]:
        """The lane's preflight findings as of now ([] without a host adapter)."""
        r = self.records
        status = r.book[lane]
        # A sleeping lane wakes: no new engine, no free-memory check beside the sleepers.
        asleep = status.state is LaneState.SLEEPING
        # The sleepers the activation stops for room keep nothing by the time it starts.
        off = r.evictions(lane).lanes
        sleepers = Sleepers() if asleep else Sleepers(r.sleepers(but=off), r.to_sleep(lane))
        peer = policy.port_peer(r.config, lane, r.book.states())
        facts = await self.seam.facts.lane_facts(r.config, lane, peer, status.image_id, sleepers)
        return [] if facts is None else evaluate(lane, r.config.lanes[lane], facts)

    async def _take_peer_off(self, lane: str, action: fx.TakePeerOff, epoch: int) -> i.Result:
        r = self.records
        peer = action.peer
        spec = r.config.lanes[peer]
        sleeps = bool(spec.sleep_level) and r.book[peer].serving
        event = i.TakeOff(
            self.epoch(), lane, epoch, action.reason, action.force, action.asleep_too, sleeps
        )
        assert self.take_off is not None
        return await self.take_off(lane, epoch, peer, event)

    async def _check_slept(self, lane: str, action: fx.CheckSlept, epoch: int) -> i.Result:
        r = self.records
        digest = render.lane_digest(r.config, lane, r.systemd_version)
        moved = await self.checkpoints.since(lane)
        return i.SleptAs(epoch, digest, None if moved is None else str(moved))

    async def _check_ending(self, lane: str, action: fx.CheckEnding, epoch: int) -> i.Result:
        r = self.records
        unit = unit_name(lane, r.engine_spec(lane))
        return i.Ending(epoch, await self.seam.units.still_ending(unit, r.statuses[lane].unit))

    # --- a start --------------------------------------------------------------------------------

    async def _check_weights(self, lane: str, action: fx.CheckWeights, epoch: int) -> i.Result:
        return i.WeightsStale(epoch, await self.weights.stale(lane))

    async def _gate(self, lane: str, action: fx.Gate, epoch: int) -> i.Result:
        r = self.records
        spec = r.config.lanes[lane]
        if action.waking:
            refused = await clear_for_start(
                self.seam,
                lane,
                spec,
                None,
                self._note(lane),
                r.recorder,
                waking=True,
                sleepers=r.sleepers(),  # its own residual included: it is its own
            )
            return i.Cleared(epoch, _refused(refused), waking=True)
        # The lane's own weight-cache daemon keeps its GPU memory through the gate, and so
        # do the lanes that run on beside it.
        exempt = await self.weights.exempt(lane)
        beside = await self._beside(lane)
        refused = await clear_for_start(
            self.seam,
            lane,
            spec,
            r.book[lane].image_id,
            self._note(lane),
            r.recorder,
            sleepers=r.sleepers() | exempt,
            beside=beside,
        )
        return i.Cleared(epoch, _refused(refused))

    async def _beside(self, lane: str) -> Beside:
        """The lanes that stay on the GPUs `lane` starts on (desired, sharing a GPU with it):
        their processes, and the room its footprint needs beside them."""
        r = self.records
        me = r.footprints[lane]
        staying: dict[int, str] = {}
        room: dict[int, int] = {}
        names: list[str] = []
        for other in r.placed(but=lane):
            shared = placement.common(me, r.footprints[other], r.gpu_totals)
            status = r.book[other]
            if status.desired is not Desired.ACTIVE or status.state is LaneState.FAILED:
                continue  # taken off (its memory must go, as the gate has always asked), or none
            if not shared:
                continue
            names.append(other)
            spec = r.engine_spec(other)
            snap = await self.seam.units.snapshot(unit_name(other, spec))
            pids = set(await self.weights.exempt(other))
            if snap.control_group:
                pids |= await self.seam.containers.engine_pids(other, spec, snap.control_group)
            staying.update(dict.fromkeys(pids, other))
            for gpu in shared:
                need = me.demand(gpu, r.gpu_totals)
                if need:
                    room[gpu] = need
        return Beside(staying, room, tuple(names))

    async def _start_weights(self, lane: str, action: fx.StartWeights, epoch: int) -> i.Result:
        kind, refused = await self.weights.up(lane)
        return i.WeightsUp(epoch, kind, _refused(refused))

    async def _start_unit(self, lane: str, action: fx.StartUnit, epoch: int) -> i.Result:
        r = self.records
        if not self.weights.kept(lane):
            await self.checkpoints.record(lane)  # what the engine reads now (a lane that sleeps)
        self.prefetches.at_start(lane)
        await self.seam.units.start(unit_name(lane, r.config.lanes[lane]))
        return i.UnitStarted(epoch)

    # --- a stop ---------------------------------------------------------------------------------

    async def _drain(self, lane: str, action: fx.Drain, epoch: int) -> i.Result:
        r = self.records
        note = functools.partial(r.book.note, lane, EventKind.DRAIN)
        timeout = r.engine_spec(lane).drain_timeout
        await self.traffic.drain_before_stop(lane, timeout, action.force, note)
        return i.Drained(epoch)

    async def _stop_unit(self, lane: str, action: fx.StopUnit, epoch: int) -> i.Result:
        unit = unit_name(lane, self.records.engine_spec(lane))
        # The one confirmed stop.
        return i.UnitStopped(epoch, _refused(await self.seam.units.stop(unit)))

    async def _confirm_container_gone(
        self, lane: str, action: fx.ConfirmContainerGone, epoch: int
    ) -> i.Result:
        spec = self.records.engine_spec(lane)
        refused = await self.seam.containers.container_gone(lane, spec, self._note(lane))
        return i.ContainerGone(epoch, _refused(refused))

    async def _stop_weights(self, lane: str, action: fx.StopWeights, epoch: int) -> i.Result:
        return i.WeightsDown(epoch, _refused(await self.weights.down(lane)))

    # --- sleep and wake (docs/sleep.md) -------------------------------------------------------

    async def _choose_level(self, lane: str, action: fx.ChooseLevel, epoch: int) -> i.Result:
        spec = self.records.engine_spec(lane)
        pinned = self.records.book[lane].pinned
        level, why = await asyncio.to_thread(
            sleep_level_now, self.seam.pages, spec, pinned, self.seam.gpus
        )
        return i.LevelChosen(epoch, level, why)

    async def _put_to_sleep(self, lane: str, action: fx.PutToSleep, epoch: int) -> i.Result:
        r = self.records
        spec = r.engine_spec(lane)
        # Its cgroup as systemd has it now (a unit's ControlGroup comes with no signal).
        try:
            seen = await self.seam.units.snapshot(unit_name(lane, spec))
        except LanedError:
            seen = None  # then no per-process confirmation: /is_sleeping still decides
        began = time.monotonic()
        ranks = self.ranks if self.ranks is not None and self.ranks.heads(lane) else None
        refused = await ranks.before_sleep(lane, action.level) if ranks is not None else None
        if refused is not None:
            return i.Slept(epoch, _refused(refused))
        slept = await sleep_engine(self.seam, lane, spec, seen, self._note(lane), action.level)
        if not isinstance(slept, Refused) and ranks is not None:
            slept = await ranks.after_sleep(lane, action.level) or slept
        if isinstance(slept, Refused):
            return i.Slept(epoch, _refused(slept))
        r.recorder.sleep_mode(lane, "sleep", time.monotonic() - began)
        digest = render.lane_digest(r.config, lane, r.systemd_version)
        return i.Slept(epoch, None, slept.pids, dict(slept.residual), digest)

    async def _wake_up(self, lane: str, action: fx.WakeUp, epoch: int) -> i.Result:
        r = self.records
        spec = r.config.lanes[lane]
        if headless(spec):  # no API here: its head's wake reaches this rank (Ranks)
            return i.Woken(epoch, None)
        refused = None
        if self.ranks is not None and self.ranks.heads(lane):
            refused = await self.ranks.before_wake(lane)
        if refused is None:
            refused = await wake_engine(self.seam.engines, spec, action.level)
        if refused is None and self.canary is not None:  # the weights came back as they were?
            refused = await self.canary(lane, "wake", r.book[lane].image_id)
        return i.Woken(epoch, _refused(refused))


async def rank_held(
    seam: Seam, lane: str, spec: LaneConfig
) -> tuple[set[int], dict[int, int] | None]:
    """This host's rank of a lane over several hosts: its engine's processes, and what they
    hold on each of its GPUs (None where that cannot be read)."""
    seen = await seam.units.snapshot(unit_name(lane, spec))
    pids = await seam.containers.engine_pids(lane, spec, seen.control_group)
    return pids, await _held_by(seam.gpus, spec, pids)


def sleep_level_now(
    pages: PageCache, spec: LaneConfig, pinned: bool = False, gpus: Gpus | None = None
) -> tuple[int, str]:
    """The level the lane sleeps at now (laned.preflight.fit.sleep_level_for, by its engine's
    rule): its own, or 2 where host RAM cannot hold its weights at level 1 or is the GPUs'
    own (unified memory, read through `gpus`) (`pinned`: its engine holds its pinned buffers
    from an earlier level-1 sleep); and why, when the level is not its own. Blocking (it
    reads the model directory and the GPUs): call it off the loop."""
    weights = pages.weights_gib(model_path(spec))
    available = pages.mem_available()
    gib = None if available is None else available / GIB
    unified = (
        gpus is not None
        and gpus.unread() is None
        and any(g.unified for g in gpus.read(gpu_indices(spec)))
    )
    return sleep_level_for(spec, weights, gib, pinned, unified)


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
    slept = confirm_sleep(level, asleep, pids, before, after, for_lane(spec).unreleased)
    if isinstance(slept, Asleep) and slept.said:
        pool = await _pool_of(seam.gpus, spec)
        note(EventKind.SLEEP, slept.said + (f" ({pool})" if pool else ""))
    return slept


async def _pool_of(gpus: Gpus, spec: LaneConfig) -> str:
    """On unified-memory GPUs, what a sleep's confirmation adds: where the memory went and
    what the pool has now ("" elsewhere)."""
    readings = await asyncio.to_thread(gpus.read, gpu_indices(spec))
    free = pool_available(readings)
    if free is None:
        return ""
    return (
        f"unified memory: released to the pool it shares with the host, "
        f"{free / GIB:.1f} GiB available there now"
    )


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
