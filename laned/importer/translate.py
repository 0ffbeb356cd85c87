"""`laned import`: a published `docker run` / `podman run` command line as a laned lane.

Pure: text in, an `Imported` lane out (rendered as TOML by `laned.importer.toml_out`). Everything
the recipe says is carried over; what rootless podman under systemd cannot take as written
is translated, each change with a note that says what and why (docs/import.md):

- `--gpus all` (Docker's NVIDIA runtime) becomes the CDI device `nvidia.com/gpu=all`;
- `--rm`, `-d`, `-i`, `-t`, `--restart`, `--pull` go: laned removes the container itself
  after reading how it ended, systemd runs it in the foreground and restarts it;
- `--shm-size` goes beside `--ipc host` (seed 000: the host's /dev/shm is used then);
- `-p` is kept for the engine's port, dropped under `--network host`;
- the engine is read from the image and command (vLLM, SGLang's `python3 -m
  sglang.launch_server` or `sglang serve`, llama.cpp's server images: laned.engines), and
  its own port and model-name flags (`--port`, `--served-model-name`, llama-server's
  `--alias`) become `port` and `served_model_name`; without a served-name flag, the name the
  engine serves its model by, and `needs.gpus`, are read by the engine's own rules
  (laned.engines: EngineProfile.model_of, gpus_of);
- a bind mount of a relative path (`-v ./models:/models`, `--mount type=bind,src=...`) is
  made absolute against the directory the recipe is taken to run from, with a warning;
- a secret (`--api-key`, `--hf-token`, `-e HF_TOKEN=...` or any name laned.config.secrecy calls
  secret, `--env-file`) leaves the argv and the TOML for a line in the lane's
  `secrets_file`, named, never with its value (a placeholder for it is never asked for);
- an option given twice is kept once.

Placeholders (`$VAR`, `${VAR}`, and `<name>` as recipes write one) that differ per node (NODE_RANK, HEAD_IP, ...) are kept as
written and reported; others take their value from `--set NAME=VALUE`; any left is an error
that names them all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from laned import engines
from laned.config.command import env_assignments, program_start
from laned.config.secrecy import (
    holds_secret,
    looks_secret,
    redacted,
    secrets_file_line,
    token_kind,
)
from laned.engines.profile import secret_words
from laned.errors import BadImport, CommandLineError
from laned.importer.cmdline import CLOSE, OPEN, PLACEHOLDER, Word, command_at
from laned.importer.run_options import (
    Imported,
    comments,
    secret,
    split_run,
    translate_options,
)

GPU_DEVICE = "nvidia.com/gpu="  # a CDI name of an NVIDIA GPU (nvidia-ctk cdi generate)
PER_NODE = ("NODE_RANK", "HEAD_IP", "NODE_IP", "MASTER_ADDR", "CX7_IF", "CX7_IB")


SHARED = ("HEAD_IP", "MASTER_ADDR")  # the same on every rank of a lane over several hosts


def import_run(
    text: str,
    name: str | None = None,
    values: Mapping[str, str] = {},
    nodes: Sequence[tuple[str, str]] = (),
    cwd: str | None = None,
) -> Imported:
    """The lane that the one `docker run` / `podman run` in `text` describes; with `nodes`
    (host, laned URL) in rank order, a lane over those hosts, its per-node placeholders
    kept for laned to fill on each rank. `cwd`: the absolute directory a relative bind
    mount (`-v ./models:/models`) is taken to be relative to (the CLI's --cwd, else its
    current directory); without it such a mount is refused."""
    try:
        out = _import_run(text, name, values, nodes, cwd)
    except CommandLineError as exc:
        # Whatever a refusal quotes of the line (a bad --port, --gpus), no token in it.
        raise type(exc)(redacted(exc.message), redacted(exc.hint)) from None
    # Nor in a note of what was dropped (the TOML's values hold none: _no_tokens).
    out.changes = [redacted(c) for c in out.changes]
    out.warnings = [redacted(w) for w in out.warnings]
    out.notes = {k: redacted(v) for k, v in out.notes.items()}
    return out


def _import_run(
    text: str,
    name: str | None,
    values: Mapping[str, str],
    nodes: Sequence[tuple[str, str]],
    cwd: str | None,
) -> Imported:
    given = [k for k in values if looks_secret(k)]
    if given:
        raise BadImport(
            f"--set {given[0]}=... puts a secret on a command line (and in shell history)",
            f"leave it out: laned import names {given[0]} as a line for the lane's secrets file "
            "(mode 0600), where you write its value",
        )
    words = [_angles(w) for w in _the_run(text)]
    options, image, rest = split_run(words)
    resolve = _Resolver({k: v for k, v in values.items() if not nodes or k not in PER_NODE})
    out = Imported(name="")
    texts = [w.text for w in rest]
    profile = engines.inferred([image.text, *texts[program_start(texts) :][:3]]) or engines.DEFAULT
    if profile is not engines.DEFAULT:
        out.lane["engine"] = profile.name
        out.notes["engine"] = f"{profile.title}, read from the recipe's image and command"
    # The engine's secrets leave its words before anything is resolved: a placeholder for a
    # secret needs no value.
    hidden = _engine_secrets(out, texts, profile)
    why = comments(rest)
    kept = [(w, why[i]) for i, w in enumerate(rest) if i not in hidden]
    engine = [
        resolve(
            w,
            f"{kept[i - 1][0].shown()} {w.shown()}"
            if i and kept[i - 1][0].text.startswith("-")
            else w.shown(),
        )
        for i, (w, _) in enumerate(kept)
    ]
    names = _engine(out, engine, [c for _, c in kept], profile)
    translate_options(out, options, resolve, resolve.values, cwd, port_flag(profile))
    # The engine's words (and its variables, which llama-server reads its model from too)
    # as its own parser reads them: laned.engines.
    argv = [*_command_words(out), *(w for f, v, _ in out.args for w in (f, v) if w is not None)]
    env = {key: value for key, (value, _) in out.env.items()}
    _model_names(out, names, profile.model_of(argv, env), profile)
    out.name = name or _lane_name(str(out.lane["served_model_name"]))
    if out.secrets or out.secret_files:
        _secrets_file(out)
    out.container = {"image": resolve(image, "the image"), **out.container}
    resolve.finish(out)
    _needs(out, profile.gpus_of(argv, env))
    _caches(out)
    if nodes:
        _nodes(out, nodes, values, profile)
    _no_tokens(out)
    short = str(out.container["image"]).rsplit("/", 1)[-1].split("@")[0]
    out.lane = {
        "description": f"{out.lane['served_model_name']} ({short}), imported",
        **out.lane,
    }
    return out


# `<name>` as recipes write a value to fill in (`-e HF_TOKEN=<secret>`, `-v <path>:/models`):
# a whole word, or a part between `=`, `:` or `/`; `<|im_start|>` and prose are left alone.
_ANGLE = re.compile(r"(?:(?<=^)|(?<=[=:/]))<([A-Za-z][A-Za-z0-9_-]*)>(?=$|[:/])")


def _angles(word: Word) -> Word:
    """A word with each `<name>` as a placeholder, like `${NAME}`."""
    text = _ANGLE.sub(lambda m: f"{OPEN}{m.group(1).upper().replace('-', '_')}{CLOSE}", word.text)
    return word if text == word.text else Word(text, word.line, word.comment)


def _secrets_file(out: Imported) -> None:
    """The lane's secrets file, named after the lane, and the lines to write in it."""
    path = f"~/.config/laned/{out.name}.env"
    out.lane["secrets_file"] = path
    lines = [f"  {secrets_file_line(n)}    (the recipe's {how})" for n, how in out.secrets.items()]
    lines += [f"  the lines of {f}    (the recipe's --env-file {f})" for f in out.secret_files]
    out.notes["secrets_file"] = "\n".join(
        [
            "the recipe's secrets, out of every argv and out of this file: create it with",
            f"`umask 077; $EDITOR {path}` and write, with your values:",
            *lines,
        ]
    )
    if out.secrets:
        out.lane["secrets"] = list(out.secrets)
        out.notes["secrets"] = "the names the secrets file must define (laned preflight checks)"


