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

import hashlib
import shlex
from collections.abc import Iterable

from laned import engines
from laned.config.model import Config, LaneConfig
from laned.config.names import (
    AF_UNIX_MAX,
    CACHE_MOUNT,
    WEIGHTS_SOCKETS_MOUNT,
    cache_dir,
    container_name,
    exit_record_path,
    unit_name,
    weights_container_name,
    weights_exit_record_path,
    weights_sockets_dir,
    weights_unit_name,
    wrapper_name,
)
from laned.config.sleep import LOOPBACK
from laned.core.exits import WRAPPER_EXIT_0
from laned.engines.profile import Line
from laned.render.units import generated_header, keeps_a_key_file


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
    if isinstance(word, Raw):
        return str(word)
    if SOCKETS in word:  # the daemon's socket directory, expanded by bash at run time
        escaped = "".join("\\" + ch if ch in '\\"`$' else ch for ch in word)
        return '"' + escaped.replace("\\" + SOCKETS, SOCKETS) + '"'
    return shlex.quote(word)


SOCKETS = "${sockets}"  # in a word: the wrapper's $sockets (the daemon's socket directory)


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
        lines += [(why, ["-e", f"{key}={value}"]) for key, value, why in gpu_env(spec, base)]
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
        if spec.weight_cache is not None:
            lines.append(
                (
                    "the weight-cache daemon's sockets (its container mounts them too)",
                    ["-v", Raw(f'"$sockets:{WEIGHTS_SOCKETS_MOUNT}"')],
                )
            )
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
    if spec.weight_cache is not None and profile.weight_cache is not None:
        lines += profile.weight_cache.engine_lines(spec, base, _sockets_seen_by(spec))
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


def _sockets_seen_by(spec: LaneConfig) -> str:
    """The daemon's socket directory as the engine and the daemon see it: the mount inside a
    container, the wrapper's `$sockets` on the host."""
    return WEIGHTS_SOCKETS_MOUNT if spec.container is not None else SOCKETS


def weights_lines(config: Config, lane: str) -> list[Line]:
    """The weight-cache daemon's argv, one logical flag per line with its reason: the
    engine's own command and environment with `preload --model MODEL` for `serve MODEL`, the
    flags that shape the weights (laned.engines.vllm_preload.daemon_flags), and its own."""
    spec: LaneConfig = config.lanes[lane]
    profile = engines.for_lane(spec)
    api = profile.weight_cache
    assert api is not None and spec.weight_cache is not None
    base = f"lanes.{lane}"
    out: list[Line] = []
    for why, words in engine_lines(config, lane):
        if words[:3] == [config.daemon.podman, "run", "--name"]:
            words = [*words[:3], weights_container_name(lane, spec)]
        elif words and words[0] in CONTAINER_KEY_WORDS:
            continue
        elif words[:1] == ["-e"] and "=" in words[1]:
            name, _, value = words[1].partition("=")
            own = api.env(name, value)
            if own is not None:
                why, words = own[1], ["-e", f"{name}={own[0]}"]
        out.append((why, words))
    # The engine's own lines, from its command on, become the daemon's.
    command_at = next(i for i, (_w, words) in enumerate(out) if _is_command(spec, words))
    head, tail = out[:command_at], out[command_at:]
    command = api.command(tail[0][1]) or tail[0][1]
    daemon: list[Line] = [(None, command)]
    flags = [
        (why, words)
        for why, words in tail[1:]
        if not isinstance(words[0], Raw) and words[0] not in api.engine_flags
    ]
    # Judged as one argv (a flag's value may be an args entry of its own).
    mask = iter(api.flags([word for _why, words in flags for word in words]))
    for why, words in flags:
        kept = [word for word in words if next(mask)]
        if kept:
            daemon.append((why, kept))
    return head + daemon + api.daemon_lines(spec, base, _sockets_seen_by(spec))


# The engine's own additions a daemon never gets (its API key, its key file).
CONTAINER_KEY_WORDS = (KEY_MOUNT,)


