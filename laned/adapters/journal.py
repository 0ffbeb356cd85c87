"""A lane unit's log from journald: followed with `journalctl -f`, or read back.

Matches both `_SYSTEMD_USER_UNIT=` (a user manager under user@.service, as on a real
host) and `_SYSTEMD_UNIT=` (a private `systemd --user`, as in the test harness).
"""

from __future__ import annotations

import asyncio
import errno
import json
import shutil
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterable

from laned.adapters import commands
from laned.errors import JournalUnavailable

OPENED_AFTER = 1.0  # seconds journalctl must run to count as following
HINT = (
    "install systemd's journalctl, check that journald runs and that this user may read its journal"
)


SOCKET = "/run/systemd/journal/socket"  # journald's native socket (where units' logs go)


def journald_down(path: str = SOCKET) -> str | None:
    """Why journald is not running: its socket is there and nobody answers it (journald died
    and left it). None otherwise: it answers (or PID 1 holds the socket for it), there is no
    journal at all (journalctl says so), or it cannot be told. A datagram connect sends
    nothing, so journald logs nothing for it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(path)
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return f"journald is not running ({path} refuses connections)"
    return None


def journalctl() -> str:
    """journalctl's path; JournalUnavailable when there is none."""
    path = shutil.which("journalctl")
    if path is None:
        raise JournalUnavailable("journalctl is not on laned's PATH", HINT)
    return path


def _match(unit: str) -> list[str]:
    return [f"_SYSTEMD_USER_UNIT={unit}", "+", f"_SYSTEMD_UNIT={unit}"]


async def follow(
    units: Iterable[str], since: float | None = None, opened: Callable[[], None] | None = None
) -> AsyncIterator[tuple[str, str, float]]:
    """Yield (unit, message, when journald received it) for log lines of any of `units` from
    `since` (epoch seconds; default: from now), until cancelled.

    A message with a control character — tqdm's `\r` redraws — comes as a list of bytes
    in journalctl's JSON (and as "[blob data]" in its text output without --all).

    `opened` is called once journalctl runs; JournalUnavailable is raised when it is missing
    or ends at once (no journal to read), and when it ends later.

    One journalctl process serves every lane for the supervisor's whole life. Starting
    from a time, not from "the end", keeps the lines an engine writes while journalctl is
    still starting: a start laned makes right away would otherwise lose its first phases.
    """
    names = list(units)
    if not names:
        return
    matches: list[str] = []
    for unit in names:
        matches += [*(["+"] if matches else []), *_match(unit)]
    process = await commands.start(
        # --all: without it journalctl's JSON gives a field over 4096 bytes as null, and a
        # closed tqdm bar (DeepGEMM's warmup redraws thousands of times) is far longer.
        [
            journalctl(),
            "--follow",
            f"--since=@{time.time() if since is None else since:.6f}",
            "--output=json",
            "--all",
            "--no-pager",
            *matches,
        ],
        limit=1024 * 1024,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdout is not None
    if opened is not None:  # still running a moment later: it follows
        timer = asyncio.get_running_loop().call_later(
            OPENED_AFTER, lambda: opened() if process.returncode is None else None
        )
    try:
        while raw := await process.stdout.readline():
            record = _record(raw)
            if record is not None:
                yield record
        # journalctl ended: without journal files (journald absent) it does so at once.
        _, err = await process.communicate()
        why = err.decode(errors="replace").strip().splitlines()
        raise JournalUnavailable(
            f"journalctl ended with status {process.returncode}" + (f": {why[-1]}" if why else ""),
            HINT,
        )
    finally:
        if opened is not None:
            timer.cancel()
        if process.returncode is None:
            process.kill()
            await process.communicate()  # reaped, its pipes closed


def _record(raw: bytes) -> tuple[str, str, float] | None:
    """(unit, message, when journald received it) of one line of journalctl's JSON."""
    try:
        record = json.loads(raw)
    except ValueError:
        return None
    unit = record.get("_SYSTEMD_USER_UNIT") or record.get("_SYSTEMD_UNIT") or ""
    message = record.get("MESSAGE", "")
    if isinstance(message, list):  # journald's form for unprintable or non-UTF-8 text
        message = bytes(message).decode("utf-8", errors="replace")
    try:
        at = int(record["__REALTIME_TIMESTAMP"]) / 1e6
    except (KeyError, ValueError, TypeError):
        at = time.time()
    return str(unit), str(message), at


async def tail(unit: str, lines: int) -> list[str]:
    """The unit's last `lines` log lines (JournalUnavailable without journalctl)."""
    out = await commands.output(
        [journalctl(), f"--lines={lines}", "--output=short-iso", "--no-pager", *_match(unit)]
    )
    return out.splitlines()
