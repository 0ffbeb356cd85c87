"""A lane's engine flags checked against an installed vLLM's own argument parser, pure.

`laned validate --engine-flags` runs PARSER_PROBE in the lane's Python (an exec lane's
interpreter, or `--python`) or in its image (podman), and compares every flag the lane's
engine would get with the option strings `vllm serve` accepts there. An unknown flag is a
warning with the nearest known one: a lane may target a newer vLLM than the one installed.

vLLM reads flags loosely (vllm/utils/argparse_utils.py, FlexibleArgumentParser.parse_args):
`--max_model_len` is `--max-model-len`, `--compilation-config.mode` sets a key of
`--compilation-config`, `-O3` is `--optimization-level 3`; the same rules apply here.
"""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from laned.config.model import Config, LaneConfig
from laned.errors import EngineParserFailed, Finding, Severity

# Runs in the target Python: prints vLLM's version and every option string of the parser
# `vllm serve` builds (vllm/entrypoints/cli/serve.py: make_arg_parser). Module paths moved
# between releases; both the 0.32 and the older ones are tried.
PARSER_PROBE = """
import json
try:
    from vllm.utils.argparse_utils import FlexibleArgumentParser
except ImportError:
    from vllm.utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
except ImportError:
    from vllm.entrypoints.openai.cli_args import make_arg_parser
import vllm
parser = make_arg_parser(FlexibleArgumentParser())
flags = sorted({o for a in parser._actions for o in a.option_strings})
version = getattr(vllm, "__version__", "unknown")
print(json.dumps({"version": version, "flags": flags, "abbrev": parser.allow_abbrev}))
"""

NUMBER = re.compile(r"^-\d")


@dataclass(frozen=True)
class Source:
    """Where a lane's vLLM is: an interpreter on this host, or an image (run with podman)."""

    python: str | None = None
    image: str | None = None

    def __str__(self) -> str:
        return self.python or f"image {self.image}"


@dataclass(frozen=True)
class KnownFlags:
    """The option strings one vLLM accepts."""

    version: str
    flags: frozenset[str]
    source: Source
    abbrev: bool = True  # argparse takes an unambiguous prefix of a long flag

    def expand(self, flag: str) -> str | None:
        """The one long flag `flag` abbreviates here; None when none or several."""
        if not self.abbrev or not flag.startswith("--"):
            return None
        longer = [f for f in self.flags if f.startswith(flag)]
        return longer[0] if len(longer) == 1 else None


def _program(command: Sequence[str]) -> int | None:
    """Where the engine's program is in an exec command: the first Python or `vllm`
    (a wrapper before it, as `taskset -c 0 python -m ...`, is not the engine's)."""
    for i, word in enumerate(command):
        name = word.rsplit("/", 1)[-1]
        if name.startswith("python") or name == "vllm":
            return i
    return None


def is_vllm(spec: LaneConfig) -> bool:
    """Whether a lane runs vLLM (its command or image names it)."""
    if spec.exec is not None:
        return any("vllm" in part for part in spec.exec.command)
    c = spec.container
    assert c is not None
    return any("vllm" in part for part in (c.image, c.entrypoint or "", *c.command[:2]))


def source_of(spec: LaneConfig, python: str | None) -> Source | None:
    """Where to read the lane's flags from: `python` when given, else an exec lane's own
    interpreter (a `vllm` console script's sibling `python`), else its image."""
    if python:
        return Source(python=python)
    if spec.exec is not None:
        at = _program(spec.exec.command)
        program = "" if at is None else spec.exec.command[at]
        if program.rsplit("/", 1)[-1].startswith("python"):
            return Source(python=program)
        if "/" in program:  # a `vllm` script: its venv's python
            return Source(python=program.rsplit("/", 1)[0] + "/python")
        return None
    assert spec.container is not None
    return Source(image=spec.container.image)


def parse_probe(text: str, source: Source) -> KnownFlags:
    """PARSER_PROBE's output (its last line), checked."""
    try:
        data = json.loads(text.strip().splitlines()[-1])
        flags = frozenset(str(f) for f in data["flags"])
        version = str(data["version"])
        abbrev = bool(data.get("abbrev", True))
    except (ValueError, IndexError, KeyError, TypeError) as exc:
        raise EngineParserFailed(
            f"{source}: vLLM's argument parser gave no flag list ({exc})",
            "is vLLM installed there? `python -c 'import vllm'` says",
        ) from exc
    if not flags:
        raise EngineParserFailed(f"{source}: vLLM's argument parser has no flags", "")
    return KnownFlags(version, flags, source, abbrev)


def flag_words(config: Config, lane: str) -> Iterator[tuple[str, str]]:
    """(key path, word) of every argv word the lane's engine gets that may be a flag: the
    command after the engine's program (and after `-m module`), `args`, laned's own."""
    spec = config.lanes[lane]
    base = f"lanes.{lane}"
    if spec.exec is not None:
        command = spec.exec.command
        at = _program(command) or 0
        skip = at + (3 if tuple(command[at + 1 : at + 2]) == ("-m",) else 1)
        yield from ((f"{base}.exec.command[{i}]", w) for i, w in enumerate(command) if i >= skip)
    else:
        assert spec.container is not None
        yield from (
            (f"{base}.container.command[{i}]", w) for i, w in enumerate(spec.container.command)
        )
    for i, arg in enumerate(spec.args):
        yield f"{base}.args[{i}]", arg.flag
    if spec.sampling is not None:
        yield f"{base}.sampling", "--override-generation-config"
    yield f"{base}.port", "--port"
    yield f"{base}.served_model_name", "--served-model-name"


def normalize(word: str) -> str | None:
    """The option string vLLM's parser matches a word with; None for a word that is no flag."""
    if not word.startswith("-") or NUMBER.match(word) or word in ("-", "--"):
        return None
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
    for where, word in flag_words(config, lane):
        flag = normalize(word)
        if flag is None or flag in known.flags:
            continue
        if full := known.expand(flag):
            problems.append(
                Finding(
                    where,
                    f"{flag} abbreviates {full}: vLLM {known.version} takes it (argparse "
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
                f"{flag} is not a flag of vLLM {known.version} ({known.source})",
                hint + "a lane may target a newer vLLM than this one: check its image's "
                "`vllm serve --help`, and fix the flag if it is a typo",
                Severity.WARNING,
            )
        )
    return problems
