"""podman run's options, as a recipe gives them to `docker run`, become a lane's container
table (laned.importer.translate reads the rest): what podman does as Docker does is carried over,
what rootless podman under systemd cannot take is translated or dropped with a note, and
an option given twice is kept once. The options are read as podman reads them
(laned.config.podman_options, the reader the config's rules use too). Pure."""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from laned.config.podman_options import PAIR_OPTIONS, read_options
from laned.config.secrecy import holds_secret, looks_secret, token_kind
from laned.errors import BadImport
from laned.importer.cmdline import PLACEHOLDER, Word, shown

# The spelling laned writes for the options it names short (podman's reader gives long names).
SPELLING = {
    "--env": "-e", "--volume": "-v", "--publish": "-p", "--detach": "-d", "--interactive": "-i",
    "--tty": "-t",
}  # fmt: skip
MULTI = {
    "-e", "-v", "-p", "--device", "--cap-add", "--cap-drop", "--ulimit", "--security-opt",
    "--label", "--tmpfs", "--mount", "--add-host", "--group-add", "--env-file", "--dns",
    "--sysctl", "--annotation", "--env-merge", "--log-opt",
}  # fmt: skip
# Kept in podman_args as written, with a meaning podman gives them as Docker does.
VERBATIM = {
    "--ulimit", "--cap-add", "--cap-drop", "--shm-size", "--privileged", "--workdir", "--user",
    "--group-add", "--userns", "--tmpfs", "--mount", "--hostname", "--add-host", "--label",
    "--memory", "--cpus", "--cpuset-cpus", "--pids-limit", "--init", "--read-only", "--sysctl",
    "--dns", "--annotation", "--stop-timeout", "--stop-signal", "--env-merge",
}  # fmt: skip
DROPPED = {
    "--rm": "laned removes the container itself, after reading how it ended (OOM or not)",
    "-d": "systemd runs the engine in the foreground, as its service",
    "-i": "there is no terminal under systemd",
    "-t": "there is no terminal under systemd",
    "--restart": "systemd and laned restart the engine (restart_sec, start_limit_burst)",
    "--pull": "laned runs the image as it is on the host: `podman pull` it before a start",
    "--runtime": "rootless podman reaches the GPUs through CDI devices, not a runtime",
}
# What a kept option means under rootless podman, where that differs from Docker as root.
ROOTLESS = {
    "memlock": "rootless podman grants at most the user's own hard limit: raise it for the user "
    "(LimitMEMLOCK=infinity in user@.service, or limits.conf)",
    "--privileged": "under rootless podman it grants no more than the user has",
}
_GPU_IDS = re.compile(r"^(?:device=)?([0-9]+(?:,[0-9]+)*)$")


@dataclass
class Imported:
    """A lane made from a command line, with what was changed on the way and why."""

    name: str
    lane: dict[str, object] = field(default_factory=dict)  # top-level keys, in order
    notes: dict[str, str] = field(default_factory=dict)  # key -> why it reads as it does
    args: list[tuple[str, str | None, str]] = field(default_factory=list)
    env: dict[str, tuple[str, str]] = field(default_factory=dict)
    container: dict[str, object] = field(default_factory=dict)
    podman_args: list[tuple[list[str], str]] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    # Secrets the recipe passes (name -> how it gave it): lines for the lane's secrets file,
    # never their values; and env files it reads (their lines go there too).
    secrets: dict[str, str] = field(default_factory=dict)
    secret_files: list[str] = field(default_factory=list)
    per_node: dict[str, list[str]] = field(default_factory=dict)  # placeholder -> used by
    nodes: list[tuple[str, str]] = field(default_factory=list)  # (host, laned URL), by rank
    values: dict[str, str] = field(default_factory=dict)  # placeholders, every rank
    ranks: dict[int, dict[str, str]] = field(default_factory=dict)  # placeholders, per rank
    rank_args: dict[int, list[tuple[str, str | None, str]]] = field(default_factory=dict)


@dataclass
class Option:
    flag: str
    value: str | None
    word: Word
    comment: str = ""


def comments(words: list[Word]) -> list[str]:
    """Each word's comment: a line's `# comment` explains the last option or flag that starts
    on that line, so a word gets its line's comment when no later word of the line starts
    with `-` (one pass from the end: linear in the words)."""
    out = [""] * len(words)
    flagged: set[int] = set()  # lines with a flag after the word at hand
    for index in range(len(words) - 1, -1, -1):
        word = words[index]
        if word.line not in flagged:
            out[index] = word.comment
        if word.text.startswith("-"):
            flagged.add(word.line)
    return out


