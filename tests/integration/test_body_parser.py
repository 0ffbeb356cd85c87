"""laned's body parser (laned.adapters.body_parser): a large body's `model` read in a worker
process, as the core's peek reads it; a worker that dies is replaced, its body refused."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from laned.adapters.body_parser import INLINE, BodyParser
from laned.core.request_body import peek
from laned.errors import BodyParserLost, BodyTooDeep


def test_a_large_body_is_read_in_a_worker_as_the_core_reads_it() -> None:
    async def scenario() -> None:
        parser = BodyParser(workers=1)
        try:
            small = json.dumps({"model": "m", "stream": True}).encode()
            assert await parser.peek(small) == peek(small)
            assert parser._all == []  # a small body starts no worker
            large = json.dumps({"prompt": "é" * INLINE, "model": "m", "stream": True}).encode()
            assert await parser.peek(large) == peek(large)
            assert await parser.peek(bytearray(large)) == peek(large)
            (worker,) = parser._all
            assert worker.process is not None and worker.process.returncode is None
            with pytest.raises(BodyTooDeep):
                await parser.peek(b'{"model": "m", "p": ' + b"[" * INLINE + b"}")
            # A worker that dies while it reads a body: that body is refused (never read on
            # laned's loop instead), the next one gets a new worker.
            first = worker.process.pid
            huge = json.dumps({"model": "m", "prompt": list(range(2_000_000))}).encode()
            reading = asyncio.ensure_future(parser.peek(huge))
            await asyncio.sleep(0)  # it has begun writing the body to the worker's pipe
            os.kill(first, signal.SIGKILL)
            with pytest.raises(BodyParserLost) as lost:
                await reading
            assert "died" in lost.value.message
            assert await parser.peek(large) == peek(large)
            assert worker.process is not None and worker.process.pid != first
        finally:
            await parser.close()
        assert worker.process is None

    asyncio.run(scenario())