_RUN = re.compile(
    r"^\s*(?:\$\s+)?(?:sudo\s+)?(?:\S*/)?(?:docker|podman)\s+(?:container\s+)?run(?:\s|$)"
)


def _the_run(text: str) -> list[Word]:
    """The words after `run` of the one docker/podman run in the text (prose around it, as a
    recipe page has, is not read)."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if _RUN.match(line)]
    if len(starts) != 1:
        found = (
            "no" if not starts else f"{len(starts)} (lines {', '.join(str(i + 1) for i in starts)})"
        )
        raise BadImport(
            f"{found} `docker run` / `podman run` command found; one is needed",
            "give laned import the recipe's one start command (--file F, or - for stdin)",
        )
    words = command_at(lines, starts[0])
    at = next(i for i, w in enumerate(words) if w.text == "run")
    return words[at + 1 :]


class _Resolver:
    """Placeholders: per-node ones kept (and reported), the rest from --set, or an error."""

    def __init__(self, values: Mapping[str, str]) -> None:
        self.values = dict(values)
        self.unknown: dict[str, list[str]] = {}
        self.per_node: dict[str, list[str]] = {}

    def __call__(self, word: Word | str, where: str) -> str:
        text = word.text if isinstance(word, Word) else word
        for placeholder in PLACEHOLDER.findall(text):
            if placeholder in self.values:
                continue
            if placeholder in PER_NODE:
                self.per_node.setdefault(placeholder, []).append(where)
            elif placeholder != "HOME":
                self.unknown.setdefault(placeholder, []).append(where)

        def fill(match: re.Match[str]) -> str:
            placeholder = match.group(1)
            if placeholder in self.values:
                return self.values[placeholder]
            return "~" if placeholder == "HOME" else f"${{{placeholder}}}"

        return PLACEHOLDER.sub(fill, text)

    def finish(self, out: Imported) -> None:
        if self.unknown:
            named = "; ".join(f"${{{k}}} ({', '.join(v)})" for k, v in self.unknown.items())
            sets = " ".join(f"--set {k}=VALUE" for k in self.unknown)
            raise BadImport(
                f"placeholders with no value: {named}",
                f"give each a value: laned import {sets} (per-node ones laned knows: "
                f"{', '.join(PER_NODE)})",
            )
        out.per_node = self.per_node


def _engine_secrets(out: Imported, texts: list[str], profile: engines.EngineProfile) -> set[int]:
    """The words after the image that carry a secret, as the engine's parser reads them (its
    secret flags with their values: EngineProfile.secret_flags) and as `env` reads a command's
    head (NAME=VALUE that holds one): each recorded for the secrets file, or dropped with a
    warning where laned cannot hand it to the engine. Returns their indices."""
    hidden: set[int] = set()
    for i, name, value in env_assignments(texts):
        if not holds_secret(name, value):
            continue
        if texts[i] != f"{name}={value}":  # inside `env -S STRING`
            raise BadImport(
                f"`env -S` sets {name} before the engine: laned import cannot take it out of "
                "the string",
                f"write it as -e {name} in the docker run line (laned import moves it to the "
                "lane's secrets file)",
            )
        secret(out, name, f"`env {name}=...` before the engine")
        hidden.add(i)
    for i, flag, values in secret_words(profile.secret_flags, texts):
        given = texts[i].split("=", 1)[0]
        if flag.env is not None:
            secret(out, flag.env, f"engine flag {given}")
        else:
            out.warnings.append(
                f"engine flag {given} dropped (its value not copied): {flag.instead}"
            )
        hidden.update([i, *values])
    return hidden


def _engine(
    out: Imported, engine: list[str], notes: list[str], profile: engines.EngineProfile
) -> list[str]:
    """The words after the image (its secrets gone): command (`serve MODEL`, `python3 -m
    MODULE`), then `--flag [value]` pairs, read as the engine's own (laned.engines); `notes`:
    each word's comment. Returns the values of its served-name flags, which laned passes."""
    command: list[str] = []
    i = 0
    while i < len(engine) and (
        not engine[i].startswith("-")
        or (
            engine[i] == "-m"
            and command[-1:]
            and command[-1].rsplit("/", 1)[-1].startswith("python")
        )
    ):
        command.append(engine[i])
        i += 1
    pairs: list[tuple[str, str | None, str]] = []
    served = profile.flags_for("served_model_name")
    while i < len(engine):
        flag, comment, value = engine[i], notes[i], None
        if flag.startswith("--") and "=" in flag:
            flag, value = flag.split("=", 1)
        elif i + 1 < len(engine) and _is_value(engine[i + 1]):
            value = engine[i + 1]
            i += 1
        pairs.append((flag, value, comment))
        # vLLM's --served-model-name takes several (nargs "+"); the others' parsers refuse more.
        while flag in served and i + 1 < len(engine) and _is_value(engine[i + 1]):
            pairs.append((flag, engine[i + 1], comment))
            i += 1
        i += 1
    names, port, kept = [], None, []
    # The engine's weight cache (vLLM's): laned renders the daemon and the engine's flags for
    # it itself.
    cache = profile.weight_cache
    cached = cache is not None and cache.mark in [(f, v) for f, v, _ in pairs]
    if cache is not None and cached:
        mark = " ".join(cache.mark)
        out.lane["weight_cache"] = True
        out.notes["weight_cache"] = (
            f"the recipe's {mark}: laned runs the weight-cache daemon ({cache.daemon}) as a unit "
            "of its own and passes the engine its flags (docs/weight-cache.md)"
        )
        out.changes.append(
            f"{' and '.join([mark, *cache.engine_flags[1:]])} became `weight_cache = true` "
            f"(laned renders `{cache.daemon}` beside the engine)"
        )
    for flag, value, why in pairs:
        if cache is not None and cached and flag in cache.engine_flags:
            continue
        if flag in served and value is not None:
            names.append(value)
        elif flag in profile.flags_for("port") and value is not None:
            port = value
        else:
            kept.append((flag, value, why))
    out.args = kept
    out.container["command"] = command
    _port(out, port, profile)
    return names