def split_run(words: list[Word]) -> tuple[list[Option], Word, list[Word]]:
    """(the run's options, the image, the words after it), read as podman reads them."""
    read, end = read_options([w.text for w in words], interspersed=False)
    if end >= len(words):
        raise BadImport("the command line names no image", "docker run [OPTIONS] IMAGE [ARGS]")
    why = comments(words)
    options: list[Option] = []
    for n, option in enumerate(read):
        last = n + 1 == len(read) or read[n + 1].at != option.at  # a cluster's last option
        flag = SPELLING.get(option.name, option.name)
        options.append(Option(flag, option.value, words[option.at], why[option.at] if last else ""))
    return options, words[end], words[end + 1 :]


def secret(out: Imported, name: str, source: str) -> None:
    """A secret the recipe passes (`source`: how, placeholders as written, for the note):
    a line for the lane's secrets file, out of every argv and of the TOML."""
    out.secrets.setdefault(name, source)
    out.changes.append(
        f"{source} left the argv: {name} now comes from the lane's secrets file, by name only"
    )


def secret_option(out: Imported, option: Option) -> bool:
    """`-e`, `--env-merge` NAME[=VALUE] that holds a secret (by its name, or by a value shaped
    like a token: laned.config.secrecy.holds_secret), or `--env-file F`: recorded for the
    secrets file (its value, a placeholder or not, never resolved nor kept). True when it was
    one. A label, annotation or log option that holds one is refused: it hands the engine
    nothing, and laned import copies no secret."""
    if option.flag == "--env-file" and option.value is not None:
        out.secret_files.append(shown(option.value))
        out.changes.append(
            f"--env-file {shown(option.value)} dropped: its lines go in the lane's secrets file"
        )
        return True
    name, has_value, value = (option.value or "").partition("=")
    if option.flag in ("-e", "--env-merge") and (
        looks_secret(name) or (has_value and holds_secret(name, value))
    ):
        # A placeholder is shown as written; a value never is (its shape, where that is why
        # it is a secret).
        kind = None if looks_secret(name) else token_kind(value)
        given = (
            shown(value)
            if PLACEHOLDER.fullmatch(value)
            else f"(a value shaped like {kind}, not copied)"
            if kind
            else "(a value, not copied)"
        )
        secret(out, name, f"{option.flag} {name}={given}" if has_value else f"{option.flag} {name}")
        return True
    if option.flag in PAIR_OPTIONS and (looks_secret(name) or token_kind(value)):
        key = "KEY" if token_kind(name) else name  # a key may be a token itself
        raise BadImport(
            f"{option.flag} {key}=... (line {option.word.line}) holds a secret",
            f"remove it from the command line: a {option.flag.lstrip('-')} hands the engine "
            "nothing. A secret the engine reads goes in -e NAME, which laned import moves to the "
            "lane's secrets file",
        )
    return False


def translate_options(
    out: Imported,
    options: list[Option],
    resolve: Callable[[str, str], str],
    values: Mapping[str, str],
    cwd: str | None = None,
    port_flag: str = "",
) -> None:
    """podman run's options, translated where they must be; each duplicate kept once. `cwd`:
    the directory a relative bind mount's source is taken to be relative to; `port_flag`: the
    engine's own flag for its port, which laned passes."""
    # Linear in the options: the ones kept, in order, by their (flag, value) and, for an
    # option given once, by their flag.
    kept: dict[int, Option] = {}
    by_pair: dict[tuple[str, str | None], int] = {}
    by_flag: dict[str, int] = {}
    for n, option in enumerate(options):
        pair = (option.flag, option.value)
        if pair in by_pair:
            same = kept[by_pair[pair]]
            out.changes.append(
                f"{_given(option)} is given twice (lines {same.word.line} and "
                f"{option.word.line}): kept once"
            )
            continue
        if option.flag not in MULTI and option.flag in by_flag:
            earlier = kept.pop(by_flag[option.flag])
            del by_pair[(earlier.flag, earlier.value)]
            was, now = (_given(o).removeprefix(f"{o.flag} ") for o in (earlier, option))
            out.warnings.append(
                f"{option.flag} is given twice with different values ({was} on line "
                f"{earlier.word.line}, {now} on line {option.word.line}): kept the last, as "
                "docker does"
            )
        kept[n] = option
        by_pair[pair] = n
        if option.flag not in MULTI:
            by_flag[option.flag] = n
    network = next((o.value for o in kept.values() if o.flag == "--network"), None)
    ipc = next((o.value for o in kept.values() if o.flag == "--ipc"), None)
    for option in kept.values():
        if secret_option(out, option):
            continue
        value = None
        if option.value is not None:
            value = resolve(option.value, f"{option.flag} {shown(option.value)}")
        if option.flag == "-e" and value is not None and "=" not in value and value in values:
            value = f"{value}={values[value]}"
        _option(out, option, value, network, ipc, cwd, port_flag)


