"""Which lanes may run together, and which an activation must take off (docs/placement.md).

Pure: footprints and the host's GPUs in, decisions out (laned.engines.footprints reads the
footprints from the config; this module imports neither it nor pydantic, so that
bench/gpu_placement.py runs it on a GPU machine). A lane's footprint is what its engine
takes of each of its GPUs by the engine's own rule (laned.engines, `gpu_share`: vLLM's
--gpu-memory-utilization × the GPU's memory), else the lane's `needs.gpu_memory_gib` spread
over its GPUs, else the whole GPU; on the GPUs it names (`gpus`, its CDI devices or
CUDA_VISIBLE_DEVICES), all of the host's otherwise. Lanes fit together when, on every GPU
they share, their footprints add up to no more than the GPU's memory. One explicit `group`
and one port keep lanes apart whatever the numbers say.

Where the host's GPUs are not known (no NVML), shares still compare (two vLLM lanes at 0.92
never fit one GPU), sizes in GiB do not: lanes whose sum cannot be told are kept apart, as
lanes of one group were before placement.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from laned.core.facts import GIB

Totals = Mapping[int, int]  # GPU index -> its memory in bytes, as NVML reads it
EVERY = -1  # "every GPU" of a host whose GPUs are not known
EXACT_UP_TO = 12  # lanes to choose from beyond which the cheapest set is found greedily
PINNED_COST = 1e9  # a pinned lane goes only where nothing else frees the room
UNMEASURED_START = 30.0  # seconds, the swap-in cost of a lane never started


@dataclass(frozen=True)
class Footprint:
    """What a lane takes of the GPUs, and what keeps it apart from other lanes."""

    lane: str
    gpus: tuple[int, ...] | None  # None: every GPU of the host
    share: float | None = None  # of each of its GPUs' memory, by its engine's own rule
    gib: float | None = None  # in all, over its GPUs (needs.gpu_memory_gib), where no share
    rule: str = ""  # where the figure comes from, for people
    group: str | None = None
    port: int = 0
    # Bytes it holds on each GPU as measured, which every other figure gives way to: a
    # sleeping lane's residual memory (`asleep`), kept at its last sleep.
    held: tuple[tuple[int, int], ...] | None = None

    @property
    def whole(self) -> bool:
        """It takes its GPUs whole: no figure says less."""
        return self.share is None and self.gib is None and self.held is None

    @classmethod
    def asleep(cls, lane: str, kept: Mapping[int, int], port: int) -> Footprint:
        """A sleeping lane: what it kept on each GPU at its last sleep, and its port (its
        engine still listens). Of no group: a sleeper runs beside anything that fits."""
        held = tuple(sorted(kept.items()))
        return cls(lane, tuple(g for g, _ in held), rule="asleep", port=port, held=held)

    def on(self, totals: Totals | None) -> tuple[int, ...]:
        """The indices of its GPUs ((EVERY,): all of a host whose GPUs are not known)."""
        if self.gpus is not None:
            return self.gpus
        return tuple(sorted(totals)) if totals else (EVERY,)

    def demand(self, gpu: int, totals: Totals | None) -> int | None:
        """Bytes it takes of GPU `gpu`; None where that cannot be told here."""
        if self.held is not None:
            return dict(self.held).get(gpu, 0)
        total = None if totals is None else totals.get(gpu)
        if self.share is not None:
            return None if total is None else int(self.share * total)
        if self.gib is not None:
            on = self.on(totals)
            return None if on == (EVERY,) else int(self.gib / len(on) * GIB)
        return total  # the whole GPU

    def says(self, gpu: int, totals: Totals | None) -> str:
        """Its demand on `gpu`, for people: "44.2 GiB (--gpu-memory-utilization 0.46)"."""
        need = self.demand(gpu, totals)
        if self.whole:
            return f"{self.lane} the whole GPU ({self.rule})"
        if need is not None:
            size = f"{need / GIB:.1f} GiB"
        else:
            size = f"{self.share:g} of it" if self.share is not None else f"{self.gib:g} GiB in all"
        return f"{self.lane} {size} ({self.rule})"


def common(a: Footprint, b: Footprint, totals: Totals | None) -> tuple[int, ...]:
    """The GPUs two lanes share."""
    x, y = a.on(totals), b.on(totals)
    if x == (EVERY,):
        return y
    if y == (EVERY,):
        return x
    return tuple(sorted(set(x) & set(y)))


def apart(a: Footprint, b: Footprint) -> str:
    """Why two lanes never run together whatever their memory ("": nothing says so)."""
    if a.group is not None and a.group == b.group:
        return f"both are of group {a.group} (never together)"
    if a.port == b.port:
        return f"both listen on port {a.port}"
    return ""


def crowded(gpu: int, lanes: Sequence[Footprint], totals: Totals | None) -> str:
    """Why `lanes` do not fit GPU `gpu` together ("": they do)."""
    total = None if totals is None else totals.get(gpu)
    where = f"GPU {gpu}" if gpu != EVERY else "their GPUs"
    if total is None:
        whole = next((fp for fp in lanes if fp.whole), None)
        if whole is not None and len(lanes) > 1:  # whatever the GPU's memory
            return f"{where}: {whole.says(gpu, totals)}: nothing runs beside it"
        shares = [fp.share for fp in lanes]
        if all(s is not None for s in shares):
            if sum(s or 0.0 for s in shares) <= 1.0 + 1e-9:
                return ""
            parts = " + ".join(f"{fp.lane} {fp.share:g}" for fp in lanes)
            return f"{where}: {parts} of its memory is more than all of it"
        return (
            f"{where}: its memory is not known here (no NVML), and "
            + ", ".join(fp.says(gpu, totals) for fp in lanes if fp.share is None)
            + " cannot be added up without it"
        )
    needs = [fp.demand(gpu, totals) or 0 for fp in lanes]
    if sum(needs) <= total:
        return ""
    parts = " + ".join(fp.says(gpu, totals) for fp in lanes)
    return f"{where}: {parts} is more than its {total / GIB:.1f} GiB"


def fits(lane: Footprint, others: Sequence[Footprint], totals: Totals | None) -> str:
    """Why `lane` cannot run beside `others` ("": it can)."""
    for other in others:
        why = apart(lane, other)
        if why:
            return f"{other.lane}: {why}"
    on = lane.on(totals)
    if on == (EVERY,):  # every GPU of an unknown host: each GPU another lane names, and the rest
        on = (*sorted({g for o in others for g in o.on(totals) if g != EVERY}), EVERY)
    for gpu in on:
        there = [o for o in others if gpu in o.on(totals) or o.on(totals) == (EVERY,)]
        why = crowded(gpu, [lane, *there], totals)
        if why:
            return why
    return ""


def together(a: Footprint, b: Footprint, totals: Totals | None) -> tuple[bool, str]:
    """Whether two lanes may run together, and why."""
    why = apart(a, b)
    if why:
        return False, why
    shared = common(a, b, totals)
    if not shared:
        return True, "no GPU in common"
    for gpu in shared:
        why = crowded(gpu, [a, b], totals)
        if why:
            return False, why
    gpus = "their GPUs" if shared == (EVERY,) else "GPU " + ", ".join(map(str, shared))
    return True, f"both fit on {gpus}"


def never(a: Footprint, b: Footprint) -> str:
    """Why two lanes can never run together, on any host ("": they might, as the GPUs'
    memory decides): one group, one port, a whole GPU, or shares of one GPU over 1."""
    why = apart(a, b)
    if why or not common(a, b, None):
        return why
    whole = next((fp for fp in (a, b) if fp.whole), None)
    if whole is not None:
        return f"{whole.lane} takes its GPUs whole ({whole.rule})"
    if a.share is not None and b.share is not None and a.share + b.share > 1.0 + 1e-9:
        return f"{a.lane} {a.share:g} + {b.lane} {b.share:g} of a GPU they share is more than all of it"
    return ""


def cost(start_s: float | None, load: int, priority: int, pinned: bool) -> float:
    """What taking a lane off costs: the seconds its swap back in takes (measured, else
    UNMEASURED_START), once for itself and once more for each request it has waiting or in
    flight, plus a minute a point of `priority`; a pinned lane almost never goes."""
    base = start_s if start_s is not None else UNMEASURED_START
    value = max(base * (1 + load) + priority * 60.0, 0.0)
    return value + (PINNED_COST if pinned else 0.0)


@dataclass(frozen=True)
class Eviction:
    """What an activation takes off, and why each; `fits`: whether the lane then fits (False:
    not even alone, and every lane on its GPUs goes)."""

    lanes: tuple[str, ...]
    why: Mapping[str, str]
    fits: bool = True


def evictions(
    lane: Footprint,
    placed: Sequence[Footprint],
    totals: Totals | None,
    costs: Mapping[str, float],
) -> Eviction:
    """The lanes an activation of `lane` must take off: those that never run beside it, and
    of the others on its GPUs the set of least cost (then fewest, then first by name) that
    leaves it room. A lane on none of its GPUs and of another group and port never goes."""
    why: dict[str, str] = {}
    for other in placed:
        ok, because = together(lane, other, totals)
        if not ok:
            why[other.lane] = because
    staying = [p for p in placed if p.lane not in why]
    if not fits(lane, staying, totals):
        return Eviction(tuple(sorted(why)), why)
    candidates = [p for p in staying if common(lane, p, totals)]
    chosen = _cheapest(lane, staying, candidates, totals, costs)
    ok = chosen is not None
    for p in chosen if chosen is not None else candidates:
        why[p.lane] = f"room for {lane.lane} on GPU " + ", ".join(
            str(g) for g in common(lane, p, totals)
        )
    return Eviction(tuple(sorted(why)), why, ok)


def _cheapest(
    lane: Footprint,
    staying: Sequence[Footprint],
    candidates: Sequence[Footprint],
    totals: Totals | None,
    costs: Mapping[str, float],
) -> list[Footprint] | None:
    """The cheapest of `candidates` to take off so that `lane` fits; None if none does."""

    def key(chosen: Sequence[Footprint]) -> tuple[float, int, list[str]]:
        return sum(costs.get(p.lane, 0.0) for p in chosen), len(chosen), [p.lane for p in chosen]

    def room(chosen: Sequence[Footprint]) -> bool:
        names = {p.lane for p in chosen}
        return not fits(lane, [p for p in staying if p.lane not in names], totals)

    ordered = sorted(candidates, key=lambda p: (costs.get(p.lane, 0.0), p.lane))
    if len(ordered) > EXACT_UP_TO:  # greedy: the cheapest first until it fits
        for n in range(1, len(ordered) + 1):
            if room(ordered[:n]):
                return ordered[:n]
        return None
    best: list[Footprint] | None = None
    for n in range(1, len(ordered) + 1):
        for combo in itertools.combinations(ordered, n):
            if room(combo) and (best is None or key(combo) < key(best)):
                best = list(combo)
    return best


@dataclass(frozen=True)
class GpuPlace:
    """One GPU as placement sees it: its memory, the lanes placed there with what each
    takes (None: cannot be told), and what is left (None: cannot be told)."""

    index: int
    total: int | None
    lanes: tuple[tuple[str, int | None], ...]
    left: int | None


def per_gpu(placed: Sequence[Footprint], totals: Totals | None) -> list[GpuPlace]:
    """Each GPU with the lanes placed on it and what is left."""
    indices = sorted(totals) if totals else sorted({g for p in placed for g in p.on(totals)})
    out = []
    for gpu in indices:
        total = None if totals is None else totals.get(gpu)
        there = [(p.lane, p.demand(gpu, totals)) for p in placed if gpu in p.on(totals)]
        known = [n for _, n in there if n is not None]
        left = None if total is None or len(known) < len(there) else total - sum(known)
        out.append(GpuPlace(gpu, total, tuple(there), left))
    return out