def _command_words(out: Imported) -> list[str]:
    """The container's command words (its entrypoint's arguments before the flags)."""
    return [str(word) for word in out.container.get("command", [])]  # type: ignore[attr-defined]


def _is_value(word: str) -> bool:
    return not word.startswith("-") or bool(re.fullmatch(r"-[0-9.]+", word))


def _model_names(
    out: Imported, values: list[str], model: engines.Model | None, profile: engines.EngineProfile
) -> None:
    """served_model_name (and aliases): the served-name flag's names as the engine reads them,
    else the name the engine serves its model by (laned.engines: EngineProfile.model_of)."""
    flag = served_flag(profile)
    names = profile.served_names(values)
    if names:
        out.lane["served_model_name"] = names[0]
        out.notes["served_model_name"] = f"the recipe's {flag} (laned passes it)"
        if names[1:]:
            out.lane["aliases"] = names[1:]
            out.notes["aliases"] = f"more {flag} names: laned's endpoint routes them to this lane"
            out.changes.append(f"{flag}'s later names became `aliases`")
    elif model is not None:
        out.lane["served_model_name"] = model.served
        out.notes["served_model_name"] = f"no {flag}: {model.how} (laned passes {flag})"
    else:
        launches = [p.launch for p in engines.LISTED]
        raise BadImport(
            f"the engine's arguments name no model ({profile.title}: none of its model flags, "
            f"nor {flag})",
            f"laned import reads launches of {', '.join(launches[:-1])} and {launches[-1]}",
        )


