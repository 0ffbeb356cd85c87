"""A lane unit's log from journald: followed with `journalctl -f`, or read back.

Matches both `_SYSTEMD_USER_UNIT=` (a user manager under user@.service, as on a real
host) and `_SYSTEMD_UNIT=` (a private `systemd --user`, as in the test harness).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import AsyncIterator, Iterable

from laned import proc


def _match(unit: str) -> list[str]:
    return [f"_SYSTEMD_USER_UNIT={unit}", "+", f"_SYSTEMD_UNIT={unit}"]


async def follow(
    units: Iterable[str], since: float | None = None
) -> AsyncIterator[tuple[str, str, float]]:
    """Yield (unit, message, when journald received it) for log lines of any of `units` from
    `since` (epoch seconds; default: from now), until cancelled.

    A message with a control character — tqdm's `\r` redraws — comes as a list of bytes
    in journalctl's JSON (and as "[blob data]" in its text output without --all).

    One journalctl process serves every lane for the supervisor's whole life. Starting
    from a time, not from "the end", keeps the lines an engine writes while journalctl is
    still starting: a start laned makes right away would otherwise lose its first phases.
    """
    journalctl = shutil.which("journalctl")
    names = list(units)
    if journalctl is None or not names:
        return
    matches: list[str] = []
    for unit in names:
        matches += [*(["+"] if matches else []), *_match(unit)]
    process = await proc.start(
        # --all: without it journalctl's JSON gives a field over 4096 bytes as null, and a
        # closed tqdm bar (DeepGEMM's warmup redraws thousands of times) is far longer.
        [journalctl, "--follow", f"--since=@{time.time() if since is None else since:.6f}",
         "--output=json", "--all", "--no-pager", *matches],
        limit=1024 * 1024,
    )  # fmt: skip
    async for raw in proc.lines(process):
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        unit = record.get("_SYSTEMD_USER_UNIT") or record.get("_SYSTEMD_UNIT") or ""
        message = record.get("MESSAGE", "")
        if isinstance(message, list):  # journald's form for unprintable or non-UTF-8 text
            message = bytes(message).decode("utf-8", errors="replace")
        try:
            at = int(record["__REALTIME_TIMESTAMP"]) / 1e6
        except (KeyError, ValueError, TypeError):
            at = time.time()
        yield str(unit), str(message), at


async def tail(unit: str, lines: int) -> list[str]:
    """The unit's last `lines` log lines."""
    journalctl = shutil.which("journalctl")
    if journalctl is None:
        return []
    out = await proc.output(
        [journalctl, f"--lines={lines}", "--output=short-iso", "--no-pager", *_match(unit)]
    )
    return out.splitlines()
