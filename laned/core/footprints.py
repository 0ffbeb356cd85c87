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
