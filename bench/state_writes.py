#!/usr/bin/env python3
"""What a transition costs the event loop in state.json writes (prints figures, asserts nothing).

    .venv/bin/python bench/state_writes.py [--transitions 200]

Before: every transition serialised all kept events (500) and fsynced state.json on the loop.
Now: a transition marks the state dirty; `StateWriter` writes the first change at once and
gathers the rest for 0.2 s, building the JSON and fsyncing in a thread.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dataclasses

from laned.adapters import state
from laned.core.lanes import Event
from laned.core.modes import Mode
from laned.core.saved import EVENTS_KEPT
from laned.owner.book import Book


def fire(book: Book, lane: str, ready: bool, reason: str) -> None:
    """A transition as the interpreter makes one: the record replaced, the event published."""
    was = book[lane]
    now = dataclasses.replace(was, mode=Mode.READY if ready else Mode.STARTING, reason=reason)
    book.replace(lane, now)
    book.publish(Event(time.time(), lane, was.state, now.state, reason))


def filled(changed: object = lambda: None) -> Book:
    book = Book(["a", "b"], time.time, changed)  # type: ignore[arg-type]
    for i in range(EVENTS_KEPT):
        fire(book, "a", bool(i % 2), f"event {i}")
    return book


async def main(transitions: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        # The old way: a synchronous save after each transition, on the loop.
        ledger = filled()
        blocked = []
        for i in range(transitions):
            started = time.perf_counter()
            fire(ledger, "b", bool(i % 2), "swap")
            state.save(tmp, ledger.saved())
            blocked.append(time.perf_counter() - started)
        # Now: the writer marks, writes off the loop, gathers bursts.
        writer = state.StateWriter(tmp, lambda: now.saved())
        now = filled(writer.mark)
        writer.start()
        marks = []
        started_burst = time.perf_counter()
        for i in range(transitions):
            started = time.perf_counter()
            fire(now, "b", bool(i % 2), "swap")
            marks.append(time.perf_counter() - started)
            if i % 20 == 19:
                await asyncio.sleep(0)  # let the loop breathe, as a storm of requests would
        burst = time.perf_counter() - started_burst
        await writer.close()
    ms = 1000.0
    print(f"state.json with {EVENTS_KEPT} events kept, {transitions} transitions")
    print(
        f"before: loop blocked per transition   median {statistics.median(blocked) * ms:7.2f} ms"
        f"   max {max(blocked) * ms:7.2f} ms   writes {transitions}"
    )
    print(
        f"now:    loop blocked per transition   median {statistics.median(marks) * ms:7.3f} ms"
        f"   max {max(marks) * ms:7.3f} ms   writes {writer.writes} (burst of {burst * ms:.0f} ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--transitions", type=int, default=200)
    asyncio.run(main(parser.parse_args().transitions))
