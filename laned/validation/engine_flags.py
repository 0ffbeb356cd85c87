"""A lane's engine flags checked against its installed engine's own argument parser, pure.

`laned validate --engine-flags` reads the option strings the lane's engine accepts, as its
profile says (laned.engines.profile.FlagProbe: vLLM's and SGLang's parsers built in the
lane's Python, an exec lane's interpreter or `--python`, or in its image; llama-server's
own `--help`), and compares every flag the lane's engine would get with them. An unknown
flag is a warning with the nearest known one: a lane may target a newer engine than the
one installed.

vLLM reads flags loosely (vllm/utils/argparse_utils.py, FlexibleArgumentParser.parse_args):
`--max_model_len` is `--max-model-len`, `--compilation-config.mode` sets a key of
`--compilation-config`, `-O3` is `--optimization-level 3`; for vLLM lanes the same rules
apply here (FlagProbe.loose).
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from laned import engines
from laned.config.model import Config, LaneConfig
from laned.engines.profile import EngineProfile
from laned.errors import EngineParserFailed, Finding, Severity

NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class Source:
    """Where a lane's engine is: an interpreter on this host, a program on this host, or an
    image (run with podman); `engine`: which engine (laned.engines), so which probe."""

    python: str | None = None
    image: str | None = None
    program: str | None = None
    engine: str = engines.DEFAULT.name

    def __str__(self) -> str:
        return self.python or self.program or f"image {self.image}"

    @property
    def profile(self) -> EngineProfile:
        """The engine's profile."""
        return engines.ENGINES[self.engine]


@dataclass(frozen=True)
class KnownFlags:
    """The option strings one engine accepts."""

    version: str
    flags: frozenset[str]
    source: Source
    abbrev: bool = True  # argparse takes an unambiguous prefix of a long flag
    # The flags of its weight-cache daemon (vLLM's `vllm preload`); None where it has none
    daemon: frozenset[str] | None = None

    def expand(self, flag: str) -> str | None:
        """The one long flag `flag` abbreviates here; None when none or several."""
        if not self.abbrev or not flag.startswith("--"):
            return None
        longer = [f for f in self.flags if f.startswith(flag)]
        return longer[0] if len(longer) == 1 else None


def _program(command: Sequence[str], name: str) -> int | None:
    """Where the engine's program is in an exec command: the first Python or `name` (a
    wrapper before it, as `taskset -c 0 python -m ...`, is not the engine's)."""
    for i, word in enumerate(command):
        base = word.rsplit("/", 1)[-1]
        if base.startswith("python") or base == name:
            return i
    return None


def source_of(spec: LaneConfig, python: str | None) -> Source | None:
    """Where to read the lane's flags from: for an engine whose parser is Python, `python`
    when given, else an exec lane's own interpreter (a console script's sibling `python`);
    for one that prints its help (llama-server), an exec lane's program; else its image.
    None: nothing here to ask."""
    profile = engines.for_lane(spec)
    probe = profile.flag_probe
    if probe.script is not None and python:
        return Source(python=python, engine=profile.name)
    if spec.exec is not None:
        at = _program(spec.exec.command, probe.program)
        program = "" if at is None else spec.exec.command[at]
        if probe.script is None:
            return Source(program=program, engine=profile.name) if program else None
        if program.rsplit("/", 1)[-1].startswith("python"):
            return Source(python=program, engine=profile.name)
        if "/" in program:  # a console script (`vllm`, `sglang`): its venv's python
            return Source(python=program.rsplit("/", 1)[0] + "/python", engine=profile.name)
        return None
    assert spec.container is not None
    return Source(image=spec.container.image, engine=profile.name)


def parse_probe(text: str, source: Source) -> KnownFlags:
    """What the engine's probe printed, checked: a script's JSON (its last line), or the
    program's help read by its profile."""
    probe, title = source.profile.flag_probe, source.profile.title
    if probe.script is None:
        assert probe.read_help is not None
        version, found = probe.read_help(text)
        if not found:
            raise EngineParserFailed(
                f"{source}: {title}'s help lists no flags", f"does `{source} --help` run?"
            )
        return KnownFlags(version, found, source, abbrev=False)
    try:
        data = json.loads(text.strip().splitlines()[-1])
        flags = frozenset(str(f) for f in data["flags"])
        version = str(data["version"])
        abbrev = bool(data.get("abbrev", True))
        daemon = data.get("preload")
        daemon_flags = None if daemon is None else frozenset(str(f) for f in daemon)
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise EngineParserFailed(
            f"{source}: {title}'s argument parser gave no flag list ({exc})",
            f"is {title} installed there? `python -c 'import {probe.program}'` says",
        ) from exc
    if not flags:
        raise EngineParserFailed(f"{source}: {title}'s argument parser has no flags", "")
    return KnownFlags(version, flags, source, abbrev, daemon_flags)


