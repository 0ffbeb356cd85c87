"""podman run's options, as a recipe gives them to `docker run`, become a lane's container
table (laned.importer.translate reads the rest): what podman does as Docker does is carried over,
what rootless podman under systemd cannot take is translated or dropped with a note, and
an option given twice is kept once. Pure."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from laned.config.secrecy import looks_secret, short_option
from laned.errors import BadImport
from laned.importer.cmdline import PLACEHOLDER, Word, shown

BOOL_OPTIONS = {
    "--rm", "--privileged", "-d", "--detach", "-i", "--interactive", "-t", "--tty", "--init",
    "--read-only", "-P", "--publish-all", "--no-healthcheck", "--oom-kill-disable",
    "--replace", "--no-hosts", "--read-only-tmpfs", "-q", "--quiet",
}  # fmt: skip
ALIASES = {
    "--env": "-e", "--volume": "-v", "--publish": "-p", "-w": "--workdir", "-u": "--user",
    "--net": "--network", "-l": "--label", "-h": "--hostname", "-m": "--memory",
    "--detach": "-d", "--interactive": "-i", "--tty": "-t",
}  # fmt: skip
MULTI = {
    "-e", "-v", "-p", "--device", "--cap-add", "--cap-drop", "--ulimit", "--security-opt",
    "--label", "--tmpfs", "--mount", "--add-host", "--group-add", "--env-file", "--dns",
    "--sysctl", "--annotation",
}  # fmt: skip
# Kept in podman_args as written, with a meaning podman gives them as Docker does.
VERBATIM = {
    "--ulimit", "--cap-add", "--cap-drop", "--shm-size", "--privileged", "--workdir", "--user",
    "--group-add", "--userns", "--tmpfs", "--mount", "--hostname", "--add-host", "--label",
    "--memory", "--cpus", "--cpuset-cpus", "--pids-limit", "--init", "--read-only", "--sysctl",
    "--dns", "--annotation", "--stop-timeout", "--stop-signal",
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


def comment_of(words: list[Word], index: int) -> str:
    """A line's `# comment` explains the last option or flag that starts on that line."""
    word = words[index]
    later = any(w.line == word.line and w.text.startswith("-") for w in words[index + 1 :])
    return "" if later else word.comment


def split_run(words: list[Word]) -> tuple[list[Option], Word, list[Word]]:
    """(the run's options, the image, the words after it)."""
    options: list[Option] = []
    i = 0
    while i < len(words):
        word = words[i]
        text = word.text
        if not text.startswith("-") or text == "-":
            return options, word, words[i + 1 :]
        why = comment_of(words, i)
        attached = short_option(text)
        if text.startswith("--") and "=" in text:
            flag, value = text.split("=", 1)
            options.append(Option(ALIASES.get(flag, flag), value, word, why))
        elif attached is not None:  # `-eHF_TOKEN=...`, `-p8000:8000`: the value attached
            options.append(Option(ALIASES.get(attached[0], attached[0]), attached[1], word, why))
        elif text in BOOL_OPTIONS:
            options.append(Option(ALIASES.get(text, text), None, word, why))
        elif re.fullmatch(r"-[dit]{2,3}", text):  # -it, -dit
            options += [Option(f"-{c}", None, word) for c in text[1:]]
        elif i + 1 < len(words):
            options.append(Option(ALIASES.get(text, text), words[i + 1].text, word, why))
            i += 1
        i += 1
    raise BadImport("the command line names no image", "docker run [OPTIONS] IMAGE [ARGS]")


def secret(out: Imported, name: str, source: str) -> None:
    """A secret the recipe passes (`source`: how, placeholders as written, for the note):
    a line for the lane's secrets file, out of every argv and of the TOML."""
    out.secrets.setdefault(name, source)
    out.changes.append(
        f"{source} left the argv: {name} now comes from the lane's secrets file, by name only"
    )


def secret_option(out: Imported, option: Option) -> bool:
    """`-e NAME[=VALUE]` for a secret-looking NAME, or `--env-file F`: recorded for the secrets
    file (its value, a placeholder or not, never resolved nor kept). True when it was one."""
    if option.flag == "--env-file" and option.value is not None:
        out.secret_files.append(shown(option.value))
        out.changes.append(
            f"--env-file {shown(option.value)} dropped: its lines go in the lane's secrets file"
        )
        return True
    name, has_value, value = (option.value or "").partition("=")
    if option.flag == "-e" and looks_secret(name):
        # A placeholder is shown as written; a value never is.
        given = shown(value) if PLACEHOLDER.fullmatch(value) else "(a value, not copied)"
        secret(out, name, f"-e {name}={given}" if has_value else f"-e {name}")
        return True
    return False


def translate_options(
    out: Imported,
    options: list[Option],
    resolve: Callable[[str, str], str],
    values: Mapping[str, str],
) -> None:
    """podman run's options, translated where they must be; each duplicate kept once."""
    kept: list[Option] = []
    for option in options:
        same = next((o for o in kept if (o.flag, o.value) == (option.flag, option.value)), None)
        earlier = next((o for o in kept if o.flag == option.flag), None)
        if same is not None:
            given = f"{option.flag} {option.value or ''}".strip()
            out.changes.append(
                f"{given} is given twice (lines {same.word.line} and {option.word.line}): kept once"
            )
            continue
        if earlier is not None and option.flag not in MULTI:
            out.warnings.append(
                f"{option.flag} is given twice with different values ({earlier.value} on line "
                f"{earlier.word.line}, {option.value} on line {option.word.line}): kept the "
                "last, as docker does"
            )
            kept.remove(earlier)
        kept.append(option)
    network = next((o.value for o in kept if o.flag == "--network"), None)
    ipc = next((o.value for o in kept if o.flag == "--ipc"), None)
    for option in kept:
        if secret_option(out, option):
            continue
        value = None
        if option.value is not None:
            value = resolve(option.value, f"{option.flag} {shown(option.value)}")
        if option.flag == "-e" and value is not None and "=" not in value and value in values:
            value = f"{value}={values[value]}"
        _option(out, option, value, network, ipc)


def _option(
    out: Imported, option: Option, value: str | None, network: str | None, ipc: str | None
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
        _volume(out, value or "", why)
    elif flag == "-e":
        _env(out, value or "", why)
    elif flag == "-p":
        _publish(out, value or "", network, why)
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


def _volume(out: Imported, value: str, why: str) -> None:
    source = value.split(":", 1)[0]
    if source.startswith(("/", "~")):
        out.container.setdefault("volumes", []).append(value)  # type: ignore[attr-defined]
    else:
        out.podman_args.append((["-v", value], why or "a named volume: podman keeps it"))


def _env(out: Imported, value: str, why: str) -> None:
    name, has_value, text = value.partition("=")
    if not has_value:
        raise BadImport(
            f"-e {name} takes its value from the shell that runs docker",
            f"give it: laned import --set {name}=VALUE, or write -e {name}=VALUE",
        )
    out.env[name] = (text, why)


def _publish(out: Imported, value: str, network: str | None, why: str) -> None:
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
        # laned passes --port and probes that port on the host: both sides must agree.
        out.lane["port"] = int(host_port)
        out.notes["port"] = f"-p {value}: the host's port (laned passes --port {host_port})"
        value = ":".join([*parts[:-2], host_port, host_port])
        out.changes.append(f"-p became {value}: the engine listens on the port laned probes")
    out.podman_args.append((["-p", value], why or "the engine's port, published on the host"))
