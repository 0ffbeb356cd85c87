"""Can this host run a lane at all? The lane's `needs` against the host's GPUs, memory and
disks (pure: facts in, findings out), for `laned status --fit`, GET /fit and preflight."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

from laned import engines
from laned.config.model import LaneConfig, gpu_indices
from laned.core.facts import GIB, GpuReading, HostFacts, blocking, findings_json
from laned.core.placement import Footprint
from laned.engines import footprints
from laned.errors import Finding, Severity


def lane_gpus(spec: LaneConfig, host: HostFacts) -> list[GpuReading]:
    """The GPUs a lane uses (see gpu_indices)."""
    if host.gpus is None:
        return []
    indices = gpu_indices(spec)
    if indices is None:
        return list(host.gpus)
    return [g for g in host.gpus if g.index in indices]


def fit(
    lane: str, spec: LaneConfig, host: HostFacts, disk_total_gib: float | None = None
) -> list[Finding]:
    """Can this host run the lane at all? The lane's `needs` against what the host has."""
    needs, base = spec.needs, f"lanes.{lane}.needs"
    out: list[Finding] = []
    indices = gpu_indices(spec)
    wants_gpus = needs.gpus > 0 or needs.gpu_memory_gib > 0 or indices is not None
    if wants_gpus and host.gpus is None:
        # Not an error: NVML may be missing where the GPUs are not (laned in a container).
        memory = (
            f" with {needs.gpu_memory_gib:g} GiB of GPU memory in all"
            if needs.gpu_memory_gib
            else ""
        )
        count = f"{needs.gpus} GPU(s)" if needs.gpus else "its GPUs"
        out.append(
            Finding(
                "needs",
                f"{base}.gpus: the lane needs {count}{memory}; laned sees no GPU here "
                f"({host.gpu_note or 'no NVML'})",
                "run it on a host with the GPUs; if they are here, install the NVIDIA driver",
                severity=Severity.WARNING,
            )
        )
    elif host.gpus is not None:
        missing = sorted(set(indices or ()) - {g.index for g in host.gpus})
        if missing:
            out.append(
                Finding(
                    "needs",
                    f"lanes.{lane}.gpus: GPU {', '.join(map(str, missing))} does not exist "
                    f"(this host has {len(host.gpus)})",
                    "list indices as nvidia-smi shows them",
                    severity=Severity.ERROR,
                )
            )
        gpus = lane_gpus(spec, host)
        if len(gpus) < needs.gpus:
            out.append(
                Finding(
                    "needs",
                    f"{base}.gpus: the lane needs {needs.gpus} GPUs, this host has {len(gpus)}"
                    + (f" read ({host.gpu_note})" if host.gpu_note else ""),
                    "run it on a host with enough GPUs",
                    severity=Severity.ERROR,
                )
            )
        total = sum(g.total_bytes for g in gpus) / GIB
        if needs.gpu_memory_gib and total < needs.gpu_memory_gib:
            out.append(
                Finding(
                    "needs",
                    f"{base}.gpu_memory_gib: the lane needs {needs.gpu_memory_gib:g} GiB of GPU "
                    f"memory, its GPUs have {total:.1f} GiB",
                    "use bigger (or more) GPUs, or a smaller quant / context",
                    severity=Severity.ERROR,
                )
            )
    if needs.host_memory_gib and host.mem_total_gib is not None:
        if host.mem_total_gib < needs.host_memory_gib:
            out.append(
                Finding(
                    "needs",
                    f"{base}.host_memory_gib: the lane needs {needs.host_memory_gib:g} GiB of RAM, "
                    f"this host has {host.mem_total_gib:.1f} GiB",
                    "run it on a host with more memory",
                    severity=Severity.ERROR,
                )
            )
        elif host.mem_available_gib is not None and host.mem_available_gib < needs.host_memory_gib:
            out.append(
                Finding(
                    "needs",
                    f"{base}.host_memory_gib: {host.mem_available_gib:.1f} GiB of RAM is available "
                    f"now, the lane needs {needs.host_memory_gib:g} GiB",
                    "something else holds memory; the engine may be OOM-killed while loading",
                    severity=Severity.WARNING,
                )
            )
    if unified(spec, host) and not spec.probe.memory_floor_gib:
        out.append(
            Finding(
                "needs",
                f"lanes.{lane}.probe.memory_floor_gib: the lane's GPUs have unified memory, one "
                "pool with the host, and the lane has no memory floor: an engine that outgrows "
                "the pool takes the whole host down with it",
                f"set lanes.{lane}.probe.memory_floor_gib (say 4) and laned stops the lane "
                "before the pool runs out (docs/placement.md, Unified memory)",
                severity=Severity.WARNING,
            )
        )
    if needs.disk_gib and disk_total_gib is not None and disk_total_gib < needs.disk_gib:
        out.append(
            Finding(
                "needs",
                f"{base}.disk_gib: the lane needs {needs.disk_gib:g} GiB of disk, the model "
                f"directory's filesystem has {disk_total_gib:.1f} GiB",
                "put the model on a bigger disk",
                severity=Severity.ERROR,
            )
        )
    return out


def sleep_level_for(
    spec: LaneConfig,
    weights_gib: float | None,
    mem_available_gib: float | None,
    pinned: bool = False,
    unified: bool = False,
) -> tuple[int, str]:
    """The level the lane sleeps at now, and why when it is not its own, by its engine's
    rule (SleepApi.level_now: vLLM's level 1 pins the weights in host RAM, and with too
    little of it, or on `unified` memory GPUs where host RAM is the GPU's, sleeps at level
    2); `pinned`: its engine holds its pinned buffers from an earlier level-1 sleep."""
    sleep = engines.for_lane(spec).sleep
    if sleep is None:
        return spec.sleep_level, ""
    return sleep.level_now(spec.sleep_level, weights_gib, mem_available_gib, pinned, unified)