def _is_command(spec: LaneConfig, words: list[str]) -> bool:
    """Whether a line of engine_lines is the engine's command (image and command, or exec)."""
    if spec.container is not None:
        return bool(words) and words[0] == spec.container.image
    assert spec.exec is not None
    return words == list(spec.exec.command)


def cache_env(spec: LaneConfig) -> dict[str, str]:
    """The compile-cache variables a container lane gets: its engine's (laned.engines,
    `caches`), then `container.cache_env`; its own `env` wins over them."""
    if spec.container is None or not spec.container.compile_cache:
        return {}
    caches = engines.for_lane(spec).caches
    merged = {**(caches.env if caches else {}), **spec.container.cache_env}
    return {k: v for k, v in sorted(merged.items()) if k not in spec.env}


def _cache_lines(config: Config, lane: str) -> list[Line]:
    spec = config.lanes[lane]
    variables = cache_env(spec)
    if not variables:
        return []
    caches = engines.for_lane(spec).caches
    why = caches.why if caches else "persistent caches: a second cold start reuses the first's work"
    lines: list[Line] = [(why, ["-v", f"{cache_dir(config, lane)}:{CACHE_MOUNT}"])]
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
    return _wrapper(config, lane, weights=False)


def gpu_env(spec: LaneConfig, base: str) -> list[tuple[str, str, str]]:
    """CUDA_VISIBLE_DEVICES from `gpus`, where the lane declares its GPUs and names them
    nowhere else (its env, CDI devices by index; `nvidia.com/gpu=all` shows every GPU in
    the host's order): the engine then runs on the GPUs laned places it on, numbered as
    nvidia-smi and NVML number them (PCI bus order, not CUDA's fastest first)."""
    devices = spec.container.devices if spec.container else ()
    # Devices that name GPUs (nvidia.com/gpu=2) show the container those alone, numbered from 0.
    named = any(d.startswith("nvidia.com/gpu=") and d[15:].isdigit() for d in devices)
    if not spec.gpus or "CUDA_VISIBLE_DEVICES" in spec.env or named:
        return []
    why = f"set by laned from {base}.gpus: the engine runs on the GPUs laned places it on"
    return [
        ("CUDA_DEVICE_ORDER", "PCI_BUS_ID", "numbered as nvidia-smi numbers them"),
        ("CUDA_VISIBLE_DEVICES", ",".join(map(str, spec.gpus)), why),
    ]


def render_weights_wrapper(config: Config, lane: str) -> str:
    """The bash wrapper of the lane's weight-cache daemon (`vllm preload`): the serve
    wrapper's environment and secrets, the daemon's command, and `ready` (its unit's
    ExecStartPost): waits until the daemon's /health answers 200. It writes the digest of
    what it runs beside its exit record: laned restarts the daemon when that changes."""
    return _wrapper(config, lane, weights=True).replace(DIGEST_MARK, weights_digest(config, lane))


def weights_digest(config: Config, lane: str) -> str:
    """What the lane's weight-cache daemon loads, as a short hash of its wrapper (its
    command, environment and image): a daemon that wrote another one loads something else."""
    return hashlib.sha256(_wrapper(config, lane, weights=True).encode()).hexdigest()[:16]


DIGEST_MARK = "@DIGEST@"


def weights_digest_path(config: Config, lane: str) -> str:
    """Where the daemon's wrapper writes, as it starts, the digest of what it runs (its first
    line) and its socket directory (its second)."""
    return weights_exit_record_path(config, lane).removesuffix("-exit") + "-digest"