def flag_words(config: Config, lane: str) -> Iterator[tuple[str, str]]:
    """(key path, word) of every argv word the lane's engine gets that may be a flag: the
    command after the engine's program (and after `-m module`), `args`, laned's own."""
    spec = config.lanes[lane]
    base = f"lanes.{lane}"
    profile = engines.for_lane(spec)
    if spec.exec is not None:
        command = spec.exec.command
        at = _program(command, profile.flag_probe.program) or 0
        skip = at + (3 if tuple(command[at + 1 : at + 2]) == ("-m",) else 1)
        yield from ((f"{base}.exec.command[{i}]", w) for i, w in enumerate(command) if i >= skip)
    else:
        assert spec.container is not None
        yield from (
            (f"{base}.container.command[{i}]", w) for i, w in enumerate(spec.container.command)
        )
    for i, arg in enumerate(spec.args):
        yield f"{base}.args[{i}]", arg.flag
    # laned's own flags, each under the key it comes from.
    keys = {f: k for k in ("port", "served_model_name") for f in profile.flags_for(k)}
    for why, words in profile.serve_lines(spec, base):
        for word in words:
            if word.startswith("-"):
                key = keys.get(word) or (
                    "sampling" if (why or "").startswith(f"{base}.sampling") else "engine"
                )
                yield f"{base}.{key}", word


def daemon_words(config: Config, lane: str) -> Iterator[tuple[str, str]]:
    """(key path, word) of every argv word a weight-cache lane's daemon gets after its
    subcommand: `preload --model MODEL` (vLLM's), the engine's flags that shape the weights,
    its own."""
    spec = config.lanes[lane]
    api = engines.for_lane(spec).weight_cache
    if spec.weight_cache is None or api is None:
        return
    base = f"lanes.{lane}"
    words = api.command([*spec.command_words(), *spec.arg_words()]) or []
    at = words.index(api.subcommand) + 1 if api.subcommand in words else 0
    yield from ((f"{base}.args", word) for word in words[at:])
    for _why, own in api.daemon_lines(spec, base, "/run/laned/weights"):
        yield from ((f"{base}.weight_cache", word) for word in own)


def daemon_unknown(config: Config, lane: str, known: KnownFlags) -> list[Finding]:
    """A weight-cache lane's daemon flags against its daemon's own parser (vLLM's `vllm
    preload`)."""
    spec = config.lanes[lane]
    api = known.source.profile.weight_cache
    if spec.weight_cache is None or api is None:
        return []
    title = f"{known.source.profile.title} {known.version}"
    if known.daemon is None:
        return [
            Finding(
                f"lanes.{lane}.weight_cache",
                f"{title} ({known.source}) has no `{api.daemon}`: its weight cache came in "
                f"{api.since}",
                f"run the lane on {api.since} or later, or remove weight_cache",
                Severity.WARNING,
            )
        ]
    problems = []
    for where, word in daemon_words(config, lane):
        flag = normalize(word, True)
        if flag is None or flag in known.daemon:
            continue
        problems.append(
            Finding(
                where,
                f"{flag} is not a flag of {title}'s `{api.daemon}` ({known.source}), which the "
                "lane's weight-cache daemon runs",
                f"check `{api.daemon} --help` there; see docs/weight-cache.md",
                Severity.WARNING,
            )
        )
    return problems


def normalize(word: str, loose: bool = True) -> str | None:
    """The option string the engine's parser matches a word with (vLLM's rules where
    `loose`); None for a word that is no flag."""
    if not word.startswith("-") or NUMBER.match(word) or word in ("-", "--"):
        return None
    if not loose:
        return word.split("=", 1)[0]
    if word.startswith("--"):
        key = word.split("=", 1)[0]
        return "--" + key[2:].split(".", 1)[0].replace("_", "-")
    if word.startswith("-O") and word != "-O":
        return "--optimization-level"
    return word.split("=", 1)[0]


def unknown_flags(config: Config, lane: str, known: KnownFlags) -> list[Finding]:
    """A warning for each of the lane's flags that `known` does not have, with the nearest;
    a note for an abbreviation (taken today, ambiguous once a flag with its prefix comes)."""
    problems = []
    profile = known.source.profile
    title = f"{profile.title} {known.version}"
    for where, word in flag_words(config, lane):
        flag = normalize(word, profile.flag_probe.loose)
        if flag is None or flag in known.flags:
            continue
        if full := known.expand(flag):
            problems.append(
                Finding(
                    where,
                    f"{flag} abbreviates {full}: {title} takes it (argparse "
                    "matches a prefix), a release that adds a flag with that prefix refuses it",
                    f"write {full}",
                    Severity.NOTE,
                )
            )
            continue
        near = difflib.get_close_matches(flag, sorted(known.flags), n=1, cutoff=0.6)
        hint = f"did you mean {near[0]}? " if near else ""
        problems.append(
            Finding(
                where,
                f"{flag} is not a flag of {title} ({known.source})",
                hint + f"a lane may target a newer {profile.title} than this one: check its "
                f"image's `{profile.flag_probe.program} --help`, and fix the flag if it is a typo",
                Severity.WARNING,
            )
        )
    return problems + daemon_unknown(config, lane, known)
