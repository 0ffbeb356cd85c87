"""The serve wrapper: the bash script a lane's unit runs, with every flag and the reason for it.

What the engine's command gets from laned (its port, its model name, sleep, sampling) is
the engine's profile's (laned.engines); the wrapper around it is the same for every engine.
The wrapper exists for three reasons the seed lane learned the hard way:
- it loads the API key from the unit's EnvironmentFile and passes it to the engine by
  name only (never in argv), or, for an engine that reads no variable for it (SGLang), in
  a 0600 file of the engine's own config format;
- it turns an exit nobody asked for into a failure: vLLM's API server exits 0 when its
  engine dies, and `Restart=on-failure` would read that as a deliberate stop;
- it records the engine's own exit status before that mapping, for laned to report.
Every value is quoted with shlex.quote; a `why` becomes comment lines, each prefixed.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable

from laned import engines
from laned.config.model import Config, LaneConfig
from laned.config.names import (
    CACHE_MOUNT,
    DEFAULT_CACHE_ENV,
    cache_dir,
    container_name,
    exit_record_path,
    unit_name,
    wrapper_name,
)
from laned.core.exits import WRAPPER_EXIT_0
from laned.engines.profile import Line
from laned.render.units import generated_header


class Raw(str):
    """An argv word the wrapper writes as it is (a bash expansion), not quoted."""


# The container's `-e NAME` for each name in the lane's secrets file, found at run time.
SECRET_ENV = Raw('"${secret_env[@]}"')
# The key file's mount (a container lane) and its flag, where the engine reads its key from
# a file (laned.engines.profile.EngineProfile.key_file): empty when no key is set.
KEY_MOUNT = Raw('"${key_mount[@]}"')
KEY_ARGS = Raw('"${key_args[@]}"')
KEY_IN_CONTAINER = "/run/laned/api-key.yaml"


def comment(text: str, indent: str = "") -> list[str]:
    """Comment lines for free text: every line prefixed, so no text can leave the comment."""
    return [f"{indent}# {line}".rstrip() for line in text.splitlines() or [""]]


def _lines_for(lines: Iterable[Line], indent: str = "  ") -> list[str]:
    out: list[str] = []
    for why, words in lines:
        if why:
            out += comment(why, indent)
        out.append(indent + " ".join(_word(word) for word in words))
    return out


def _word(word: str) -> str:
    return str(word) if isinstance(word, Raw) else shlex.quote(word)


def engine_lines(config: Config, lane: str) -> list[Line]:
    """The engine's argv, one logical flag per line with its reason: what `engine=(...)` holds."""
    spec: LaneConfig = config.lanes[lane]
    profile = engines.for_lane(spec)
    base = f"lanes.{lane}"
    lines: list[Line] = []
    keyed = profile.key_file is not None and spec.secrets_path is not None
    if spec.container is not None:
        c = spec.container
        # No --rm: the wrapper reads how the container ended (OOMKilled) before removing it.
        lines.append((None, [config.daemon.podman, "run", "--name", container_name(lane, spec)]))
        lines += [(None, ["--device", d]) for d in c.devices]
        if c.network:
            lines.append((None, ["--network", c.network]))
        if c.ipc:
            lines.append((None, ["--ipc", c.ipc]))
        lines += [(None, ["--security-opt", s]) for s in c.security_opt]
        lines += [(None, ["-v", v]) for v in c.volumes]
        lines += [(var.why, ["-e", f"{key}={var.value}"]) for key, var in spec.env.items()]
        lines += [(why, ["-e", f"{key}={value}"]) for key, value, why in profile.env(spec)]
        lines += _cache_lines(config, lane)
        if spec.secrets_path:
            lines.append(
                (
                    f"the lane's secrets, by name only (-e NAME): their values come from "
                    f"{spec.secrets_path}",
                    [SECRET_ENV],
                )
            )
        if keyed:
            lines.append((f"the API key file for {profile.title}, read-only", [KEY_MOUNT]))
        if c.podman_args:
            lines.append((f"verbatim from {base}.container.podman_args", list(c.podman_args)))
        if c.entrypoint:
            lines.append((None, ["--entrypoint", c.entrypoint]))
        lines.append((None, [c.image, *c.command]))
    else:
        assert spec.exec is not None
        lines.append((None, list(spec.exec.command)))
    lines += [(arg.why, arg.argv()) for arg in spec.args]
    lines += profile.serve_lines(spec, base)
    if keyed:
        lines.append(
            (
                f"set by laned: {profile.title} reads its API key from argv or a config file "
                f"only, so the key ({profile.api_key_env} in {spec.secrets_path}) is in a 0600 "
                "file (none without a key)",
                [KEY_ARGS],
            )
        )
    return lines