def _given(option: Option) -> str:
    """An option as a note shows it: the value of one that holds a secret never."""
    name, has_value, value = (option.value or "").partition("=")
    named = option.flag in ("-e", "--env-merge", *PAIR_OPTIONS) and (
        looks_secret(name) or (has_value and holds_secret(name, value))
    )
    if option.value is not None and (named or token_kind(option.value)):
        return (
            f"{option.flag} {name}=(a value, not copied)" if named else f"{option.flag} (a value)"
        )
    return f"{option.flag} {option.value or ''}".strip()


def _option(
    out: Imported,
    option: Option,
    value: str | None,
    network: str | None,
    ipc: str | None,
    cwd: str | None,
    port_flag: str,
) -> None:
    flag, why = option.flag, option.comment
    box = out.container
    if flag in DROPPED:
        out.changes.append(f"{flag} dropped: {DROPPED[flag]}")
    elif flag == "--gpus":
        box.setdefault("devices", []).extend(_gpus(out, value or ""))  # type: ignore[attr-defined]
    elif flag in ("--name", "--network", "--ipc", "--entrypoint"):
        box[flag.lstrip("-")] = value
    elif flag == "--device":
        box.setdefault("devices", []).append(value)  # type: ignore[attr-defined]
    elif flag == "--security-opt":
        box.setdefault("security_opt", []).append(value)  # type: ignore[attr-defined]
    elif flag == "-v":
        _volume(out, value or "", why, cwd)
    elif flag == "--mount" and _binds(value or ""):
        _mount(out, value or "", why, cwd)
    elif flag == "-e":
        _env(out, value or "", why)
    elif flag == "-p":
        _publish(out, value or "", network, why, port_flag)
    elif flag == "--shm-size" and ipc == "host":
        out.changes.append(
            f"--shm-size {value} dropped: with --ipc host the container uses the host's /dev/shm, "
            "and rootless podman refuses the pair (seed 000)"
        )
    else:
        words = [flag] if value is None else [flag, value]
        why = (
            why or ROOTLESS.get(flag, "")
            if not (value or "").startswith("memlock")
            else (why or ROOTLESS["memlock"])
        )
        if flag not in VERBATIM:
            why = why or "kept as written: laned does not know this option"
            out.warnings.append(f"{flag} is kept as written in podman_args; laned does not know it")
        out.podman_args.append((words, why))


def _gpus(out: Imported, value: str) -> list[str]:
    wanted = value.strip('"').strip("'")
    if wanted == "all":
        devices = ["nvidia.com/gpu=all"]
    elif (ids := _GPU_IDS.match(wanted)) and wanted.startswith("device="):
        devices = [f"nvidia.com/gpu={i}" for i in ids.group(1).split(",")]
    elif wanted.isdigit():
        devices = [f"nvidia.com/gpu={i}" for i in range(int(wanted))]
    else:
        raise BadImport(
            f"--gpus {value!r} cannot be translated", 'use --gpus all or --gpus "device=0,1"'
        )
    out.changes.append(
        f"--gpus {value} became devices = {json.dumps(devices)}: rootless podman names GPUs as CDI devices "
        "(nvidia-ctk cdi generate), it has no --gpus"
    )
    return devices


def _volume(out: Imported, value: str, why: str, cwd: str | None) -> None:
    """`-v SRC:DST[:OPTIONS]` as podman reads it (pkg/specgen/volumes.go GenVolumeMounts): a
    source that starts with `/` or `.` is a bind mount, `./` made absolute against podman's
    own working directory, which under systemd is not the recipe's; `~` is the home the shell
    expanded it to (laned expands it in volume sources to its user's); any other source names
    a volume, which podman keeps."""
    source, _, rest = value.partition(":")
    if source.startswith("."):
        source = _explicit(out, f"-v {value}", source, cwd)
        value = f"{source}:{rest}"
    if source.startswith(("/", "~")):
        out.container.setdefault("volumes", []).append(value)  # type: ignore[attr-defined]
    else:
        out.podman_args.append((["-v", value], why or "a named volume: podman keeps it"))


# `--mount type=bind,...`'s keys (docker run's and podman run's --mount): the source, the
# target, read-only, and the propagation, which a volumes entry carries as an option.
_SOURCE, _TARGET = ("source", "src"), ("target", "destination", "dst")
_READONLY = ("readonly", "ro")


