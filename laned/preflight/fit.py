"""Can this host run a lane at all? The lane's `needs` against the host's GPUs, memory and
disks (pure: facts in, findings out), for `laned status --fit`, GET /fit and preflight."""

from __future__ import annotations

from typing import Any

from laned.config.model import LaneConfig, gpu_indices
from laned.errors import Finding, Severity
from laned.preflight.facts import GIB, GpuReading, HostFacts, blocking, findings_json


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
                    f"{base}.gpus: the lane needs {needs.gpus} GPUs, this host has {len(gpus)}",
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


def fit_report(lanes: dict[str, LaneConfig], host: HostFacts) -> dict[str, Any]:
    """Which lanes this host can run at all, as served by /fit and printed by status --fit."""
    rows = []
    for name in sorted(lanes):
        found = fit(name, lanes[name], host)
        rows.append({"name": name, "fits": not blocking(found), "findings": findings_json(found)})
    return {"host": host.to_json(), "lanes": rows}