def cache_env(spec: LaneConfig) -> dict[str, str]:
    """The compile-cache variables a container lane gets (its own `env` wins over them)."""
    if spec.container is None or not spec.container.compile_cache:
        return {}
    merged = {**DEFAULT_CACHE_ENV, **spec.container.cache_env}
    return {k: v for k, v in sorted(merged.items()) if k not in spec.env}


def _cache_lines(config: Config, lane: str) -> list[Line]:
    spec = config.lanes[lane]
    variables = cache_env(spec)
    if not variables:
        return []
    lines: list[Line] = [
        (
            "persistent compile caches (FlashInfer autotune, DeepGEMM and Triton JIT, "
            "torch.compile): a second cold start reuses the first one's work",
            ["-v", f"{cache_dir(config, lane)}:{CACHE_MOUNT}"],
        )
    ]
    lines += [(None, ["-e", f"{key}={value}"]) for key, value in variables.items()]
    return lines


def engine_argv(config: Config, lane: str, secret_names: Iterable[str] = ()) -> list[str]:
    """The engine's argv exactly as the wrapper runs it, with the names its secrets file
    defines at run time (`secret_names`)."""
    secret_env = [part for name in secret_names for part in ("-e", name)]
    spec = config.lanes[lane]
    profile = engines.for_lane(spec)
    keyed = profile.key_file is not None and profile.api_key_env in secret_names
    flag = profile.key_file[0] if profile.key_file else ""
    file = key_file_path(config, lane) if spec.container is None else KEY_IN_CONTAINER
    runtime = {
        SECRET_ENV: secret_env,
        KEY_MOUNT: ["-v", f"{key_file_path(config, lane)}:{KEY_IN_CONTAINER}:ro"] if keyed else [],
        KEY_ARGS: [flag, file] if keyed else [],
    }
    argv: list[str] = []
    for _, words in engine_lines(config, lane):
        for word in words:
            argv += runtime.get(word, [word]) if isinstance(word, Raw) else [word]
    return argv


def key_file_path(config: Config, lane: str) -> str:
    """Where the wrapper writes the key file of an engine that reads its key from a file:
    beside the lane's exit record, in laned's state directory (mode 0700 there)."""
    return exit_record_path(config, lane).rsplit("/", 1)[0] + f"/{lane}.api-key.yaml"


