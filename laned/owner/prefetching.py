"""The next lane's weights read into the page cache while its swap waits (docs/prefetch.md).
A part of the owner (laned.owner.supervisor), asked by the lane machine's effects
(laned.core.effects.Prefetch): `begin` when an activation has peers to take off the GPUs,
`end` at the start (after the GPU-memory gate) or when the activation ends in any other way
(done, failed, superseded); `at_start`, by the unit's start (laned.owner.actions), records how
much of the weights is resident as the engine starts, for the cold-start report (an input:
WeightsAtStart).

The read runs in a thread of its own and is stopped by a flag it looks at between blocks, so
neither a stop nor a start ever waits for it. Its bounds, taken when it begins: no more than
MemAvailable less the margin, less what the lanes still running keep of their own weights in
the page cache (MemAvailable counts that cache as free to take, and an engine that reads its
checkpoint while serving needs it: seed 000's Engram rows), and no faster than `max_gibps`.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Collection

from laned.core import inputs as i
from laned.core.facts import GIB, size
from laned.core.lanes import EventKind, LaneState, LaneStatus
from laned.core.machine import Step
from laned.core.page_cache import Prefetched, Residency
from laned.owner.records import Records
from laned.owner.seam import PageCache
from laned.preflight.rules import model_path


class Prefetches:
    """At most one prefetch per lane."""

    def __init__(self, records: Records, pages: PageCache) -> None:
        self.records, self.pages = records, pages
        self.post: Callable[[str, i.Input], Step] = lambda lane, event: Step(LaneStatus(lane))
        self.running: dict[str, threading.Event] = {}  # lane -> the flag that stops its read
        self.last: dict[str, Prefetched] = {}  # each lane's last prefetch, for its start note

    def begin(self, lane: str, keep: Collection[str]) -> None:
        """Start reading `lane`'s weights in, sparing what the lanes `keep` (still running
        while this one waits) hold in the page cache."""
        config = self.records.config
        settings = config.daemon.prefetch
        if not settings.enabled or not config.lanes[lane].prefetch or lane in self.running:
            return
        status = self.records.statuses[lane]
        if status.state is LaneState.SLEEPING and status.asleep and status.asleep.level == 1:
            return  # its weights wait in pinned host memory: the wake reads no file
        self.last.pop(lane, None)
        stop = self.running[lane] = threading.Event()
        self.records.spawn(self._run(lane, keep, stop))

    def end(self, lane: str) -> None:
        """Stop the lane's prefetch, if one runs (its thread ends within one block)."""
        stop = self.running.get(lane)
        if stop is not None:
            stop.set()

    def end_all(self) -> None:
        """laned closes: every prefetch stops."""
        for stop in self.running.values():
            stop.set()

    def at_start(self, lane: str) -> None:
        """Record, beside the start, how much of the lane's weights is resident now (measured
        off the loop, while the engine begins its imports)."""
        model = model_path(self.records.config.lanes[lane])
        run = self.records.statuses[lane].run  # its weights_at_start is reset by the new run

        async def measure() -> None:
            for _ in range(100):  # a prefetch stopped at the start ends within one block
                if lane not in self.running:
                    break
                await asyncio.sleep(0.05)
            files = await asyncio.to_thread(self.pages.weight_files, model)
            found = await asyncio.to_thread(self.pages.residency, files)
            if not files:
                return  # no local weights
            shown = found.to_json()
            done = self.last.pop(lane, None)
            if done is not None:
                shown["prefetched_bytes"] = done.read_bytes
            if self.post(lane, i.WeightsAtStart(run, shown)).ignored:
                return  # a newer start owns the lane
            self.records.book.note(
                lane,
                EventKind.PREFETCH,
                f"weights at the start: {size(found.resident_bytes)} of "
                f"{size(found.total_bytes)} in the page cache ({found.fraction:.0%})",
            )

        self.records.spawn(measure())

    async def _run(self, lane: str, keep: Collection[str], stop: threading.Event) -> None:
        try:
            done = await self._read(lane, keep, stop)
        finally:
            if self.running.get(lane) is stop:
                del self.running[lane]
        if done is not None:
            self.last[lane] = done

    async def _read(
        self, lane: str, keep: Collection[str], stop: threading.Event
    ) -> Prefetched | None:
        config = self.records.config
        settings = config.daemon.prefetch
        note = self.records.book.note
        models = [model_path(config.lanes[other]) for other in keep]

        pages = self.pages

        def look() -> tuple[list[str], Residency, Residency, float]:
            files = pages.weight_files(model_path(config.lanes[lane]))
            spared = [f for model in models for f in pages.weight_files(model) if f not in files]
            available = pages.mem_available() or 0.0
            return files, pages.residency(files), pages.residency(spared), available

        files, mine, theirs, available = await asyncio.to_thread(look)
        if not files:
            return None  # a hub name, or no weight file: the engine finds its own way
        margin = settings.margin_gib * GIB
        budget = int(available - margin - theirs.resident_bytes)
        missing = mine.total_bytes - mine.resident_bytes
        if missing <= 0:
            return None
        if budget <= 0:
            note(
                lane,
                EventKind.PREFETCH,
                f"no prefetch: MemAvailable {size(available)} less the margin ({settings.margin_gib:g} GiB) and the page cache the running lanes keep ({size(theirs.resident_bytes)}) leaves no room",
            )
            return None
        note(
            lane,
            EventKind.PREFETCH,
            f"prefetch: reading up to {size(min(missing, budget))} of its weights while the swap waits ({mine.fraction:.0%} of {size(mine.total_bytes)} resident)",
        )

        def memory_left() -> float:
            return (pages.mem_available() or 0.0) - margin

        done = await asyncio.to_thread(
            pages.read_ahead, files, budget, settings.max_gibps * GIB, stop, memory_left
        )
        note(
            lane,
            EventKind.PREFETCH,
            f"prefetch {done.ended}: {size(done.read_bytes)} read in {done.seconds:.1f}s",
        )
        return done
