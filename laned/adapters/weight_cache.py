"""A lane's weight-cache daemon (its engine's: vLLM's `vllm preload`), asked over its sockets
how much GPU memory its ranks hold. One socket per GPU in the lane's socket directory; the
wire is the engine profile's (laned.engines.profile.Wire: vLLM's is a length, then a pickle,
which laned writes of plain data and reads back as plain data only). Blocking: call it off
the loop."""

from __future__ import annotations

import glob
import os
import socket

from laned.engines.profile import WeightCacheApi, Wire

TIMEOUT = 2.0  # seconds per rank: a daemon answers at once


def _ask(path: str, wire: Wire) -> object:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT)
        conn.connect(path)
        conn.sendall(wire.ask)
        (length,) = wire.header.unpack(_exactly(conn, wire.header.size))
        if length > wire.largest:
            raise ValueError(f"an answer of {length} bytes")
        return wire.read(_exactly(conn, length))


def _exactly(conn: socket.socket, size: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        chunk = conn.recv(size - len(buffer))
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        buffer += chunk
    return bytes(buffer)


def held_said(directory: str, cache: WeightCacheApi) -> dict[str, object] | None:
    """What each of the daemon's sockets in `directory` (`cache.socket_glob`) says its rank
    holds on its GPU (as it came: whatever answers on a socket there may say anything, and
    laned.engines.footprints.held_of judges it), by the socket's name; None where none
    answers (no daemon, or not ready yet)."""
    said: dict[str, object] = {}
    for path in sorted(glob.glob(os.path.join(directory, cache.socket_glob))):
        try:
            answered, held = cache.wire.held(_ask(path, cache.wire))
        except (OSError, ValueError):
            continue
        if answered:
            said[os.path.basename(path)] = held
    return said or None