def _keys(value: str) -> dict[str, str]:
    """A --mount's comma-separated KEY[=VALUE] fields, by key (a bare key: "")."""
    return {
        key.strip().lower(): val for key, _, val in (p.partition("=") for p in value.split(","))
    }


def _binds(value: str) -> bool:
    """Whether a --mount is a bind mount that names its source (docker's default type is
    volume; podman asks for one)."""
    keys = _keys(value)
    return keys.get("type") == "bind" and any(k in keys for k in _SOURCE)


def _mount(out: Imported, value: str, why: str, cwd: str | None) -> None:
    """`--mount type=bind,src=S,dst=D[,ro][,bind-propagation=P]` as a volumes entry `S:D[:ro,P]`
    (S made explicit: `_explicit`); a bind mount with keys a volumes entry has no word for
    stays in podman_args, its source made explicit."""
    keys = _keys(value)
    given = next(k for k in _SOURCE if k in keys)
    source = keys[given]
    if not source.startswith("/"):
        source = _explicit(out, f"--mount {value}", source, cwd)
    target = next((keys[k] for k in _TARGET if k in keys), None)
    readonly = next((keys[k] for k in _READONLY if k in keys), "false")
    known = {"type", *_SOURCE, *_TARGET, *_READONLY, "bind-propagation"}
    if target is None or set(keys) - known or readonly not in ("", "true", "1", "false", "0"):
        fields = [
            f"{k}={source}" if k == given else f"{k}={v}" if v else k for k, v in keys.items()
        ]
        out.podman_args.append((["--mount", ",".join(fields)], why))
        return
    options = ["ro"] if readonly in ("", "true", "1") else []
    options += [keys["bind-propagation"]] if keys.get("bind-propagation") else []
    entry = f"{source}:{target}" + (f":{','.join(options)}" if options else "")
    out.container.setdefault("volumes", []).append(entry)  # type: ignore[attr-defined]
    out.changes.append(f"--mount {value} became the volume {entry}: a bind mount, as -v writes it")


def _explicit(out: Imported, given: str, source: str, cwd: str | None) -> str:
    """A bind mount's relative source (`./models`, `models` in --mount) as the absolute path
    it names when the recipe runs from `cwd`, with a warning to check it: laned runs podman
    from a directory of its own, and the recipe's is not written in it. `~` is kept (laned
    expands it to its user's home), with a warning where no shell would have expanded it."""
    if source.startswith("~"):
        if given.startswith("--mount"):
            out.warnings.append(
                f"{given}: no shell expands ~ inside --mount; laned takes it as the home of the "
                "user laned runs as. Check that this is the directory meant"
            )
        return source
    if cwd is None:
        raise BadImport(
            f"{given} mounts a path relative to the directory the recipe was run from",
            "give that directory: laned import --cwd DIR (the CLI's default: the current "
            "directory)",
        )
    path = posixpath.normpath(posixpath.join(cwd, source))
    out.warnings.append(
        f"{given}: {source} is relative to the directory the recipe was run from, which the "
        f"recipe does not say; laned import took {cwd} (--cwd DIR gives another), so the bind "
        f"mount is {path}. Check that this is the directory meant"
    )
    return path


def _env(out: Imported, value: str, why: str) -> None:
    name, has_value, text = value.partition("=")
    if not has_value:
        raise BadImport(
            f"-e {name} takes its value from the shell that runs docker",
            f"give it: laned import --set {name}=VALUE, or write -e {name}=VALUE",
        )
    out.env[name] = (text, why)


def _publish(out: Imported, value: str, network: str | None, why: str, port_flag: str) -> None:
    port = out.lane["port"]
    if network == "host":
        out.changes.append(
            f"-p {value} dropped: with --network host the engine listens on the host"
        )
        return
    parts = value.split("/")[0].split(":")
    if len(parts) < 2 or not parts[-1].isdigit() or int(parts[-1]) != port:
        out.podman_args.append((["-p", value], why))
        return
    host_port = parts[-2]
    if host_port.isdigit() and int(host_port) != port:
        # laned passes the engine its port and probes that port on the host: both sides must
        # agree.
        out.lane["port"] = int(host_port)
        out.notes["port"] = f"-p {value}: the host's port (laned passes {port_flag} {host_port})"
        value = ":".join([*parts[:-2], host_port, host_port])
        out.changes.append(f"-p became {value}: the engine listens on the port laned probes")
    out.podman_args.append((["-p", value], why or "the engine's port, published on the host"))
