"""A large request body read in a worker process, off laned's event loop.

laned reads two fields of an OpenAI request's body (laned.core.request_body.peek). Python's
JSON parser holds the interpreter for the whole parse (a 16 MiB body of token ids: about
250 ms here), and threads would not help: the parse holds the GIL. On the event loop that
stalled everything laned does — its own answers, the engines' probes, the user bus (64
clients sending 15 MB bodies: `/healthz` p99 3.6 s, the bus dropped; issue 53). So a body of
INLINE bytes or more is read by a worker: `python -m laned.adapters.body_parser`, a process
of laned's own that imports this module and the peek alone, takes framed bodies on its
stdin and answers each with a framed JSON line. It exits when its stdin closes (laned gone:
laned's unit has KillMode=process, so nothing else would end it).

Workers start at the first large body (a laned that never sees one starts none), one for
every 8 cores (1 to 4); a body waits for a free worker. A worker that dies or does not answer
within ANSWER_TIMEOUT is replaced, and its body is refused (BodyParserLost) — the body is
never read on the loop instead: the worker's death may have been that body's doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import struct
import sys
from typing import Any

from laned.adapters import commands
from laned.core.request_body import Body, Peek, peek
from laned.errors import BodyParserLost, BodyTooDeep

INLINE = 64 * 1024  # bytes: a body under this is read where it arrives (about 1 ms at worst)
ANSWER_TIMEOUT = 30.0  # seconds for a worker to read one body (16 MiB of ids: ~0.3 s here)
_FRAME = struct.Struct(">Q")


def workers_for(cores: int | None) -> int:
    """How many workers laned keeps: one for every 8 cores, 1 to 4."""
    return max(1, min(4, (cores or 1) // 8))


class BodyParser:
    """Reads large request bodies' `model` and `stream` in worker processes."""

    def __init__(self, workers: int | None = None) -> None:
        self.size = workers or workers_for(os.cpu_count())
        self._free: asyncio.Queue[_Worker] | None = None
        self._all: list[_Worker] = []

    async def peek(self, body: Body) -> Peek:
        """What laned reads of `body`: at once for a small one, else from a worker. Raises
        BodyTooDeep as peek does, BodyParserLost when the worker died reading it."""
        if len(body) < INLINE:
            return peek(body)
        if self._free is None:
            self._free = asyncio.Queue()
            for _ in range(self.size):
                worker = _Worker()
                self._all.append(worker)
                self._free.put_nowait(worker)
        worker = await self._free.get()
        try:
            return await worker.peek(body)
        finally:
            self._free.put_nowait(worker)

    async def close(self) -> None:
        """End the workers (each ends when its stdin closes)."""
        for worker in self._all:
            await worker.close()
        self._all.clear()
        self._free = None


class _Worker:
    """One worker process, started when first asked, replaced when it fails."""

    def __init__(self) -> None:
        self.process: asyncio.subprocess.Process | None = None

    async def peek(self, body: Body) -> Peek:
        process = self.process
        if process is None or process.returncode is not None:
            process = self.process = await _start()
        stdin, stdout = process.stdin, process.stdout
        assert stdin is not None and stdout is not None

        async def exchange() -> dict[str, Any]:
            stdin.write(_FRAME.pack(len(body)))
            stdin.write(body)
            await stdin.drain()
            (size,) = _FRAME.unpack(await stdout.readexactly(_FRAME.size))
            answer: dict[str, Any] = json.loads(await stdout.readexactly(size))
            return answer

        try:
            answer = await asyncio.wait_for(exchange(), ANSWER_TIMEOUT)
        except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
            await self.close()
            why = "did not answer in time" if isinstance(exc, asyncio.TimeoutError) else "died"
            raise BodyParserLost(
                f"laned's body parser {why} reading a body of {len(body)} bytes",
                "try again; if it happens again, laned's log says why the worker ended",
            ) from None
        if "too_deep" in answer:
            raise BodyTooDeep(*answer["too_deep"])
        span = answer.get("span")
        return Peek(answer.get("model"), bool(answer.get("stream")), tuple(span) if span else None)  # type: ignore[arg-type]

    async def close(self) -> None:
        process, self.process = self.process, None
        if process is None or process.returncode is not None:
            return
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 2)
        except asyncio.TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()


async def _start() -> asyncio.subprocess.Process:
    """A worker: this interpreter, this module, laned's import path; its stderr laned's."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    return await commands.start(
        [sys.executable, "-m", __name__], env, stdin=asyncio.subprocess.PIPE, stderr=None
    )


def serve() -> None:
    """The worker's loop: a framed body in, a framed JSON answer out, until stdin closes."""
    read, write = sys.stdin.buffer, sys.stdout.buffer
    while len(head := read.read(_FRAME.size)) == _FRAME.size:
        (size,) = _FRAME.unpack(head)
        body = read.read(size)
        try:
            found = peek(body)
            answer: dict[str, Any] = {
                "model": found.model,
                "stream": found.stream,
                "span": found.span,
            }
        except BodyTooDeep as exc:
            answer = {"too_deep": [exc.message, exc.hint]}
        del body
        out = json.dumps(answer).encode()
        write.write(_FRAME.pack(len(out)) + out)
        write.flush()


if __name__ == "__main__":
    serve()