def _wrapper(config: Config, lane: str, weights: bool) -> str:
    spec: LaneConfig = config.lanes[lane]
    name = wrapper_name(lane, spec) + ("-weights" if weights else "")
    cname = weights_container_name(lane, spec) if weights else container_name(lane, spec)
    what = "the weight-cache daemon" if weights else "the engine"
    out = ["#!/usr/bin/env bash"]
    title = (
        f"weight-cache daemon wrapper of lane {lane}"
        if weights
        else f"serve wrapper of lane {lane}"
    )
    out += comment("\n".join(generated_header(config, title)))
    out.append("#")
    if spec.description:
        out += comment(spec.description)
    unit = weights_unit_name(lane, spec) if weights else unit_name(lane, spec)
    out.append(f"# Run by {unit}.")
    out += ["set -euo pipefail", ""]
    modes = []
    keyed = not weights and keeps_a_key_file(spec)
    if spec.container is not None or keyed:
        modes.append("cleanup")
        said = [
            *(["a container left behind by a crash or a kill"] if spec.container else []),
            *(["the copy of the API key the engine read (ExecStopPost=)"] if keyed else []),
        ]
        out += [
            "# `" + name + f" cleanup` removes {said[0]}" + ("," if said[1:] else "."),
            *[f"# and {more}." for more in said[1:]],
            'if [[ "${1:-}" == cleanup ]]; then',
            *([f"  rm -f {shlex.quote(key_file_path(config, lane))}"] if keyed else []),
        ]
        if spec.container is not None:
            cleanup = [config.daemon.podman, "rm", "--force", "--ignore", cname]
            out.append("  exec " + " ".join(shlex.quote(w) for w in cleanup))
        else:
            out.append("  exit 0")
        out.append("fi")
    if weights:
        modes.append("ready")
        out += _ready(spec)
    usage = f"usage: {name}" + (f" [{'|'.join(modes)}]" if modes else "")
    out += [
        "if [[ $# -gt 0 ]]; then",
        f"  echo {shlex.quote(usage)} >&2",
        "  exit 2",
        "fi",
        "",
    ]
    for secret in engines.required_secrets(spec):
        key = f"lanes.{lane}.{spec.secrets_key}"
        message = f"is not set: define {secret}=... in {spec.secrets_path} ({key})"
        out.append(f': "${{{secret}:?' + _braced(message) + '}"')
    if spec.container is not None and spec.secrets_path:
        out += _secret_names(spec.secrets_path, f"lanes.{lane}.{spec.secrets_key}")
    if spec.exec is not None:
        api = engines.for_lane(spec).weight_cache
        for key, var in spec.env.items():
            value, why = var.value, var.why
            own = api.env(key, value) if weights and api is not None else None
            if own is not None:
                value, why = own
            if why:
                out += comment(why)
            out.append(f"export {key}={shlex.quote(value)}")
        for key, value, why in [*engines.for_lane(spec).env(spec), *gpu_env(spec, f"lanes.{lane}")]:
            out += comment(why)
            out.append(f"export {key}={shlex.quote(value)}")
    if not weights:
        out += _key_file(config, lane)
    if spec.container is not None and spec.container.compile_cache:
        out += [
            "# The lane's compile cache outlives its containers (laned-owned, under state_dir).",
            f"mkdir -p {shlex.quote(cache_dir(config, lane))}",
        ]
    cache = engines.for_lane(spec).weight_cache
    if spec.weight_cache is not None and cache is not None:
        title = engines.for_lane(spec).title
        out += [
            "# The weight-cache daemon's sockets: in the user's runtime directory, private to the",
            f"# user ({title} checks the owner), in a short directory named by a hash of the lane's",
            f"# name: an AF_UNIX path is {AF_UNIX_MAX} bytes at most, and a socket's own name is "
            f"{cache.socket_name_max}",
            f"# ({cache.socket_name}).",
            'sockets="${XDG_RUNTIME_DIR:?is not set: the weight cache needs the user runtime '
            + f'directory}}/{weights_sockets_dir(lane)}"',
            'mkdir -p -m 700 "$sockets"',
        ]
    if weights:
        digest = weights_digest_path(config, lane)
        out += [
            "# What this daemon loads (a change of it restarts the daemon too) and where its",
            "# sockets are, for laned.",
            f"digest={shlex.quote(digest)}",
            'mkdir -p "${digest%/*}"',
            f'printf \'%s\\n%s\\n\' {DIGEST_MARK} "$sockets" >"$digest"',
        ]
    out += ["", "engine=("]
    out += _lines_for(weights_lines(config, lane) if weights else engine_lines(config, lane))
    out += [")", ""]
    ended: list[str] = []
    if spec.container is not None:
        podman, quoted = shlex.quote(config.daemon.podman), shlex.quote(cname)
        ended = [
            "# How the container ended (podman's word for an OOM kill), then remove it.",
            f"if [[ $({podman} inspect --format '{{{{.State.OOMKilled}}}}' {quoted} 2>/dev/null) == true ]]; then",
            "  oom=1",
            "fi",
            f"{podman} rm --force --ignore {quoted} >/dev/null 2>&1 || true",
        ]
    if keyed:
        ended += [
            "# The engine read its key at its start: the copy goes with it (a restart writes it",
            "# again; the unit's ExecStopPost= removes it too, should this wrapper be killed).",
            'rm -f "$keyfile"',
        ]
    record = weights_exit_record_path(config, lane) if weights else exit_record_path(config, lane)
    out += _supervise(record, ended, what)
    return "\n".join(out) + "\n"