def served_flag(profile: engines.EngineProfile) -> str:
    """The engine's flag for the name clients ask for (`--served-model-name`, `--alias`)."""
    return profile.flags_for("served_model_name")[0]


def port_flag(profile: engines.EngineProfile) -> str:
    """The engine's flag for its port (`--port`)."""
    return profile.flags_for("port")[0]


def _port(out: Imported, port: str | None, profile: engines.EngineProfile) -> None:
    flag = port_flag(profile)
    if port is None:
        out.lane["port"] = profile.default_port
        out.notes["port"] = (
            f"no {flag}: {profile.title}'s default, {profile.default_port} "
            f"(laned passes {flag} itself)"
        )
        return
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise BadImport(f"{flag} {port!r} is not a port number", f"give {flag} a number")
    out.lane["port"] = int(port)
    out.notes["port"] = f"the recipe's {flag} (laned passes it, and probes the engine there)"


def _caches(out: Imported) -> None:
    """A cache path inside the container dies with it: laned removes every container."""
    mounts = [v.split(":")[1] for v in out.container.get("volumes", []) if v.count(":") >= 1]  # type: ignore[attr-defined]
    for name, (path, _) in out.env.items():
        cache = name.endswith(("CACHE_DIR", "CACHE_HOME", "CACHE_ROOT", "CACHE_PATH"))
        if cache and path.startswith("/") and not any(path.startswith(m) for m in mounts):
            out.warnings.append(
                f"env {name}={path} is inside the container, which is removed after each run: "
                "nothing it compiles is kept. laned mounts the lane's own cache directory at "
                f'/laned/cache: set container.cache_env {{ {name} = "/laned/cache/..." }} and '
                "drop it from env"
            )


