"""Startup phases of an engine, read from its log lines as vLLM really prints them (pure).

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


@dataclass(frozen=True)
class Seen:
    """What one log line says about the startup."""

    phase: str | None  # None: a note only
    progress: float | None = None  # percent, where a bar gives one
    elapsed: float | None = None  # seconds the bar had run when it printed this (tqdm)
    note: str | None = None  # e.g. "compile cache hit (torch.compile)"


_BAR = r".*?(\d+)%\|.*?\| (\d+)/(\d+)"  # tqdm's default: `desc:  40%|████      | 4/10 [...]`

# (pattern, phase or None, note or None), first match wins; sources in docs/simulator.md.
_TABLE: list[tuple[re.Pattern[str], Phase | None, str | None]] = [
    (
        re.compile(r"Loading safetensors checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
        Phase.LOADING_WEIGHTS,
        None,
    ),
    (re.compile(r"Loading weights took|Model loading took"), Phase.WEIGHTS_LOADED, None),
    (
        re.compile(r"Directly load the compiled graph\(s\)|Directly load AOT compilation"),
        Phase.TORCH_COMPILE,
        f"{CACHE_HIT} (torch.compile)",
    ),
    (
        re.compile(r"Dynamo bytecode transform time|Compiling a graph for|torch\.compile takes"),
        Phase.TORCH_COMPILE,
        None,
    ),
    # "GPU KV cache size", "CPU KV cache size" (the CPU build): kv_cache_utils.py "%s KV cache size"
    (re.compile(r"Available KV cache memory|\b[A-Z]+ KV cache size: "), Phase.PROFILING, None),
    (re.compile(r"DeepG[Ee][Mm][Mm]" + _BAR), Phase.DEEPGEMM, None),
    (re.compile(r"DeepG[Ee][Mm][Mm].*?(\d+)/(\d+)"), Phase.DEEPGEMM, None),
    (re.compile(r"DeepG[Ee][Mm][Mm]|deep_gemm"), Phase.DEEPGEMM, None),
    (
        re.compile(r"Using FlashInfer autotune cache|FlashInfer autotune cache loaded"),
        None,
        f"{CACHE_HIT} (FlashInfer autotune)",
    ),
    (re.compile(r"Skipping FlashInfer autotune"), None, "FlashInfer autotune skipped"),
    (re.compile(r"[Aa]utotun\w*.*?(\d+)/(\d+)"), Phase.AUTOTUNE, None),
    (re.compile(r"[Aa]utotun"), Phase.AUTOTUNE, None),
    (re.compile(r"Capturing CUDA graphs" + _BAR), Phase.CUDA_GRAPHS, None),
    (re.compile(r"Capturing CUDA graphs|Graph capturing finished"), Phase.CUDA_GRAPHS, None),
    (
        # The engine is up (vllm/v1/engine/core.py), then the API server starts
        # (vllm/entrypoints/openai/api_server.py; the older line says "API server %d").
        re.compile(
            r"init engine \(profile, create kv cache, warmup model\) took|Supported tasks:"
            r"|Starting vLLM (?:API )?server|Available routes are"
        ),
        Phase.API_SERVER,
        None,
    ),
    (re.compile(r"Application startup complete"), Phase.SERVING, None),
    (re.compile(r"Starting to load model|Loading model"), Phase.LOADING_MODEL, None),
]
_ELAPSED = re.compile(r"\[(?:(\d+):)?(\d+):(\d+)<")  # tqdm's `[elapsed<remaining` as [H:]MM:SS


def last_segment(line: str) -> str:
    """What a terminal would show of a `\\r`-redrawn line: its last non-empty segment."""
    segments = [s for s in line.split("\r") if s.strip()]
    return segments[-1] if segments else ""


# Lines that list the engine's settings (every feature by name, on or off) say nothing of
# where a start is: vLLM's config dump (vllm/v1/engine/core.py, "Initializing a V1 LLM engine
# (v0.32.0) with config: ... enable_flashinfer_autotune=True ...") and the API server's
# "non-default args: {...}" (vllm/entrypoints/serve/utils/api_utils.py).
_SETTINGS = re.compile(r"LLM engine \(v[^)]*\) with config: |non-default args: ")


def read_line(line: str) -> Seen | None:
    """What a vLLM log line says of the startup: a phase (with a percent and tqdm's elapsed
    time where a bar gives them), or a note (a compile cache hit, a skipped autotune)."""
    text = last_segment(line)
    if _SETTINGS.search(text):
        return None
    for pattern, phase, note in _TABLE:
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
