"""The start gate: what must hold before a lane's engine starts, in order — its secrets file
is the user's own file, `prepare` has run after an image change, the GPU memory of what went
is released with room for it beside what stays, its port is free — and, before a wake from
sleep, the GPU memory alone (the engine keeps its image and holds its own port).

A part of the owner (laned.owner.actions runs it as the gate of a lane's sequence): it reads the host
through the seam and asks the pure verdicts (laned.preflight.rules.not_held,
laned.core.gpu_memory, laned.preflight.fit.beside_sleepers); it changes no lane's state.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from laned.config.model import LaneConfig, gpu_indices
from laned.core.facts import GIB
from laned.core.gpu_memory import gate_verdict
from laned.core.lanes import EventKind, Refused
from laned.core.recorder import Recorder
from laned.errors import LanedError, PodmanError
from laned.owner.gpu_wait import wait_released
from laned.owner.seam import Containers, Facts, Gpus, Note, Seam
from laned.preflight.fit import beside_sleepers
from laned.preflight.rules import not_held

PORT_WAIT = 5.0  # seconds a stopped engine's listener is given to go


@dataclass(frozen=True)
class Beside:
    """The lanes that run on beside a lane that starts: their processes (pid -> lane), whose
    GPU memory the gate leaves to them, and the room (bytes, by GPU index) the starting
    lane's footprint needs there (laned.core.placement)."""

    staying: Mapping[int, str]
    room: Mapping[int, int]
    lanes: tuple[str, ...] = ()  # the staying lanes on its GPUs, by name


ALONE = Beside({}, {})


async def clear_for_start(
    seam: Seam,
    lane: str,
    spec: LaneConfig,
    last_image: str | None,
    note: Note,
    recorder: Recorder,
    waking: bool = False,
    sleepers: Collection[int] = (),
    beside: Beside = ALONE,
) -> Refused | None:
    """Before a start: the secrets file systemd will read is the user's own file, not a link
    (whatever `force` said to preflight), `prepare` after an image change, the GPU memory
    released (but the memory of `sleepers` and of the lanes staying `beside` it) with room
    for it, the port free. Why the lane cannot start, or None. Before a wake (`waking`): the
    GPU memory only."""
    if spec.secrets_path and not waking:
        key = await asyncio.to_thread(seam.facts.key_file, spec.secrets_path)
        found = not_held(lane, spec, key)
        if found is not None:
            return Refused(found.message, found.hint)
    if spec.container is not None and spec.prepare and not waking:
        refused = await _prepare(seam.containers, lane, spec, last_image, note)
        if refused is not None:
            return refused
    if spec.gpu_gate.enabled:
        refused = await _gpu_gate(seam.gpus, lane, spec, note, recorder, waking, sleepers, beside)
        if refused is not None:
            return refused
    return None if waking else await _port_free(seam.facts, spec.port)


async def _prepare(
    containers: Containers, lane: str, spec: LaneConfig, last_image: str | None, note: Note
) -> Refused | None:
    """The lane's `prepare` steps, where its image changed since its last good start."""
    try:
        image = await containers.image_id(spec)
    except PodmanError:
        image = None  # preflight already warned; podman itself will say at start
    if not (image and last_image and image != last_image):
        return None
    note(EventKind.PREPARE, "image changed: running prepare")
    try:
        await containers.prepare(lane, spec, lambda line: note(EventKind.PREPARE, line))
    except LanedError as exc:
        return Refused(f"prepare: {exc.message}", exc.hint)
    return None


async def _gpu_gate(
    gpus: Gpus,
    lane: str,
    spec: LaneConfig,
    note: Note,
    recorder: Recorder,
    waking: bool,
    sleepers: Collection[int],
    beside: Beside,
) -> Refused | None:
    """The GPU-memory gate: the lane's GPUs read until what went has let go (or the gate's
    timeout), then, for a start beside sleepers, whether its engine would start there."""
    why = gpus.unread()
    if why is not None:
        if why:  # no NVML here: the gate cannot wait, and says so
            note(EventKind.GATE, f"GPU-memory gate skipped: {why}")
        return None
    gate, indices = spec.gpu_gate, gpu_indices(spec)
    result = await wait_released(
        lambda: gpus.read(indices),
        gate.max_used_gib * GIB,
        gate.timeout,
        gate.interval,
        sleepers=sleepers,
        staying=beside.staying,
        room=beside.room,
    )
    recorder.gpu_gate(lane, result.released, result.waited)
    said, refused = gate_verdict(result, beside.lanes)
    note(EventKind.GATE, said)
    if refused is not None:
        return refused
    readings = [] if waking or not sleepers else await asyncio.to_thread(gpus.read, indices)
    sleeping = beside_sleepers(lane, spec, readings, sleepers)
    if sleeping:  # vLLM would refuse to start: say so now, with the flag to lower
        return Refused(f"gpu-gate: {sleeping[0].message}", sleeping[0].hint)
    return None


async def _port_free(facts: Facts, port: int) -> Refused | None:
    """The lane's port free once the lanes taken off stopped (their listeners gone)."""
    deadline = time.monotonic() + PORT_WAIT
    while await asyncio.to_thread(facts.port_busy, port):
        # A stopped engine's listener is gone at once; give a slow exit a moment.
        if time.monotonic() > deadline:
            return Refused(
                f"port {port} is still in use after the lanes taken off stopped",
                f"find it: ss -ltnp 'sport = :{port}'",
            )
        await asyncio.sleep(0.1)
    return None
