"""The simulated engine's decode steps: one clock for every running request.

One vLLM engine step makes a token for every running request, and the API server's output
handler takes that step's outputs for all of them and puts each in its request's queue in one
pass (vllm/v1/engine/async_llm.py, `output_handler`; `process_outputs` in
vllm/v1/engine/output_processor.py). So concurrent streams write their SSE events together, at
the same step boundaries, a step apart: not each on a clock of its own, spread over the step.
A proxy in front of the engine reads them in a few wakeups per step, not one per event.
"""

from __future__ import annotations

import math


class DecodeSteps:
    """Step boundaries every 1/`tps` seconds from `since` (the engine's start)."""

    def __init__(self, tps: float, since: float) -> None:
        self.tps, self.since = tps, since

    def after(self, now: float) -> int:
        """The first step at or after `now`: where a prefill that ends at `now` samples its
        first token."""
        return math.ceil((now - self.since) * self.tps - 1e-6)

    def next(self, last: int | None, now: float) -> int:
        """The step of a request's next token: the first step at or after `now` for its first
        (`last` None: the step that ends its prefill samples it), else the step after its
        last one, or (when the request fell behind: stalled, held) the one that has begun."""
        if last is None:
            return self.after(now)
        return max(last + 1, self.after(now) - 1)

    def at(self, step: int) -> float:
        """When `step` begins (the clock of `since`)."""
        return self.since + step / self.tps
