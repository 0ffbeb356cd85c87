"""Test helpers: waiting on conditions with deadlines, free ports, processes, journals."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from bench.common import free_port as free_port  # one port ledger for tests and benches
from laned.engines.vllm import read_line

ROOT = Path(__file__).resolve().parent.parent
T = TypeVar("T")


def wait_until(predicate: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Poll `predicate` until it returns something truthy; fail with `what` at the deadline."""
    deadline = time.monotonic() + timeout
    last_error: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # the condition may raise until it holds
            last_error = exc
        time.sleep(interval)
    raise AssertionError(
        f"timed out after {timeout}s waiting for {what} (last error: {last_error!r})"
    )


def alive(pid: int | str) -> bool:
    """The process exists and is not a zombie (PID 1 here may never reap it)."""
    try:
        state = Path(f"/proc/{str(pid).strip()}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port."""
    with socket.socket() as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def run(argv: list[str], check: bool = True, **kw: object) -> subprocess.CompletedProcess[str]:
    """Run a command (argv, no shell) with output captured; show it when it fails."""
    result = subprocess.run(argv, text=True, capture_output=True, stdin=subprocess.DEVNULL, **kw)  # type: ignore[call-overload]
    if check and result.returncode != 0:
        raise AssertionError(
            f"{argv} exited {result.returncode}:\n{result.stdout}\n{result.stderr}"
        )
    return result  # type: ignore[no-any-return]


def journal(unit: str, lines: int = 200) -> str:
    """A unit's log from journald (matches both the private manager's and a real one's field)."""
    result = run(
        [
            "journalctl",
            "--no-pager",
            "-o",
            "short-precise",
            "--all",  # lines with tqdm's \r redraws in full, not "[blob data]"
            "-n",
            str(lines),
            f"_SYSTEMD_UNIT={unit}",
            "+",
            f"_SYSTEMD_USER_UNIT={unit}",
        ],
        check=False,
    )
    return result.stdout + result.stderr


def sim_env(**extra: str) -> dict[str, str]:
    """The environment for a simulator subprocess, with LANED_SIM_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANED_SIM_")}
    env.update(extra)
    return env


def parse_phase(line: str) -> tuple[str, float | None] | None:
    """The phase a line announces, with its percent (laned.engines.vllm.read_line)."""
    seen = read_line(line)
    return None if seen is None or seen.phase is None else (seen.phase, seen.progress)


def argv_holding(text: str) -> list[int]:
    """The processes on this machine whose argv holds `text` (a secret: there must be none)."""
    found = []
    for proc in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError):
            if text.encode() in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
    return found
