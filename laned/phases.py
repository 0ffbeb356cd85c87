"""Startup phases of an engine, read from its log lines: the one phase table (pure).

The names are what `laned status`, the events and the phase metrics show; `Phase` names
them once so that the supervisor and the tests do not spell them again.
"""

from __future__ import annotations

import re
from enum import Enum


class Phase(str, Enum):
    """A startup phase, in the words laned shows."""

    LOADING_MODEL = "loading model"
    LOADING_WEIGHTS = "loading weights"
    WEIGHTS_LOADED = "weights loaded"
    CUDA_GRAPHS = "capturing CUDA graphs"
    AUTOTUNE = "FlashInfer autotune"
    DEEPGEMM = "DeepGEMM JIT"
    TORCH_COMPILE = "torch.compile"
    PROFILING = "profiling memory"
    API_SERVER = "starting API server"
    SERVING = "serving"


# Phases after which the engine answers soon: they wake the readiness prober at once.
ALMOST_READY = frozenset({Phase.API_SERVER.value, Phase.SERVING.value})

_TABLE: list[tuple[re.Pattern[str], Phase]] = [
    (
        re.compile(r"Loading safetensors checkpoint shards:\s*(\d+)% Completed \| (\d+)/(\d+)"),
        Phase.LOADING_WEIGHTS,
    ),
    (re.compile(r"Loading weights took"), Phase.WEIGHTS_LOADED),
    (re.compile(r"Capturing CUDA graphs.*?(\d+)%\|.*?\| (\d+)/(\d+)"), Phase.CUDA_GRAPHS),
    (re.compile(r"[Aa]utotun\w*.*?(\d+)/(\d+)"), Phase.AUTOTUNE),
    (re.compile(r"[Aa]utotun"), Phase.AUTOTUNE),
    (re.compile(r"DeepG[Ee][Mm][Mm].*?(\d+)/(\d+)"), Phase.DEEPGEMM),
    (re.compile(r"DeepG[Ee][Mm][Mm]|deep_gemm"), Phase.DEEPGEMM),
    (re.compile(r"torch\.compile|Compiling a graph"), Phase.TORCH_COMPILE),
    (re.compile(r"Available KV cache memory"), Phase.PROFILING),
    (re.compile(r"Starting vLLM API server"), Phase.API_SERVER),
    (re.compile(r"Application startup complete"), Phase.SERVING),
    (re.compile(r"Starting to load model|Loading model"), Phase.LOADING_MODEL),
]


def parse_phase(line: str) -> tuple[str, float | None] | None:
    """The startup phase a vLLM log line announces, with a percent where it gives one."""
    for pattern, phase in _TABLE:
        match = pattern.search(line)
        if not match:
            continue
        numbers = [int(g) for g in match.groups() if g is not None]
        if len(numbers) >= 2 and numbers[-1] > 0:
            return phase.value, round(100.0 * numbers[-2] / numbers[-1], 1)
        return phase.value, None
    return None
