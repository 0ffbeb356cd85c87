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
from collections.abc import Callable, Mapping, Sequence

from laned.config.model import LaneConfig
from laned.errors import CommandFailed, LaneError

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
    stdin: int = asyncio.subprocess.DEVNULL,
) -> asyncio.subprocess.Process:
    """Start a command with its stdout piped (stderr: DEVNULL, STDOUT to merge it, or None
    for laned's own; stdin: /dev/null, or PIPE to write to it)."""
    log.debug("+ %s", shlex.join(argv))
    try:
        return await asyncio.create_subprocess_exec(
            *argv,
            env=_env(env),
            cwd=cwd,
            stdin=stdin,
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


async def run_prepare(
    lane: str, spec: LaneConfig, on_line: Callable[[str], None], cwd: str | None = None
) -> None:
    """Run the lane's `prepare` steps in order (argv, no shell); each line of output goes to
    `on_line`. A step that fails or runs past its timeout raises LaneError and stops the rest."""
    for i, step in enumerate(spec.prepare):
        where = f"lanes.{lane}.prepare[{i}]"
        on_line(f"{where}: running {' '.join(step.command)}")
        try:
            process = await start(step.command, cwd=cwd, stderr=asyncio.subprocess.STDOUT)
        except CommandFailed as exc:
            raise LaneError(f"{where}: {exc.message}", exc.hint) from exc
        assert process.stdout is not None

        async def pump(stream: asyncio.StreamReader, where: str = where) -> None:
            async for raw in stream:
                on_line(f"{where}: {raw.decode('utf-8', errors='replace').rstrip()}")

        try:
            await asyncio.wait_for(pump(process.stdout), step.timeout)
            code = await asyncio.wait_for(process.wait(), 5)
        except asyncio.TimeoutError:
            process.kill()
            await process.wait()
            raise LaneError(
                f"{where}: still running after {step.timeout:g} s; killed",
                f"raise {where}.timeout or make the step faster",
            ) from None
        if code != 0:
            raise LaneError(
                f"{where}: {' '.join(step.command)} exited with status {code}",
                "see its output in the lane's events (`laned events --lane " + lane + "`)",
            )
        on_line(f"{where}: done")
