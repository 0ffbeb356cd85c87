"""A lane's weight-cache daemon (vLLM's `vllm preload`), asked over its sockets: how much GPU
memory its ranks hold (get_memory, vllm/model_executor/model_loader/weight_cache/daemon.py).
One socket per GPU in the lane's socket directory; the wire is laned.engines.vllm's (a length,
then a pickle: laned writes a plain dict and reads the answer back as plain data only).
Blocking: call it off the loop."""

from __future__ import annotations

import glob
import os
import pickle
import socket

from laned.engines.vllm_preload import WC_LENGTH, WC_MAX, wc_message, wc_read

TIMEOUT = 2.0  # seconds per rank: a daemon answers get_memory at once


def _ask(path: str, message: dict[str, object]) -> object:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(TIMEOUT)
        conn.connect(path)
        conn.sendall(wc_message(message))
        (length,) = WC_LENGTH.unpack(_exactly(conn, WC_LENGTH.size))
        if length > WC_MAX:
            raise ValueError(f"an answer of {length} bytes")
        return wc_read(_exactly(conn, length))


def _exactly(conn: socket.socket, size: int) -> bytes:
    buffer = bytearray()
    while len(buffer) < size:
        chunk = conn.recv(size - len(buffer))
        if not chunk:
            raise ConnectionError("the daemon closed the connection")
        buffer += chunk
    return bytes(buffer)


def held_said(directory: str, pattern: str) -> dict[str, object] | None:
    """What each of the daemon's sockets in `directory` that match `pattern` says its rank
    holds on its GPU (`memory_bytes`, as it came: whatever answers on a socket there may say
    anything, and laned.engines.footprints.held_of judges it), by the socket's name; None where
    none answers (no daemon, or not ready yet)."""
    said: dict[str, object] = {}
    for path in sorted(glob.glob(os.path.join(directory, pattern))):
        try:
            answer = _ask(path, {"cmd": "get_memory"})
        except (OSError, ValueError, EOFError, pickle.UnpicklingError):
            continue
        if isinstance(answer, dict) and answer.get("status") == "ok":
            said[os.path.basename(path)] = answer.get("memory_bytes")
    return said or None
