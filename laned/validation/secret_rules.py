"""Secrets written into a lane's config, found by the rules of the programs that would read
them. Pure: LaneConfig in, Findings out.

From the config a secret reaches the wrapper, the unit or an argv (/proc/PID/cmdline, which
every local user reads) at every start. Each is an error at its key path, with the file to
move it to, and never with its value (laned.config.secrecy says what a secret looks like):

- `env` (each rank's too): a name that looks secret (`secret = false` says it is none), a
  `*_KEY` name with a value that looks random, and a value that holds a well-known token,
  whatever `secret` says;
- `values`: a placeholder named like a secret (its value fills the argv);
- the engine's argv (`args`, each rank's, the exec or container command): a flag whose value
  is a secret as the lane's engine reads it (EngineProfile.secret_flags: laned.engines);
- a command's `env NAME=VALUE` head (exec, container, prepare steps), as GNU env reads it
  (laned.config.command.env_assignments);
- `container.podman_args`, read as podman reads them (laned.config.podman_options): `-e`,
  `--env`, `--env-merge` NAME=VALUE that holds a secret; `--label`, `--annotation`,
  `--log-opt` KEY=VALUE with a secret-looking key or a token; `--env-file` (a warning);
- the second net, over everything else: a word of an argv that sets a secret-looking
  NAME=VALUE inside it (`sh -c "HF_TOKEN=... vllm"`), and any string of the lane that holds
  a well-known token (laned.config.secrecy.TOKEN_SHAPES), at its key path.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from itertools import chain
from typing import Any

from laned import engines
from laned.config.command import env_assignments
from laned.config.model import LaneConfig
from laned.config.podman_options import ENV_OPTIONS, PAIR_OPTIONS, read_options
from laned.config.secrecy import (
    TOKEN_NAMES,
    assigned_secret,
    holds_secret,
    looks_secret,
    secrets_file_line,
    token_kind,
)
from laned.engines.profile import secret_words
from laned.errors import Finding, Severity


def check_secrets(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """Every secret in the lane's config outside its secrets file (see the module's docstring);
    the second net says nothing of a place already refused."""
    refused: list[str] = []
    named = chain(
        _env_tables(base, lane),
        _values(base, lane),
        _engine_flags(base, lane),
        _env_heads(base, lane),
        _podman_args(base, lane),
    )
    for finding in named:
        if finding.severity is Severity.ERROR:
            refused.append(finding.where)
        yield finding
    for finding in _second_net(base, lane):
        if not any(finding.where == w or finding.where.startswith(w + "[") for w in refused):
            refused.append(finding.where)
            yield finding


def secret_in_config(
    base: str,
    lane: LaneConfig,
    where: str,
    name: str,
    *,
    flag: str | None = None,
    message: str | None = None,
    exempt: bool = False,
) -> Finding:
    """A secret written into the config at `where`, to be the line `name=...` of the lane's
    secrets file. `flag`: the engine flag that carried it (the engine reads `name` from its
    environment instead, or from the file laned's wrapper writes: laned.engines); `exempt`:
    an `env` entry, which `secret = false` may declare no secret."""
    profile = engines.for_lane(lane)
    file = _secrets_file(base, lane)
    if flag is not None:
        if profile.key_file is not None and name == profile.api_key_env:
            how = f"laned hands it to {profile.title} in a 0600 file ({profile.key_file[0]})"
        else:
            how = f"{profile.title} reads {name} from its environment, where laned puts it by name only"
        return Finding(
            where,
            message or f"{flag} puts a secret in the engine's argv",
            f"remove it and its value here and write the line {secrets_file_line(name)} in the "
            f"lane's secrets file (mode 0600) {file}: {how}",
        )
    unless = f'. If it is no secret: {name} = {{ value = "...", secret = false }}' if exempt else ""
    return Finding(
        where,
        message
        or f"{name} looks like a secret: its value would be in the wrapper and in podman's argv",
        f"move the line {secrets_file_line(name)} into the lane's secrets file (mode 0600) "
        f"{file} and remove it here; laned passes it by name only{unless}",
    )


def _secrets_file(base: str, lane: LaneConfig) -> str:
    """The lane's secrets file, for hints: its path and key, or the one to create."""
    file = lane.secrets_path or f"~/.config/laned/{base.removeprefix('lanes.')}.env"
    key = f"{base}.{lane.secrets_key}"
    return f"{file} ({key})" if lane.secrets_path else f"{file}, set as {key}"


def _env_tables(base: str, lane: LaneConfig) -> Iterator[Finding]:
    tables = [(f"{base}.env", lane.env)]
    tables += [(f"{base}.rank.{rank}.env", r.env) for rank, r in lane.rank.items()]
    for table, env in tables:
        for key, var in env.items():
            where = f"{table}.{key}"
            if (kind := token_kind(var.value)) is not None:
                # A token is a secret whatever its name: `secret = false` does not say otherwise.
                where_it_goes = "it would be in the wrapper and in podman's argv"
                message = f"{key}'s value is shaped like {kind}: {where_it_goes}"
                yield secret_in_config(base, lane, where, key, message=message)
            elif var.secret is not False and holds_secret(key, var.value):
                yield secret_in_config(base, lane, where, key, exempt=True)


def _values(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """A placeholder's value fills the engine's argv: none may be named like a secret."""
    tables = [(f"{base}.values", lane.values)]
    tables += [(f"{base}.rank.{rank}.values", r.values) for rank, r in lane.rank.items()]
    for table, values in tables:
        for key in values:
            if looks_secret(key):
                fills = f"its value would fill ${{{key}}} in the engine's argv"
                message = f"{key} looks like a secret: {fills}"
                yield secret_in_config(base, lane, f"{table}.{key}", key, message=message)


def _engine_words(base: str, lane: LaneConfig) -> list[list[tuple[str, str]]]:
    """The engine's argv words as the lane gives them, each with its key path: the command's
    then `args` (one run), and each rank's `args` (a run of its own)."""
    run: list[tuple[str, str]] = []
    if lane.exec is not None:
        run += [(f"{base}.exec.command[{i}]", w) for i, w in enumerate(lane.exec.command)]
    elif lane.container is not None:
        run += [(f"{base}.container.command[{i}]", w) for i, w in enumerate(lane.container.command)]
    run += [(f"{base}.args[{i}]", w) for i, a in enumerate(lane.args) for w in a.argv()]
    runs = [run]
    for rank, table in lane.rank.items():
        runs.append(
            [
                (f"{base}.rank.{rank}.args[{i}]", w)
                for i, a in enumerate(table.args)
                for w in a.argv()
            ]
        )
    return runs


def _engine_flags(base: str, lane: LaneConfig) -> Iterator[Finding]:
    profile = engines.for_lane(lane)
    for run in _engine_words(base, lane):
        for i, flag, _ in secret_words(profile.secret_flags, [w for _, w in run]):
            where = run[i][0]
            if flag.env is not None:
                yield secret_in_config(base, lane, where, flag.env, flag=flag.flag)
            else:
                yield Finding(
                    where,
                    f"{flag.flag} puts a secret in the engine's argv",
                    f"remove it and its value here: {flag.instead}",
                )


def _commands(base: str, lane: LaneConfig) -> Iterator[list[tuple[str, str]]]:
    """Every command laned runs for the lane, each word with its key path."""
    if lane.exec is not None:
        yield [(f"{base}.exec.command[{i}]", w) for i, w in enumerate(lane.exec.command)]
    if lane.container is not None:
        c = lane.container
        head = [(f"{base}.container.entrypoint", c.entrypoint)] if c.entrypoint else []
        yield head + [(f"{base}.container.command[{i}]", w) for i, w in enumerate(c.command)]
    for j, step in enumerate(lane.prepare):
        yield [(f"{base}.prepare[{j}].command[{i}]", w) for i, w in enumerate(step.command)]


def _env_heads(base: str, lane: LaneConfig) -> Iterator[Finding]:
    for command in _commands(base, lane):
        for i, name, value in env_assignments([w for _, w in command]):
            if holds_secret(name, value):
                message = f"`env {name}=...` puts a secret in the command's argv"
                yield secret_in_config(base, lane, command[i][0], name, message=message)


def _podman_args(base: str, lane: LaneConfig) -> Iterator[Finding]:
    if lane.container is None:
        return
    where = f"{base}.container.podman_args"
    options, _ = read_options(lane.container.podman_args)
    for option in options:
        name, has_value, value = (option.value or "").partition("=")
        if option.name in ENV_OPTIONS and has_value and holds_secret(name, value):
            kind = token_kind(value)
            said = f"{option.spelled} {name}=... puts {kind or 'a secret'} in podman's argv"
            plain = option.name == "--env" and kind is None and looks_secret(name)
            yield secret_in_config(base, lane, where, name, message=None if plain else said)
        elif option.name in PAIR_OPTIONS and (looks_secret(name) or token_kind(value)):
            yield Finding(
                where,
                f"{option.spelled} {name}=... puts a secret in podman's argv and in `podman "
                "inspect`",
                f"remove it: a {option.name.lstrip('-')} hands the engine nothing. A secret the "
                f"engine reads goes in the lane's secrets file (mode 0600) "
                f"{_secrets_file(base, lane)}, by name only",
            )
        elif option.name == "--env-file":
            yield Finding(
                where,
                "--env-file hands podman a file laned does not check (mode, names)",
                f"put its lines in the lane's secrets file ({base}.secrets_file, mode 0600): "
                "laned passes each name to the container by name only",
                Severity.WARNING,
            )


def _second_net(base: str, lane: LaneConfig) -> Iterator[Finding]:
    """A secret-looking NAME=VALUE inside any argv word, then a token in any string of the
    lane, each at its key path."""
    for command in chain(
        _engine_words(base, lane), _commands(base, lane), [_podman_words(base, lane)]
    ):
        for where, word in command:
            if (name := assigned_secret(word)) is not None:
                yield secret_in_config(
                    base, lane, where, name, message=f"sets {name}=... inside an argv word"
                )
    profile = engines.for_lane(lane)
    dumped = lane.model_dump(exclude={"secrets_file", "api_key_file", "secrets"})
    for where, text in _strings(dumped, base):
        if (kind := token_kind(text)) is not None:
            yield Finding(
                where,
                f"holds {kind}, which would reach the wrapper, the unit or an argv at every start",
                f"remove it here and write the line NAME=<the value> in the lane's secrets file "
                f"(mode 0600) {_secrets_file(base, lane)}, NAME being the variable it is read by "
                f"({TOKEN_NAMES[kind]}; the engine's own API key: {profile.api_key_env}): laned "
                "passes each name in that file by name only",
            )


def _podman_words(base: str, lane: LaneConfig) -> list[tuple[str, str]]:
    if lane.container is None:
        return []
    return [(f"{base}.container.podman_args", w) for w in lane.container.podman_args]


# A key path inside an `args` item or an `env` entry is the item's or the entry's own.
_INSIDE = re.compile(r"(\.args\[\d+\]|\.env\.[^.\[]+)\.(?:flag|value|why|secret)$")


def _strings(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """Every string in a dumped config (keys too), with its key path."""
    if isinstance(value, str):
        yield _INSIDE.sub(r"\1", path), value
    elif isinstance(value, Mapping):
        for key, item in value.items():
            yield f"{path}.{key}", str(key)
            yield from _strings(item, f"{path}.{key}")
    elif isinstance(value, Sequence):
        for i, item in enumerate(value):
            yield from _strings(item, f"{path}[{i}]")