def render_wrapper(config: Config, lane: str) -> str:
    """The bash serve wrapper of one lane."""
    spec: LaneConfig = config.lanes[lane]
    name = wrapper_name(lane, spec)
    out = ["#!/usr/bin/env bash"]
    out += comment("\n".join(generated_header(config, f"serve wrapper of lane {lane}")))
    out.append("#")
    if spec.description:
        out += comment(spec.description)
    out.append(f"# Run by {unit_name(lane, spec)}.")
    out += ["set -euo pipefail", ""]
    if spec.container is not None:
        cleanup = [config.daemon.podman, "rm", "--force", "--ignore", container_name(lane, spec)]
        out += [
            "# `" + name + " cleanup` removes a container left behind by a crash or a kill.",
            'if [[ "${1:-}" == cleanup ]]; then',
            "  exec " + " ".join(shlex.quote(w) for w in cleanup),
            "fi",
        ]
    out += [
        "if [[ $# -gt 0 ]]; then",
        f"  echo {shlex.quote(f'usage: {name}' + (' [cleanup]' if spec.container else ''))} >&2",
        "  exit 2",
        "fi",
        "",
    ]
    for secret in spec.required_secrets:
        key = f"lanes.{lane}.{spec.secrets_key}"
        message = f"is not set: define {secret}=... in {spec.secrets_path} ({key})"
        out.append(f': "${{{secret}:?' + _braced(message) + '}"')
    if spec.container is not None and spec.secrets_path:
        out += _secret_names(spec.secrets_path, f"lanes.{lane}.{spec.secrets_key}")
    if spec.exec is not None:
        for key, var in spec.env.items():
            if var.why:
                out += comment(var.why)
            out.append(f"export {key}={shlex.quote(var.value)}")
        for key, value, why in engines.for_lane(spec).env(spec):
            out += comment(why)
            out.append(f"export {key}={shlex.quote(value)}")
    out += _key_file(config, lane)
    if spec.container is not None and spec.container.compile_cache:
        out += [
            "# The lane's compile cache outlives its containers (laned-owned, under state_dir).",
            f"mkdir -p {shlex.quote(cache_dir(config, lane))}",
        ]
    out += ["", "engine=("]
    out += _lines_for(engine_lines(config, lane))
    out += [")", ""]
    ended: list[str] = []
    if spec.container is not None:
        podman, name = shlex.quote(config.daemon.podman), shlex.quote(container_name(lane, spec))
        ended = [
            "# How the container ended (podman's word for an OOM kill), then remove it.",
            f"if [[ $({podman} inspect --format '{{{{.State.OOMKilled}}}}' {name} 2>/dev/null) == true ]]; then",
            "  oom=1",
            "fi",
            f"{podman} rm --force --ignore {name} >/dev/null 2>&1 || true",
        ]
    out += _supervise(exit_record_path(config, lane), ended)
    return "\n".join(out) + "\n"


def _secret_names(path: str, key: str) -> list[str]:
    """Bash that collects `-e NAME` for each name the secrets file defines (read as
    laned.config.secrecy.names_in reads it: blank, # and ; lines skipped, continued values too)."""
    return [
        f"# The lane's secrets: systemd read {path} ({key}) into this environment.",
        "# Each name in it reaches the container by name only (-e NAME): no value in an argv.",
        f"secrets={shlex.quote(path)}",
        "if [[ ! -r $secrets ]]; then",
        "  echo "
        + shlex.quote(f"laned: cannot read {path} ({key}): laned preflight LANE says why")
        + " >&2",
        "  exit 1",
        "fi",
        "secret_env=()",
        "continued=0",
        "while IFS= read -r line || [[ -n $line ]]; do",
        '  line=${line#"${line%%[![:space:]]*}"}',
        "  if (( continued )); then",
        "    [[ $line == *\\\\ ]] || continued=0",
        "    continue",
        "  fi",
        "  if [[ -z $line || $line == [#\\;]* ]]; then continue; fi",
        "  [[ $line == *\\\\ ]] && continued=1",
        "  name=${line%%=*}",
        '  name=${name%"${name##*[![:space:]]}"}',
        '  if [[ $line == *=* && $name =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]]; then secret_env+=(-e "$name"); fi',
        'done <"$secrets"',
    ]