def _no_tokens(out: Imported) -> None:
    """The last net: a value shaped like a well-known token that stands where laned import
    knows no name for it (an engine flag of its own, a command word, a volume) is refused;
    laned import copies no secret into the TOML."""
    places: list[tuple[str, object]] = [(f"the lane's {k}", v) for k, v in out.lane.items()]
    places += [(f"the engine flag {f}", v) for f, v, _ in out.args]
    places += [(f"-e {k}", v) for k, (v, _) in out.env.items()]
    places += [(f"the container's {k}", v) for k, v in out.container.items()]
    places += [(f"the podman option {w[0]}", w) for w, _ in out.podman_args]
    places += [(f"rank {r}'s {f}", v) for r, a in out.rank_args.items() for f, v, _ in a]
    places += [(f"--set {k}", v) for k, v in out.values.items()]
    for where, value in places:
        kind = next(filter(None, map(token_kind, [where, *_texts(value)])), None)
        if kind is not None:
            shown = "a word of the command line" if token_kind(where) else where
            raise BadImport(
                f"{shown} holds {kind}: laned import copies no secret",
                "remove it from the command line. A secret the engine reads from its "
                "environment goes in -e NAME=..., which laned import moves to the lane's "
                "secrets file (by name only); one it reads from a flag, in the flag laned "
                "knows for it (laned.engines)",
            )


def _texts(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _texts(item)]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _texts(item)]
    return []


def _lane_name(model: str) -> str:
    """A lane name from a model name: deepseek-v4.1-flash -> deepseek-v4-1-flash."""
    slug = re.sub(r"[^a-z0-9_-]+", "-", model.rsplit("/", 1)[-1].lower()).strip("-_")
    return (slug or "lane")[:32]


def _needs(out: Imported, gpus: engines.Gpus) -> None:
    """The GPUs one host gives the lane, by its engine's own arithmetic over its flags
    (laned.engines: EngineProfile.gpus_of); where the engine takes every GPU it sees, the
    GPUs the container is given, when the recipe names them."""
    count, how = gpus.count, gpus.how
    if count is None:
        devices = [str(d) for d in out.container.get("devices", [])]  # type: ignore[attr-defined]
        named = [d for d in devices if d.startswith(GPU_DEVICE) and d != f"{GPU_DEVICE}all"]
        if not devices:
            count, how = 0, f"{how}, and the container is given none"
        elif len(named) == len(devices):
            count, how = len(named), f"{how}: the container's {len(named)}"
        else:
            count = 1
            out.warnings.append(
                f"needs.gpus = 1 is a guess: {how}, and the recipe gives the container all "
                "of the host's. Set needs.gpus to the GPUs it should take, or name them in "
                'devices ("nvidia.com/gpu=0", ...)'
            )
    out.lane["needs"] = {"gpus": count, "gpu_memory_gib": 0, "host_memory_gib": 0, "disk_gib": 0}
    out.notes["needs"] = f"fill in from the recipe's NEEDS line (GiB); gpus per host: {how}"


def _nodes(
    out: Imported,
    nodes: Sequence[tuple[str, str]],
    values: Mapping[str, str],
    profile: engines.EngineProfile,
) -> None:
    """A lane over several hosts: its nodes, the values its placeholders take (given with
    --set, else empty to fill in), and the engine's worker switch (vLLM's --headless) on
    every rank but the head."""
    how = profile.nodes
    nnodes = next((v for f, v, _ in out.args if how is not None and f == how.count), None)
    if how is not None and nnodes is not None and nnodes.isdigit() and int(nnodes) != len(nodes):
        raise BadImport(
            f"--nodes names {len(nodes)} host(s), the command line says {how.count} {nnodes}",
            "give one --nodes HOST=URL per node, the head (rank 0) first",
        )
    out.nodes = list(nodes)
    used = [p for p in out.per_node if p != "NODE_RANK"]
    out.values = {p: values.get(p, "") for p in used if p in SHARED or p in values}
    out.ranks = {rank: {p: "" for p in used if p not in out.values} for rank in range(len(nodes))}
    if how is None or not how.worker or any(f == how.worker for f, _, _ in out.args):
        return
    out.rank_args = {rank: [(how.worker, None, how.why)] for rank in range(1, len(nodes))}
