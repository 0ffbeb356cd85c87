"""laned's persisted state in state_dir/state.json: desired lanes, counters, recent events.

Read once at start; written atomically by a `StateWriter`, off the event loop and at most
every `DEBOUNCE` seconds however many transitions happen (a swap makes several, a storm of
requests dozens). systemd stays the truth about what runs; this file is the truth about
what the operator asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from laned.adapters.rendered import write_atomic
from laned.core.saved import Saved
from laned.errors import LanedError

STATE_FILE = "state.json"
DEBOUNCE = 0.2  # seconds between two writes of state.json
RETRY = 5.0  # seconds between two tries while state.json cannot be written

log = logging.getLogger("laned.state")


def load(state_dir: str) -> Saved:
    """Read state.json. A missing file is an empty state; an unreadable one (truncated,
    garbled) too, never fatal: it is moved aside to state.json.unreadable for the operator
    and `problem` says so, while laned recovers what runs from systemd."""
    path = f"{state_dir}/{STATE_FILE}"
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
        return Saved.from_json(data)
    except FileNotFoundError:
        return Saved()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        why = f"{path} is unreadable ({type(exc).__name__}: {exc})"
        with contextlib.suppress(OSError):
            os.replace(path, f"{path}.unreadable")
            why += f"; kept as {path}.unreadable"
        return Saved(problem=why + "; desired lanes recovered from what systemd runs")


def save(state_dir: str, saved: Saved) -> None:
    """Write state.json atomically."""
    write_atomic(f"{state_dir}/{STATE_FILE}", json.dumps(saved.to_json(), indent=1) + "\n", 0o600)


def checks_path(state_dir: str, lane: str) -> str:
    """Where a lane's last acceptance run is kept."""
    return f"{state_dir}/checks/{lane}.json"


def canary_path(state_dir: str, lane: str) -> str:
    """Where a lane's canary answer (laned.owner.reactions.canary_check) is kept."""
    return f"{state_dir}/canary/{lane}.json"


def checkpoint_path(state_dir: str, lane: str) -> str:
    """Where the checkpoint a lane's weights were last read from is kept
    (laned.owner.checkpoints)."""
    return f"{state_dir}/checkpoint/{lane}.json"


def load_kept(path: str) -> dict[str, Any] | None:
    """A lane's kept JSON object (checks, canary); None when there is none or it is unreadable."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def save_kept(path: str, data: dict[str, Any]) -> None:
    """Keep a lane's JSON object (atomically, 0600)."""
    write_atomic(path, json.dumps(data, indent=1) + "\n", 0o600)


def load_checks(state_dir: str, lane: str) -> dict[str, Any] | None:
    """The lane's last acceptance run; None when there is none (or it is unreadable)."""
    return load_kept(checks_path(state_dir, lane))


def save_checks(state_dir: str, lane: str, run: dict[str, Any]) -> None:
    """Keep the lane's last acceptance run (atomically)."""
    save_kept(checks_path(state_dir, lane), run)


class StateWriter:
    """Writes state.json when something changed: the first change at once, later ones
    gathered for DEBOUNCE seconds; the JSON is built and fsynced in a thread.

    `snapshot` is called on the loop (copies of plain data); `mark()` says it changed.
    `trouble` hears why a write failed (a full disk, a state dir made unwritable), and None
    once one succeeds again: laned keeps running, and says that what it was asked is not
    kept across a restart meanwhile."""

    def __init__(
        self,
        state_dir: str,
        snapshot: Callable[[], Saved],
        trouble: Callable[[str | None], None] = lambda why: None,
    ) -> None:
        self.state_dir = state_dir
        self.snapshot = snapshot
        self.trouble = trouble
        self.writes = 0
        self._taken = 0  # snapshots taken, numbered
        self._written = 0  # the newest snapshot on disk
        self._lock = threading.Lock()  # a write cancelled by close() may still run in its thread
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def mark(self) -> None:
        """Something worth keeping changed."""
        self._dirty.set()

    async def flush(self) -> None:
        """Write now what changed (an accepted request must outlive a crash of laned)."""
        if self._dirty.is_set():
            await self._write()

    def start(self) -> None:
        """Begin writing in the background (on the running loop)."""
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self._dirty.wait()
            await self._write()
            await asyncio.sleep(DEBOUNCE if self._written == self._taken else RETRY)

    async def _write(self) -> None:
        self._dirty.clear()
        self._taken += 1
        number, saved = self._taken, self.snapshot()
        try:
            await asyncio.to_thread(self._save, number, saved)
        except LanedError as exc:
            log.error("cannot save state: %s", exc)
            self.trouble(
                f"{exc.message} ({exc.hint}): requests are not kept across a restart of laned until it can"
            )
            self._dirty.set()  # try again with the next round
            return
        except Exception:  # a bug must not end the writer: the next change tries again
            log.exception("cannot save state")
            return
        self.trouble(None)

    def _save(self, number: int, saved: Saved) -> None:
        with self._lock:
            if number <= self._written:
                return  # a newer snapshot is on disk already
            save(self.state_dir, saved)
            self._written = number
            self.writes += 1

    async def close(self) -> None:
        """Stop the background writer; write what is still unwritten."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._dirty.is_set():
            await self._write()
