"""The adapter behind `laned validate --engine-flags`: runs the engine's own argument parser
in a lane's Python or image (vLLM, SGLang), or its program's --help (llama-server), and reads
the flags it accepts (laned.validation.engine_flags judges them; laned.engines say how)."""

from __future__ import annotations

import os

from laned.adapters import commands
from laned.errors import CommandFailed, EngineParserFailed
from laned.validation.engine_flags import KnownFlags, Source, parse_probe

# Importing vLLM imports torch: seconds on a warm page cache, a minute on a cold one.
PROBE_TIMEOUT = 300.0
# No hub, no usage report (with the engine's own variables for it): only the parser is built.
QUIET = {"HF_HUB_OFFLINE": "1", "DO_NOT_TRACK": "1"}


def read_flags(source: Source, podman: str = "podman") -> KnownFlags:
    """The option strings the engine at `source` accepts (blocking). Raises
    EngineParserFailed when the interpreter, the program or the image cannot run the probe."""
    probe = source.profile.flag_probe
    quiet = {**QUIET, **probe.env}
    tail = ["-c", probe.script] if probe.script is not None else list(probe.help)
    if source.python is not None:
        argv = [source.python, *tail]
    elif source.program is not None:
        argv = [source.program, *tail]
    else:
        assert source.image is not None
        env = [part for key, value in quiet.items() for part in ("-e", f"{key}={value}")]
        # --pull=never: checking flags never downloads an image of tens of GB. A Python
        # probe runs python3 in it; a help probe its own entrypoint (llama.cpp's images').
        entry = ["--entrypoint", "python3"] if probe.script is not None else []
        run = [podman, "run", "--rm", "--pull=never", "--network=none"]
        argv = [*run, *env, *entry, source.image, *tail]
    try:
        text = commands.run(argv, {**os.environ, **quiet}, timeout=PROBE_TIMEOUT)
    except CommandFailed as exc:
        # Its message names the whole command, the probe script included: say what failed.
        what = (
            exc.message.rsplit(" exited with ", 1)[-1]
            if " exited with " in exc.message
            else exc.message
        )
        raise EngineParserFailed(
            f"{source}: {source.profile.title}'s argument parser did not run ({what})", exc.hint
        ) from exc
    return parse_probe(text, source)
