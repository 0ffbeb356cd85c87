"""The one way laned starts a process: argv (never a shell), an explicit environment,
stdin from /dev/null, `+ command` at debug level, and on failure the command and its
exit status in a CommandFailed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence

from laned.errors import CommandFailed

log = logging.getLogger("laned.commands")


def _env(env: Mapping[str, str] | None) -> dict[str, str]:
    return dict(os.environ if env is None else env)


def run(argv: Sequence[str], env: Mapping[str, str] | None = None, timeout: float = 30) -> str:
    """Run a command to its end and return its stdout (blocking: call it off the loop)."""
    log.debug("+ %s", shlex.join(argv))
    try:
        done = subprocess.run(
            list(argv),
            env=_env(env),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise CommandFailed(f"cannot run {shlex.join(argv)}: {exc}", "is it installed?") from exc
    if done.returncode != 0:
        raise CommandFailed(
            f"{shlex.join(argv)} exited with status {done.returncode}: {done.stderr.strip()[-300:]}"
        )
    return done.stdout


async def start(
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    stderr: int | None = asyncio.subprocess.DEVNULL,
    limit: int = 2**16,
) -> asyncio.subprocess.Process:
    """Start a command with its stdout piped (stderr: DEVNULL, or STDOUT to merge it)."""
    log.debug("+ %s", shlex.join(argv))
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            env=_env(env),
            cwd=cwd,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            limit=limit,
        )
    except OSError as exc:
        raise CommandFailed(
            f"cannot run {shlex.join(argv)}: {exc.strerror}",
            "give an absolute path to an executable",
        ) from exc


async def output(argv: Sequence[str], env: Mapping[str, str] | None = None) -> str:
    """Run a command to its end and return its stdout, decoded."""
    process = await start(argv, env)
    out, _ = await process.communicate()
    return out.decode("utf-8", errors="replace")
