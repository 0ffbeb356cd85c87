"""Startup phases of an engine, read from its log lines (pure): the words laned shows, and
the reading of a line by an engine's own patterns (laned.engines: vLLM's in engines/vllm.py).

What journald delivers is not a line per update: tqdm redraws a bar with `\\r` and writes a
newline only when it closes, so a CUDA-graph or DeepGEMM bar arrives as one record of
`\\r`-joined redraws once it ends (or as pieces of one, past journald's line limit), and
vLLM's shard bar ends every redraw with a newline but still starts it with `\\r`
(vllm/model_executor/model_loader/weight_utils.py `_BAR_FORMAT`). So a line is read by its
last `\\r` segment, and a bar's start is its arrival minus tqdm's own elapsed time.

The names are what `laned status`, the events and the phase metrics show; `Phase` names
them once so that the supervisor and the tests do not spell them again.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum


class Phase(str, Enum):
    """A startup phase, in the words laned shows."""

    LOADING_MODEL = "loading model"
    LOADING_WEIGHTS = "loading weights"
    WEIGHTS_LOADED = "weights loaded"
    TORCH_COMPILE = "torch.compile"
    PROFILING = "profiling memory"
    DEEPGEMM = "DeepGEMM JIT"
    AUTOTUNE = "FlashInfer autotune"
    CUDA_GRAPHS = "capturing CUDA graphs"
    API_SERVER = "starting API server"
    SERVING = "serving"


# Phases after which the engine answers soon: they wake the readiness prober at once.
ALMOST_READY = frozenset({Phase.API_SERVER.value, Phase.SERVING.value})

CACHE_HIT = "compile cache hit"
# A note, not a phase: the engine logged that it is dying (its profile's HealthRule.dying).
DYING = "the engine says it is dying"


@dataclass(frozen=True)
class Seen:
    """What one log line says about the startup."""

    phase: str | None  # None: a note only
    progress: float | None = None  # percent, where a bar gives one
    elapsed: float | None = None  # seconds the bar had run when it printed this (tqdm)
    note: str | None = None  # e.g. "compile cache hit (torch.compile)"


BAR = r".*?(\d+)%\|.*?\| (\d+)/(\d+)"  # tqdm's default: `desc:  40%|████      | 4/10 [...]`

_ELAPSED = re.compile(r"\[(?:(\d+):)?(\d+):(\d+)<")  # tqdm's `[elapsed<remaining` as [H:]MM:SS


def last_segment(line: str) -> str:
    """What a terminal would show of a `\\r`-redrawn line: its last non-empty segment."""
    segments = [s for s in line.split("\r") if s.strip()]
    return segments[-1] if segments else ""


Patterns = Sequence[tuple["re.Pattern[str]", Phase | None, str | None]]


def read_with(patterns: Patterns, ignore: re.Pattern[str] | None, line: str) -> Seen | None:
    """What a log line says of the startup by an engine's `patterns` (pattern, phase or
    None, note or None; the first match wins): a phase (with a percent and tqdm's elapsed
    time where a bar gives them), or a note (a compile cache hit, a skipped autotune).
    A line `ignore` matches (a settings dump) says nothing."""
    text = last_segment(line)
    if ignore is not None and ignore.search(text):
        return None
    for pattern, phase, note in patterns:
        match = pattern.search(text)
        if not match:
            continue
        numbers = [int(g) for g in match.groups() if g is not None]
        progress = None
        if len(numbers) >= 2 and numbers[-1] > 0:
            progress = round(min(100.0 * numbers[-2] / numbers[-1], 100.0), 1)
        elapsed = None
        if (clock := _ELAPSED.search(text[match.start() :])) is not None:
            hours, minutes, seconds = (int(g) if g else 0 for g in clock.groups())
            elapsed = float(hours * 3600 + minutes * 60 + seconds)
        return Seen(None if phase is None else phase.value, progress, elapsed, note)
    return None


def add_mark(
    marks: Sequence[tuple[str, float]], phase: str, since: float
) -> list[tuple[str, float]]:
    """The phase timeline with `phase` begun at `since`: in time order, a phase that goes on
    (the same as the one before it) adds no mark, and an earlier start of it moves its mark."""
    out = [m for m in marks if not (m[0] == phase and m[1] >= since)]
    out.append((phase, since))
    out.sort(key=lambda m: m[1])
    merged: list[tuple[str, float]] = []
    for mark in out:
        if not merged or merged[-1][0] != mark[0]:
            merged.append(mark)
    return merged
