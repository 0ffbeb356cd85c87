"""The config: one TOML file parsed into the validated, immutable models of `laned.config.model`.

`load_config()` reads a file; `parse_config()` takes text. Both report every problem
at once (`ConfigError.problems`), each naming the dotted key path, the bad value and
what is expected, then apply the semantic rules that span keys (`laned.validation.rules`).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import sys
import types
import typing
from collections.abc import Mapping
from typing import Annotated, Any, Union

from pydantic import BaseModel, ValidationError

from laned.config.base import ArgText, Duration
from laned.config.model import (
    GATES,
    Arg,
    ChecksConfig,
    Config,
    ContainerSpec,
    DaemonConfig,
    EnvVar,
    ExecSpec,
    GpuGate,
    LaneConfig,
    Needs,
    PrepareStep,
    ProbeConfig,
    Sampling,
)
from laned.config.names import podman_socket
from laned.config.ranks import check_nodes, for_host
from laned.config.secrecy import redacted
from laned.errors import ConfigError, Finding, Severity
from laned.validation.rules import check_config, check_socket_paths

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

__all__ = [
    "GATES",
    "Arg",
    "ArgText",
    "ChecksConfig",
    "Config",
    "ContainerSpec",
    "DaemonConfig",
    "Duration",
    "EnvVar",
    "ExecSpec",
    "GpuGate",
    "LaneConfig",
    "Needs",
    "PrepareStep",
    "ProbeConfig",
    "Sampling",
    "load_config",
    "parse_config",
]


def load_config(path: str, env: Mapping[str, str] | None = None) -> Config:
    """Read and validate the config at `path`; raise ConfigError listing every problem."""
    env = os.environ if env is None else env
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise ConfigError(
            path,
            [
                Finding(
                    "",
                    "no such file",
                    "create it (see config/laned.example.toml) or pass --config PATH / set LANED_CONFIG",
                )
            ],
        ) from None
    except OSError as exc:
        raise ConfigError(path, [Finding("", f"cannot read: {exc.strerror}")]) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(path, [Finding("", f"not UTF-8 text ({exc.reason})")]) from exc
    config = parse_config(text, source=path, env=env)
    problems = linked_away(config, env) + linked_secrets(config)
    # The runtime directory the user manager gives the lanes' units (its sockets' paths).
    runtime = env.get("XDG_RUNTIME_DIR") or f"/run/user/{os.getuid()}"
    problems += check_socket_paths(config, runtime, podman_socket(config, env, os.getuid()))
    if problems:
        raise ConfigError(path, problems)
    return config


WRITTEN = {"unit_dir": "units", "bin_dir": "serve wrappers"}  # the dirs laned writes into


def linked_away(config: Config, env: Mapping[str, str]) -> list[Finding]:
    """A directory laned writes into, named inside the user's own places (HOME,
    XDG_RUNTIME_DIR), that a symlink leads out of them: laned would write its units or
    wrappers somewhere the config does not say (a link to /etc/systemd/user, to another
    user's directory). A directory named outside them is the operator's explicit choice."""
    own = [d for d in (env.get("HOME"), env.get("XDG_RUNTIME_DIR")) if d and d != "/"]
    own += [os.path.realpath(d) for d in own]

    def inside(path: str) -> bool:
        return any(path == d or path.startswith(d.rstrip("/") + "/") for d in own)

    problems = []
    for key, what in WRITTEN.items():
        path = os.path.normpath(getattr(config.daemon, key))
        real = os.path.realpath(path)
        if inside(path) and not inside(real):
            problems.append(
                Finding(
                    f"daemon.{key}",
                    f"{path} leads through a symlink to {real}, outside your home: laned "
                    f"would write its {what} there",
                    f"point daemon.{key} at a directory of your own, or remove the link",
                )
            )
    return problems


def linked_secrets(config: Config) -> list[Finding]:
    """A lane's secrets file that is a symbolic link: systemd reads whatever file it leads
    to (`EnvironmentFile=` follows it) into the engine's environment, /etc/shadow or another
    user's file as well as the user's own, and a `chmod 600` of the link changes that file.
    Refused here, so that `laned validate`, `laned serve` and a reload say so; preflight and
    the start gate refuse a link put in its place later (laned.preflight.rules.not_held)."""
    problems = []
    for lane, spec in sorted(config.lanes.items()):
        for key in ("secrets_file", "api_key_file"):
            path = getattr(spec, key)
            if path and os.path.islink(path):
                real = os.path.realpath(path)
                problems.append(
                    Finding(
                        f"lanes.{lane}.{key}",
                        f"{path} is a symbolic link to {real}: systemd would read that file "
                        "as the engine's environment",
                        f'name the file itself ({key} = "{real}", if it is yours and mode '
                        "0600), or put a copy of it in place of the link",
                    )
                )
    return problems


def parse_config(
    text: str, source: str = "<config>", env: Mapping[str, str] | None = None
) -> Config:
    """Parse TOML text into a Config; raise ConfigError listing every problem."""
    env = os.environ if env is None else env
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            source, [Finding("", f"not valid TOML: {exc}", "check quoting and brackets there")]
        ) from exc
    try:
        # The environment and the host name are read here, and handed to the model.
        config = Config.model_validate(data, context={"env": env, "hostname": os.uname().nodename})
    except ValidationError as exc:
        problems = [_problem_from(err, data) for err in exc.errors()]
        raise ConfigError(source, _redacted(problems)) from None
    except ValueError as exc:  # e.g. $XDG_RUNTIME_DIR used but unset
        raise ConfigError(source, [Finding("", str(exc))]) from None
    # A lane over several hosts is checked for every rank, then run as this host's rank.
    problems = list(check_nodes(config))
    raw, config = config, for_host(config)
    problems += [p for p in check_config(config) if not (config.elsewhere and p.where == "lanes")]
    problems += [
        Finding(
            f"lanes.{name}.nodes",
            f"runs on {', '.join(n.host for n in raw.lanes[name].nodes)}, not on this host "
            f"(daemon.host = {config.daemon.host!r}): laned here leaves it alone",
            severity=Severity.NOTE,
        )
        for name in config.elsewhere
    ]
    problems = _redacted(problems)
    if any(p.severity is Severity.ERROR for p in problems):
        raise ConfigError(source, problems)
    return config.model_copy(update={"source": source, "warnings": tuple(problems)})


def _redacted(problems: list[Finding]) -> list[Finding]:
    """No token in what laned says of a config, whatever a rule quotes (a value that is no
    `SRC:DST`, pydantic's "got ..."): each is named by its kind (laned.config.secrecy)."""
    return [
        dataclasses.replace(
            p, where=redacted(p.where), message=redacted(p.message), hint=redacted(p.hint)
        )
        for p in problems
    ]


# --- translating pydantic's errors into laned's Problems -------------------------------

_BRANCH_NAMES = {"str", "int", "float", "function-before", "function-after"}


def _dotted(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif isinstance(part, str) and (part in _BRANCH_NAMES or part[:1].isupper()):
            continue  # pydantic's names for union branches and model classes
        else:
            out += ("." if out else "") + str(part)
    return out


def _model_at(loc: tuple[int | str, ...]) -> type[BaseModel] | None:
    """The model class whose fields are allowed at `loc` (the parent of an unknown key)."""
    model: Any = Config
    annotation: Any = None
    for part in loc:
        if annotation is None:
            if not (isinstance(model, type) and issubclass(model, BaseModel)):
                return None
            if part not in model.model_fields:
                if isinstance(part, str) and part[:1].isupper():
                    continue
                return None
            annotation = model.model_fields[part].annotation
        else:
            annotation = _item_type(annotation)
        inner = _unwrap(annotation)
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            model, annotation = inner, None
    return model if annotation is None else None


def _unwrap(annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _unwrap(members[0]) if len(members) == 1 else annotation
    if origin is Annotated:
        return _unwrap(typing.get_args(annotation)[0])
    return annotation


def _item_type(annotation: Any) -> Any:
    inner = _unwrap(annotation)
    args = typing.get_args(inner)
    origin = typing.get_origin(inner)
    if origin is dict:
        return args[1]
    if origin in (tuple, list):
        return args[0]
    return None


def _problem_from(err: Any, data: Any) -> Finding:
    loc = tuple(err["loc"])
    path = _dotted(loc)
    kind = err["type"]
    value = err.get("input")
    if kind == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(loc[:-1])
        known = sorted(model.model_fields) if model else []
        known = [k for k in known if k not in ("source", "warnings")]
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
        hint = f"did you mean `{close[0]}`?" if close else ""
        if known:
            hint = (hint + " " if hint else "") + "known keys here: " + ", ".join(known)
        return Finding(path, f"unknown key `{key}`", hint)
    if kind == "missing":
        return Finding(path, "is required but missing", "add it; see docs/configuration.md")
    message = err["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    shown = repr(value) if not isinstance(value, (dict, list)) else type(value).__name__
    return Finding(path, f"{message} (got {shown})", _type_hint(kind))


def _type_hint(kind: str) -> str:
    hints = {
        "string_type": 'write it as a quoted string, e.g. "text"',
        "int_type": "write a whole number without quotes",
        "bool_type": "write true or false",
        "tuple_type": 'write a list, e.g. ["a", "b"]',
        "dict_type": 'write a table, e.g. { KEY = "value" }',
        "model_type": "write a table here",
    }
    return hints.get(kind, "see docs/configuration.md for what this key takes")
