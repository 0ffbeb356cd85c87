"""Each lane's footprint read from its config and its engine's rule (laned.engines,
`gpu_share`), and what is derived from all of them at once: systemd's Conflicts= and the
placement report (docs/placement.md). Pure; the decisions are laned.core.placement's."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from laned import engines
from laned.config.model import LaneConfig, gpu_indices
from laned.core.placement import Footprint, Totals, never, per_gpu, together


def footprint(lane: str, spec: LaneConfig) -> Footprint:
    """The lane's footprint, from its engine's rule, its needs and its GPUs."""
    share, rule = engines.for_lane(spec).gpu_share(spec)
    gib = None
    if share is None and spec.needs.gpu_memory_gib:
        gib = spec.needs.gpu_memory_gib
        rule = f"needs.gpu_memory_gib = {gib:g} in all"
    elif share is None:
        rule += "; no needs.gpu_memory_gib"
    return Footprint(lane, gpu_indices(spec), share, gib, rule, spec.group, spec.port)


def footprints(lanes: Mapping[str, LaneConfig]) -> dict[str, Footprint]:
    """Every lane's footprint."""
    return {name: footprint(name, spec) for name, spec in sorted(lanes.items())}


_last: list[tuple[Mapping[str, LaneConfig], dict[str, Footprint]]] = []


def never_peers(lanes: Mapping[str, LaneConfig], lane: str) -> list[str]:
    """The lanes that can never run beside `lane` on any host (systemd's Conflicts=). A
    render asks for every lane of one config in turn: the footprints are read once for it."""
    if not _last or _last[0][0] is not lanes:
        _last[:] = [(lanes, footprints(lanes))]
    fps = _last[0][1]
    return [n for n in sorted(fps) if n != lane and never(fps[lane], fps[n])]


def report(
    lanes: Mapping[str, LaneConfig],
    totals: Totals | None,
    placed: Sequence[str] = (),
    asleep: Sequence[Footprint] = (),
) -> dict[str, Any]:
    """Placement as JSON (GET /fit, `laned status --fit`, `laned validate`): each lane's
    footprint, each pair of lanes with whether they may run together and why, and each GPU
    with the lanes `placed` on it, the sleepers `asleep` there (what each keeps), and what
    is left."""
    fps = footprints(lanes)
    sleepers = {fp.lane for fp in asleep}
    pairs = []
    for a, b in itertools.combinations(sorted(fps), 2):
        ok, why = together(fps[a], fps[b], totals)
        pairs.append({"a": a, "b": b, "together": ok, "why": why})
    gpus = [
        {
            "index": g.index,
            "total_bytes": g.total,
            "lanes": [{"name": n, "bytes": b, "asleep": n in sleepers} for n, b in g.lanes],
            "left_bytes": g.left,
        }
        for g in per_gpu([*(fps[n] for n in placed if n in fps), *asleep], totals)
    ]
    return {
        "gpus_known": totals is not None,
        "footprints": {
            n: {"gpus": fp.gpus, "share": fp.share, "gib": fp.gib, "rule": fp.rule}
            for n, fp in fps.items()
        },
        "pairs": pairs,
        "gpus": gpus,
    }


# The bound of one rank's reading where the GPUs are not read (no NVML): more than any GPU
# made holds (288 GB on the largest of 2026), so only an absurd number is refused there.
NO_GPU_HOLDS = 2**40


def held_of(
    said: Mapping[str, object], totals: Totals | None, gpus: Sequence[int] | None
) -> tuple[int | None, list[str]]:
    """What a weight-cache daemon holds on the lane's GPUs (`gpus`, None: any of the host's),
    from what each socket of its directory said (by name): a whole number of bytes, none
    above the largest of those GPUs, all of them together not above their sum — each reading
    that is not, dropped with the reason (a process of the user's may answer on a socket
    there: vLLM checks the directory's owner, not what answers). (bytes, or None where no
    reading stands; the reasons for those dropped)."""
    sizes = [size for gpu, size in sorted((totals or {}).items()) if gpus is None or gpu in gpus]
    largest = max(sizes) if sizes else NO_GPU_HOLDS
    where = "the largest GPU of the lane" if sizes else "any GPU holds"
    kept: dict[str, int] = {}
    dropped = []
    for name, value in sorted(said.items()):
        if isinstance(value, bool) or not isinstance(value, int):
            dropped.append(f"{name} said {_shown(value)}, not a number of bytes")
        elif value < 0:
            dropped.append(f"{name} said {value} bytes")
        elif value > largest:
            dropped.append(f"{name} said {value} bytes, more than {where} ({largest} bytes)")
        else:
            kept[name] = value
    total = sum(kept.values())
    if sizes and total > sum(sizes):
        dropped.append(
            f"{', '.join(kept)} said {total} bytes together, more than the lane's GPUs "
            f"({sum(sizes)} bytes)"
        )
        kept = {}
    return (total if kept else None), dropped


def _shown(value: object) -> str:
    """A value a socket sent, for a message: its type and a short repr (escaped, cut)."""
    text = repr(value)
    return f"{type(value).__name__} {text[:40]}{'…' if len(text) > 40 else ''}"