def unified(spec: LaneConfig, host: HostFacts) -> bool:
    """Whether the lane's GPUs share their memory with the host (laned.core.unified)."""
    return any(g.unified for g in lane_gpus(spec, host))


def sleep_fit(
    lane: str, spec: LaneConfig, host: HostFacts, weights_gib: float | None
) -> list[Finding]:
    """Preflight's word on a lane that sleeps: the level it would sleep at on this host now."""
    if not spec.sleep_level:
        return []
    level, why = sleep_level_for(
        spec, weights_gib, host.mem_available_gib, False, unified(spec, host)
    )
    where = f"lanes.{lane}.sleep_level"
    if host.gpus is None:
        platforms = "; ".join(p.sleep.platforms for p in engines.LISTED if p.sleep is not None)
        return [
            Finding(
                "sleep",
                f"{where} = {spec.sleep_level}: {engines.for_lane(spec).title}'s sleep releases "
                f"GPU memory ({platforms}) and laned sees no GPU here "
                f"({host.gpu_note or 'no NVML'})",
                "the engine refuses its sleep mode at start on a host without one; set sleep_level = 0",
                severity=Severity.WARNING,
            )
        ]
    if level != spec.sleep_level:
        return [
            Finding(
                "sleep",
                f"{where} = 1: it would sleep at level 2 now: {why}",
                "set sleep_level = 2 (or 0: stopped, where a weight cache keeps the weights)"
                if unified(spec, host)
                else "free host RAM, or set sleep_level = 2",
                severity=Severity.NOTE,
            )
        ]
    return []


def beside_sleepers(
    lane: str,
    spec: LaneConfig,
    readings: Sequence[GpuReading],
    sleepers: Collection[int],
    coming: Mapping[str, Mapping[int, int]] = {},
) -> list[Finding]:
    """Whether the lane's engine would start beside the memory laned's sleeping lanes keep
    on its GPUs, for an engine whose profile has a fixed share of each GPU (`gpu_share`):
    vLLM refuses to start unless free memory covers total × its --gpu-memory-utilization
    ("Free memory on device ... is less than desired GPU memory utilization",
    vllm/v1/worker/utils.py `request_memory`). `coming`: the peers this swap puts to sleep,
    with what each kept per GPU at its last sleep. An error that says by how much to lower
    that flag; nothing where no sleeper holds memory on its GPUs. SGLang's share is of what
    is free at its start and llama.cpp's is not read from its flags: neither is checked."""
    profile = engines.for_lane(spec)
    wanted, _ = profile.gpu_share(spec)
    if wanted is None:
        return []  # no fixed share, or one the engine's own parser refuses at start
    out = []
    for gpu in readings:
        soon = {peer: kept[gpu.index] for peer, kept in coming.items() if kept.get(gpu.index)}
        kept = sum(used for pid, used in gpu.processes or () if pid in sleepers)
        kept += sum(soon.values())
        free = gpu.total_bytes - kept
        if gpu.unified:  # the pool: what the host's other processes take is not free either
            free = min(free, gpu.total_bytes - gpu.used_bytes - sum(soon.values()))
        if not kept or free >= gpu.total_bytes * wanted:
            continue
        fits = int((free / gpu.total_bytes) * 100) / 100 - 0.01
        also = ", ".join(
            f"{peer}: {used / GIB:.1f} GiB at its last sleep" for peer, used in soon.items()
        )
        out.append(
            Finding(
                "sleepers",
                f"GPU {gpu.index}: laned's sleeping lanes keep {kept / GIB:.1f} GiB of it"
                + (f" (with the lanes this swap puts to sleep: {also})" if soon else "")
                + f"; {profile.title} starts only with {wanted:g} × {gpu.total_bytes / GIB:.0f} "
                f"GiB free ({profile.share_flag}) and would find {free / GIB:.1f} GiB",
                f"lower lanes.{lane}'s {profile.share_flag} to {fits:.2f} or less, or stop a "
                "sleeping lane (laned deactivate LANE)"
                + (f", or set lanes.{next(iter(soon))}.sleep_level = 0" if soon else ""),
            )
        )
    return out


def fit_report(
    lanes: dict[str, LaneConfig],
    host: HostFacts,
    weights: Mapping[str, float | None] = {},
    placed: Sequence[str] = (),
    asleep: Sequence[Footprint] = (),
) -> dict[str, Any]:
    """Which lanes this host can run at all, as served by /fit and printed by status --fit;
    for a lane that sleeps, the level it would sleep at (`weights`: its weight files, GiB);
    and placement: which lanes may run together, and each GPU with the lanes `placed` on it
    and the sleepers `asleep` there (laned.core.placement)."""
    rows = []
    for name in sorted(lanes):
        found = fit(name, lanes[name], host) + sleep_fit(name, lanes[name], host, weights.get(name))
        rows.append({"name": name, "fits": not blocking(found), "findings": findings_json(found)})
    totals = None if not host.gpus else {g.index: g.total_bytes for g in host.gpus}
    return {
        "host": host.to_json(),
        "lanes": rows,
        "placement": footprints.report(lanes, totals, placed, asleep),
    }
