"""What a lane's weights were read from (laned.core.checkpoint): the checkpoint's files as
the file system had them when they were last read from disk — a weight-cache daemon's start,
a cold start of a lane that sleeps — kept in the state directory (a laned restarted meanwhile
still knows), and compared before those weights are served again without a read: an engine
that maps the daemon's weights (docs/weight-cache.md), a wake (docs/sleep.md).

A part of the owner (laned.owner.supervisor): it reads the files through the seam's page
cache and keeps the record with laned's own state files; it changes no lane's state. Lanes that neither keep
their weights in a daemon nor sleep read them from disk at every start: nothing is kept.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from laned.config.model import LaneConfig
from laned.core import checkpoint
from laned.errors import LanedError
from laned.owner.records import Records
from laned.owner.seam import PageCache, StateStore
from laned.preflight.rules import model_path

log = logging.getLogger("laned.supervisor")


@dataclass(frozen=True)
class Moved:
    """The files of a lane's checkpoint that changed since its weights were read."""

    model: str
    paths: tuple[str, ...]

    def __str__(self) -> str:
        return f"the checkpoint in {self.model} ({checkpoint.said(self.model, self.paths)})"


def follows(spec: LaneConfig) -> bool:
    """Whether the lane serves weights it read earlier: kept in a daemon, or asleep."""
    return spec.weight_cache is not None or spec.sleep_level > 0


class Checkpoints:
    """Each lane's checkpoint as last read, kept; compared before weights are served again."""

    def __init__(self, records: Records, pages: PageCache, store: StateStore) -> None:
        self.records, self.pages, self.store = records, pages, store

    async def _kept(self, lane: str) -> tuple[str, checkpoint.Files] | None:
        """The checkpoint kept for the lane (read off the loop)."""
        state_dir = self.records.config.daemon.state_dir
        return checkpoint.from_json(
            await asyncio.to_thread(self.store.load_checkpoint, state_dir, lane)
        )

    async def record(self, lane: str) -> None:
        """Keep the lane's checkpoint as its files are now: just before they are read."""
        spec = self.records.config.lanes[lane]
        model = model_path(spec)
        if not follows(spec) or model is None:
            return  # a hub name: the engine's own download, not a directory laned can read
        files = await asyncio.to_thread(self.pages.checkpoint, model)
        try:
            kept = checkpoint.to_json(model, files)
            await asyncio.to_thread(
                self.store.save_checkpoint, self.records.config.daemon.state_dir, lane, kept
            )
        except LanedError as exc:  # then no check until it can be kept: said in the log
            log.warning("%s: the checkpoint read now is not kept: %s", lane, exc.message)

    async def since(self, lane: str) -> Moved | None:
        """The files that changed since the lane's weights were read; None where none did
        or laned cannot tell. Without a record (a laned of before this check), the files as
        they are now become the record."""
        spec = self.records.config.lanes[lane]
        model = model_path(spec)
        if not follows(spec) or model is None:
            return None
        kept = await self._kept(lane)
        if kept is None:
            await self.record(lane)
            return None
        files = await asyncio.to_thread(self.pages.checkpoint, model)
        paths = checkpoint.changed(kept[1], files)
        return Moved(model, paths) if paths else None

    async def digest(self, lane: str) -> str:
        """A short hash of the checkpoint kept for the lane ("" where none is): the canary's
        answer is kept per checkpoint, so a new fine-tune's first good start keeps its own."""
        kept = await self._kept(lane)
        return "" if kept is None else checkpoint.digest(kept[1])
