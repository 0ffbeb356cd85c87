"""Timestamps of the engine's own milestones, for the benches (LANED_SIM_TIMELINE=FILE).

vLLM's log stamps lines to the second; a bench that splits a 50 ms overhead needs better. With
LANED_SIM_TIMELINE set, the simulator appends one JSON line per milestone to that file:
`{"pid": P, "what": W, "at": UNIX_SECONDS}` for W in

- `process`: when the process was created (systemd's fork for an exec lane's wrapper, which
  execs the engine), from /proc/self/stat: 10 ms resolution;
- `main`: the engine's main() runs (interpreter and imports done);
- `listen`: the API port accepts connections (the end of the engine's own start);
- `sigterm`: the stop signal arrived; `exit`: the engine is about to exit.

Unset, nothing is written and nothing is read."""

from __future__ import annotations

import json
import os
import time


def _process_start() -> float:
    """Wall-clock time of this process's creation (clock ticks since boot, /proc/self/stat)."""
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    return time.time() - age


def mark(what: str) -> None:
    """Append one milestone (and, at `main`, the process's creation before it)."""
    path = os.environ.get("LANED_SIM_TIMELINE")
    if not path:
        return
    rows = [("process", _process_start())] if what == "main" else []
    rows.append((what, time.time()))
    with open(path, "a") as out:
        for name, at in rows:
            out.write(json.dumps({"pid": os.getpid(), "what": name, "at": at}) + "\n")
