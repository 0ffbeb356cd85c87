"""GPU memory readings judged: the start gate's verdict and a sleep's confirmation.

The GPU-memory gate exists because the next lane's engine must not start while the last
one's memory is still held: a stopped container can take seconds to release it (llama-swap
#97, vLLM #42017), and an engine that starts on a half-free GPU fails twenty minutes in.
`held` says whether the lane may start yet, after each reading; `gate_verdict` what the gate
says when its wait is over. A sleep is confirmed by the engine's own word and, where NVML
lists processes, by its processes holding less than before (`confirm_sleep`).

Pure: readings in (laned.core.facts.GpuReading, read by the GPU adapter), verdicts out;
the owner reads the GPUs through its seam and runs the wait (laned.owner.gate). Imports only
what the readings are, so a bench runs it beside NVML without laned's other dependencies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from laned.core.facts import GIB, GpuReading
from laned.core.lanes import Refused


def held(
    readings: Sequence[GpuReading],
    max_used_bytes: float,
    sleepers: Collection[int] = (),
    staying: Mapping[int, str] = {},
    room: Mapping[int, int] = {},
) -> list[str]:
    """The GPUs the lane may not start on yet, described; [] when the gate may open.

    On each GPU, the memory of processes other than `sleepers` (laned's sleeping lanes,
    whose residual memory stays) and `staying` (pid -> lane: the lanes that run on beside
    this one) must be down to `max_used_bytes`: the lanes taken off have let go. Where
    `room` names a GPU, its free memory must also cover what the lane takes there (its
    footprint, laned.core.placement), counting what the staying lanes hold."""
    out = []
    for gpu in readings:
        mine = [(pid, used) for pid, used in gpu.processes or () if pid in staying]
        others = [
            (pid, used)
            for pid, used in gpu.processes or ()
            if pid not in sleepers and pid not in staying
        ]
        if gpu.processes:
            used = sum(u for _, u in others)
        else:  # NVML lists no process: the device's count, unless lanes stay on it
            used = 0 if room.get(gpu.index) and staying else gpu.compute_bytes
        if used > max_used_bytes:
            who = (" by pid " + ", ".join(str(pid) for pid, _ in others)) if others else ""
            out.append(f"GPU {gpu.index} has {used / GIB:.2f} GiB in use{who}")
            continue
        need = room.get(gpu.index)
        free = gpu.total_bytes - gpu.used_bytes
        if need and free < need:
            holders = ", ".join(
                f"lane {staying[pid]} {used / GIB:.1f} GiB (pid {pid})" for pid, used in mine
            )
            out.append(
                f"GPU {gpu.index} has {free / GIB:.1f} GiB free, the lane takes {need / GIB:.1f} GiB"
                + (f"; held by {holders}" if holders else "")
            )
    return out


@dataclass(frozen=True)
class GateResult:
    """How the gate ended: released (True) or timed out, after `waited` seconds and `polls` reads."""

    released: bool
    waited: float
    polls: int
    still_held: list[str]


def gate_verdict(result: GateResult, beside: Sequence[str] = ()) -> tuple[str, Refused | None]:
    """What the gate says when its wait is over (a note of the lane's), and why the lane may
    not start (None: released). `beside`: the lanes that stay on its GPUs."""
    if not result.released:
        return "GPU-memory gate timed out", Refused(
            f"gpu-gate: still held after {result.waited:.1f}s: " + "; ".join(result.still_held),
            "see `nvidia-smi` for what holds the GPU memory; `laned status --fit` "
            "shows where laned placed each lane",
        )
    said = f"GPU memory released after {result.waited:.3f}s ({result.polls} reading(s))"
    return said + (f", beside {', '.join(beside)}" if beside else ""), None


def memory_of(readings: Sequence[GpuReading], pids: Collection[int]) -> dict[int, int] | None:
    """Bytes the processes `pids` hold on each GPU read (by index); None where NVML cannot
    list a GPU's processes."""
    if any(gpu.processes is None for gpu in readings):
        return None
    return {
        gpu.index: sum(used for pid, used in gpu.processes or () if pid in pids) for gpu in readings
    }


@dataclass(frozen=True)
class Asleep:
    """A sleep confirmed: the engine's processes (for the GPU-memory gate), what they keep on
    each GPU by index (empty where NVML cannot list processes), and what the confirmation
    says of the memory released ("" where it could not be read)."""

    pids: frozenset[int]
    residual: dict[int, int]
    said: str = ""


def confirm_sleep(
    level: int,
    says_asleep: bool | None,
    pids: Collection[int],
    before: Mapping[int, int] | None,
    after: Mapping[int, int] | None,
    unreleased: str = "",
) -> Refused | Asleep:
    """Whether an engine put to sleep at `level` sleeps: its own word (`says_asleep`, None
    where it has none), then, where NVML read what its processes `pids` held `before` and
    `after` the sleep, less than before (what stays is its residual); `unreleased`: the hint
    where it released nothing (its engine's: the switch that gives the memory back)."""
    if says_asleep is False:
        return Refused(f"sleep (level {level}): the engine still says it is awake after the sleep")
    if before is None or after is None:
        return Asleep(frozenset(pids), {})
    held, kept = sum(before.values()), sum(after.values())
    if held > 0 and kept >= held:
        return Refused(
            f"sleep (level {level}): its processes still hold {kept / GIB:.2f} GiB of GPU "
            "memory, no less than before",
            unreleased,
        )
    said = (
        f"asleep: {(held - kept) / GIB:.2f} GiB of GPU memory released, {kept / GIB:.2f} GiB stay"
    )
    return Asleep(frozenset(pids), dict(after), said)