def _ready(spec: LaneConfig) -> list[str]:
    """`ready`: the weight-cache unit's ExecStartPost, so that its start job ends when the
    daemon serves (preload.py: /health answers 503 while it loads, 200 once every rank is
    ready). Plain bash (/dev/tcp): no HTTP client needed on the host."""
    health = spec.weight_cache_ports()[0]
    return [
        "# `ready` waits until the daemon's /health answers 200 (its unit's ExecStartPost: the",
        "# start job ends when the weights are on the GPUs; systemd's TimeoutStartSec bounds it).",
        'if [[ "${1:-}" == ready ]]; then',
        "  while :; do",
        "    line=$( (",
        f"      exec 3<>/dev/tcp/{LOOPBACK}/{health}",
        "      printf 'GET /health HTTP/1.0\\r\\nHost: localhost\\r\\n\\r\\n' >&3",
        "      IFS= read -r -t 5 status <&3 && printf '%s' \"$status\"",
        "    ) 2>/dev/null ) || true",
        "    if [[ $line == 'HTTP/'*' 200'* ]]; then exit 0; fi",
        "    # The daemon died loading (systemd gives its main process as $MAINPID): fail now.",
        '    if [[ -n ${MAINPID:-} ]] && ! kill -0 "$MAINPID" 2>/dev/null; then',
        "      echo 'laned: the weight-cache daemon exited before it was ready' >&2",
        "      exit 1",
        "    fi",
        "    sleep 0.5",
        "  done",
        "fi",
    ]


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


def _supervise(record: str, ended: list[str], what: str = "the engine") -> list[str]:
    return [
        f"# Run {what} as a child so that its exit can be judged: a stop systemd asked for",
        f"# (SIGTERM) while {what} ran ends cleanly; any other exit, status 0 included, is a",
        f"# failure. A stop that arrives once {what} has exited (during the clean-up below)",
        f"# changes nothing: that exit was {what}'s own.",
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
        f"# {what[0].upper() + what[1:]}'s own status, before any mapping, for laned to report.",
        f"record={shlex.quote(record)}",
        'mkdir -p "${record%/*}" 2>/dev/null || true',
        "printf 'status=%s requested=%s late=%s at=%s oom=%s\\n' \\",
        '  "$status" "$requested" "$late" "$at" "$oom" \\',
        '  >"$record.tmp" 2>/dev/null && mv -f "$record.tmp" "$record" 2>/dev/null || true',
        "",
        "if (( requested )); then",
        f'  echo "laned: {what} stopped on request (status $status)" >&2',
        "  exit 0",
        "fi",
        "code=$status",
        f"if (( code == 0 )); then code={WRAPPER_EXIT_0}; fi",
        "if (( late )); then",
        f'  echo "laned: {what} exited on its own with status $status before a stop arrived;'
        ' exiting $code so that systemd records a failure" >&2',
        "else",
        f'  echo "laned: {what} exited on its own with status $status;'
        ' exiting $code so that systemd records a failure" >&2',
        "fi",
        'exit "$code"',
    ]