def _key_file(config: Config, lane: str) -> list[str]:
    """Bash that writes the API key into a 0600 file of the engine's config format, for an
    engine that reads its key from argv or a file only (laned.engines: SGLang's --config)."""
    spec = config.lanes[lane]
    profile = engines.for_lane(spec)
    if profile.key_file is None or spec.secrets_path is None:
        return []
    flag, key = profile.key_file
    var, path = profile.api_key_env, key_file_path(config, lane)
    where = f"lanes.{lane}.{spec.secrets_key}"
    inside = KEY_IN_CONTAINER if spec.container is not None else path
    bad = f"laned: {var} in {spec.secrets_path} ({where}) holds a quote, a backslash or a control character, which the key file cannot carry: use a key of letters and digits (openssl rand -hex 32)"
    return [
        "",
        f"# {profile.title} reads its API key from argv (readable by every local user) or from",
        f"# a config file ({flag}): the key goes into a file of its own, mode 0600, none without a key.",
        "key_args=()",
        "key_mount=()",
        f"keyfile={shlex.quote(path)}",
        'rm -f "$keyfile"',
        f'if [[ -n "${{{var}:-}}" ]]; then',
        '  if [[ "$' + var + '" == *[\\\\\\"]* || "$' + var + '" =~ [[:cntrl:]] ]]; then',
        f"    echo {shlex.quote(bad)} >&2",
        "    exit 1",
        "  fi",
        '  mkdir -p "${keyfile%/*}"',
        "  (umask 077; printf '" + key + ': "%s"\\n\' "$' + var + '" >"$keyfile")',
        f"  key_args=({shlex.quote(flag)} {shlex.quote(inside)})",
        *(
            [f'  key_mount=(-v "$keyfile:{KEY_IN_CONTAINER}:ro")']
            if spec.container is not None
            else []
        ),
        "fi",
    ]


def _braced(text: str) -> str:
    # Inside ${VAR:?word} the word undergoes expansion: escape what bash would expand.
    return "".join("\\" + ch if ch in '\\$`"}' else ch for ch in text)


def _supervise(record: str, ended: list[str]) -> list[str]:
    return [
        "# Run the engine as a child so that its exit can be judged: a stop systemd asked for",
        "# (SIGTERM) while the engine ran ends cleanly; any other exit, status 0 included, is a",
        "# failure. A stop that arrives once the engine has exited (during the clean-up below)",
        "# changes nothing: that exit was the engine's own.",
        "requested=0",
        "late=0",
        "ended=0",
        "signalled=0",
        "child=",
        "on_stop() {",
        "  signalled=1",
        '  if (( ended )) || { [[ -n "$child" ]] && ! kill -0 "$child" 2>/dev/null; }; then',
        "    late=1",
        "    return 0  # a bare return would hand the interrupted command's status to set -e",
        "  fi",
        "  requested=1",
        '  if [[ -n "$child" ]]; then kill -TERM "$child" 2>/dev/null || true; fi',
        "}",
        "trap on_stop TERM INT",
        '"${engine[@]}" &',
        "child=$!",
        'if (( requested )); then kill -TERM "$child" 2>/dev/null || true; fi',
        "status=",
        'while [[ -z "$status" ]]; do',
        "  signalled=0",
        '  if wait "$child"; then s=0; else s=$?; fi',
        "  # A signal cuts wait short (the engine may still be shutting down): wait again.",
        "  if (( ! signalled )); then status=$s; fi",
        "done",
        "ended=1",
        "at=$(date +%s)",
        "oom=0",
        *ended,
        "",
        "# The engine's own status, before any mapping, for laned to report.",
        f"record={shlex.quote(record)}",
        'mkdir -p "${record%/*}" 2>/dev/null || true',
        "printf 'status=%s requested=%s late=%s at=%s oom=%s\\n' \\",
        '  "$status" "$requested" "$late" "$at" "$oom" \\',
        '  >"$record.tmp" 2>/dev/null && mv -f "$record.tmp" "$record" 2>/dev/null || true',
        "",
        "if (( requested )); then",
        '  echo "laned: the engine stopped on request (status $status)" >&2',
        "  exit 0",
        "fi",
        "code=$status",
        f"if (( code == 0 )); then code={WRAPPER_EXIT_0}; fi",
        "if (( late )); then",
        '  echo "laned: the engine exited on its own with status $status before a stop arrived;'
        ' exiting $code so that systemd records a failure" >&2',
        "else",
        '  echo "laned: the engine exited on its own with status $status;'
        ' exiting $code so that systemd records a failure" >&2',
        "fi",
        'exit "$code"',
    ]
