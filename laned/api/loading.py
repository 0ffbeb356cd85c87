"""A streaming chat request that waits for its lane hears how the wait goes, in-band
(`loading_state = true`, docs/proxy.md): chat.completion.chunk events whose delta carries
reasoning text ("glm53: loading weights 40 %, ~3 min left"), then the engine's own stream,
unchanged. A client that shows reasoning shows the wait; the answer itself is the engine's.

The chunks have vLLM's shape: `reasoning` is the delta's reasoning field in vLLM 0.32
(vllm/entrypoints/generate/base/protocol.py `DeltaMessage`), and an error after the stream
has begun is an event `data: {"error": ...}` then `data: [DONE]`, as vLLM streams its own
(vllm/entrypoints/generate/base/serving.py `create_streaming_error_response`). Pure.
"""

from __future__ import annotations

import json
import time
import uuid

from laned.core.lanes import LaneState, LaneStatus

EVERY = 2.0  # seconds between looks at the lane while a request waits
DONE = b"data: [DONE]\n\n"


def remaining(seconds: float) -> str:
    """`~3 min`, `~40 s`: a prediction, rounded as a person says it."""
    if seconds >= 90:
        return f"~{round(seconds / 60)} min"
    return f"~{max(round(seconds), 1)} s"


def progress_line(lane: str, status: LaneStatus, now: float) -> str:
    """One line on where the lane is on its way to serving."""
    if status.state is LaneState.STARTING:
        what = status.phase or ("waking" if "waking" in status.reason else "starting")
        if status.progress is not None:
            what += f" {status.progress:.0f} %"
        startup = status.startup(now) or {}
        left = startup.get("remaining")
        return f"{lane}: {what}" + (f", {remaining(left)} left" if left else "")
    if status.state in (LaneState.READY, LaneState.DEGRADED):
        return f"{lane}: ready"
    if status.state is LaneState.SLEEPING:
        return f"{lane}: asleep, waiting for its turn on the GPUs"
    if status.state is LaneState.STOPPING:
        return f"{lane}: stopping its earlier run"
    return f"{lane}: waiting for its turn on the GPUs"


class Progress:
    """The chunks of one waiting request's stream."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-laned-{uuid.uuid4().hex}"
        self.model = model
        self.created = int(time.time())
        self.sent = 0

    def chunk(self, line: str) -> bytes:
        """A chat.completion.chunk whose delta is one line of reasoning text."""
        delta = (
            {"role": "assistant", "reasoning": line + "\n"}
            if not self.sent
            else {"reasoning": line + "\n"}
        )
        self.sent += 1
        body = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": None}],
        }
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"


def error_event(body: bytes) -> bytes:
    """An error (OpenAI's shape, as laned or the engine answered it) as the stream's last
    event, then the end of the stream."""
    try:
        one_line = json.dumps(json.loads(body), separators=(",", ":")).encode()
    except ValueError:  # not JSON: said as a message
        error = {"message": body.decode(errors="replace").strip(), "type": "BadGatewayError"}
        one_line = json.dumps({"error": error}).encode()
    return b"data: " + one_line + b"\n\n" + DONE
