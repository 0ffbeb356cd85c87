"""Preflight: will this lane start? Pure checks over facts gathered by `laned.adapters.host`.

Each finding has a severity (an error blocks activation unless forced; a warning is shown;
a note records a check that was skipped and why), a message and a hint. The checks come
from what costs a cold start on real boxes: an image that was never built, a missing model
directory or bind-mount source, an API key file that is missing, readable by others or
empty, a port something else holds (a leftover engine may share it: vLLM binds with SO_REUSEPORT),
a host that lacks the lane's `needs`, a stop timeout shorter than the engine's graceful
shutdown, no sampling defaults (seed 000's word salad), no compile cache, an image rebuilt
since the last good start (its bind-mounted patches and kernels must be re-derived), and
the engine's own rules (laned.engines: vLLM's 600 s engine-ready timeout under a long cold
start, its generation config).
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Sequence
from typing import Any

from laned import engines
from laned.config.model import LaneConfig, gpu_indices
from laned.core.facts import KeyFile, LaneFacts, blocking, findings_json, size
from laned.errors import Finding, Severity
from laned.preflight.fit import beside_sleepers, fit, sleep_fit

GRACEFUL_STOP_MIN = 30.0  # seconds an engine's core and workers need to exit and free memory


def model_path(spec: LaneConfig) -> str | None:
    """The host path of the lane's model directory or file: `model_dir`, else the path its
    engine's command names (laned.engines: vLLM's after `serve`, SGLang's --model-path,
    llama-server's -m), mapped back through the bind mounts for containers; None for hub
    names."""
    if spec.model_dir:
        return spec.model_dir
    env = {key: var.value for key, var in spec.env.items()}
    named = engines.for_lane(spec).model_of([*spec.command_words(), *spec.arg_words()], env)
    return None if named is None else host_path(spec, named.source)


def generation_config_path(spec: LaneConfig) -> str | None:
    """The host path of the directory the lane's flags take the engine's sampling defaults
    from (laned.engines: vLLM's `--generation-config DIR`); None for none, or a word that
    names no directory (`auto`, `vllm`: no absolute path)."""
    value = engines.for_lane(spec).generation_config(spec)
    return None if value is None else host_path(spec, value)


def host_path(spec: LaneConfig, target: str) -> str | None:
    """Where an absolute path the engine sees is on the host: itself for exec lanes, mapped
    back through the bind mounts for containers; None when it is inside the image."""
    if not target.startswith("/"):
        return None
    if spec.exec is not None:
        return target
    assert spec.container is not None
    best: tuple[str, str] | None = None
    for volume in spec.container.volumes:
        parts = volume.split(":")
        if len(parts) < 2:
            continue
        src, dst = parts[0], parts[1].rstrip("/") or "/"
        inside = target == dst or target.startswith(dst.rstrip("/") + "/")
        if inside and (best is None or len(dst) > len(best[1])):
            best = (src, dst)
    if best is None:
        return None
    return posixpath.normpath(best[0] + "/" + target[len(best[1]) :])


def paths_to_check(spec: LaneConfig) -> list[tuple[str, str]]:
    """(key path, host path) of every directory or file the lane needs to exist."""
    out: list[tuple[str, str]] = []
    model = model_path(spec)
    if model is not None:
        out.append(("model_dir", model))
    if spec.container is not None:
        for i, volume in enumerate(spec.container.volumes):
            out.append((f"container.volumes[{i}]", volume.split(":", 1)[0]))
    return out


def evaluate(lane: str, spec: LaneConfig, facts: LaneFacts) -> list[Finding]:
    """Every finding about one lane, errors first."""
    found = [
        *_image(lane, spec, facts),
        *_paths(lane, spec, facts),
        *_key(lane, spec, facts),
        *_port(lane, spec, facts),
        *fit(lane, spec, facts.host, facts.disk_total_gib),
        *sleep_fit(lane, spec, facts.host, facts.weights_gib),
        *_beside_sleepers(lane, spec, facts),
        *_engine(lane, spec, facts),
        *_sampling(lane, spec),
        *_page_cache(lane, spec, facts),
    ]
    order = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.NOTE: 2}
    return sorted(found, key=lambda f: order[f.severity])


def report(lane: str, findings: Sequence[Finding]) -> dict[str, Any]:
    """A lane's preflight as served and printed: `{lane, ok, findings}`."""
    return {"lane": lane, "ok": not blocking(findings), "findings": findings_json(findings)}


def refusal(lane: str, findings: Sequence[Finding]) -> tuple[str, str]:
    """(message, hint) of an activation refused for these findings' errors."""
    errors = blocking(findings)
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return (
        f"lane {lane}: preflight: {errors[0].message}{more}",
        f"{errors[0].hint}; nothing was stopped. Fix it (GET /lanes/{lane}/preflight lists "
        "every finding), or activate with force=true",
    )


def _page_cache(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    """How much of the lane's weights a cold start would find in the page cache (mincore)."""
    if facts.weights_resident is None or not facts.weights_resident[1]:
        return
    resident, total = facts.weights_resident
    rest = "" if resident >= total else "; a cold start reads the rest off disk"
    hint = (
        ""
        if resident >= total or not spec.prefetch
        else "a swap to it reads them in while the running lane drains ([daemon.prefetch])"
    )
    yield Finding(
        "weights",
        f"{size(resident)} of {size(total)} of its weight files are in the page cache "
        f"({resident / total:.0%}){rest}",
        hint,
        Severity.NOTE,
    )


def _image(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    base = f"lanes.{lane}"
    if spec.exec is not None and facts.command_found is False:
        program = spec.exec.command[0]
        yield Finding(
            "command",
            f"{base}.exec.command[0]: {program!r} is not found on laned's PATH",
            "give its absolute path (the unit's PATH may differ from laned's)",
            severity=Severity.WARNING,
        )
    if spec.container is None:
        return
    image = spec.container.image
    if facts.image_error is not None:
        yield Finding(
            "image",
            f"cannot check that {base}.container.image {image!r} is present: {facts.image_error}",
            "systemctl --user enable --now podman.socket (or set daemon.podman_socket)",
            severity=Severity.WARNING,
        )
        return
    if facts.image_id is None:
        yield Finding(
            "image",
            f"{base}.container.image {image!r} is not present locally",
            f"build it first (e.g. `podman build -t {image} .` from the lane's recipe); "
            "`podman images` lists what there is",
            severity=Severity.ERROR,
        )
        return
    if facts.last_image_id and facts.last_image_id != facts.image_id:
        steps = [" ".join(step.command) for step in spec.prepare]
        hint = (
            f"laned runs {base}.prepare before the next start: " + "; ".join(steps)
            if steps
            else "re-derive the bind-mounted patches and rebuild the kernels for the new image "
            f"(the recipe's maintenance map), and list those steps in {base}.prepare"
        )
        yield Finding(
            "image-drift",
            f"image {image!r} changed since the last good start "
            f"({_short(facts.last_image_id)} -> {_short(facts.image_id)})",
            hint,
            severity=Severity.WARNING,
        )
    if not spec.container.compile_cache:
        yield Finding(
            "compile-cache",
            f"{base}.container.compile_cache is off: every cold start redoes FlashInfer autotune "
            "and the DeepGEMM/Triton JIT (seed 001: ~22 minutes)",
            "remove compile_cache = false, so that laned mounts a persistent cache directory",
            severity=Severity.WARNING,
        )


def _short(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12]


def _paths(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    for key, path in paths_to_check(spec):
        if facts.paths.get(path) is False:
            what = "the model directory" if key == "model_dir" else "the bind-mount source"
            yield Finding(
                "paths",
                f"lanes.{lane}.{key}: {what} {path} does not exist",
                "download or create it first, or fix the path in the config",
                severity=Severity.ERROR,
            )


def _key(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    """The secrets file: there, 0600, NAME=VALUE lines; under its older name, api_key_file,
    it must define the engine's key variable. Findings name the file and the names, never a
    value."""
    path, key = spec.secrets_path, facts.key_file
    if path is None or key is None:
        return
    where = f"lanes.{lane}.{spec.secrets_key}"
    if not key.exists:
        first = (
            f"{engines.for_lane(spec).api_key_env}=$(openssl rand -hex 32)"
            if spec.secrets_key == "api_key_file"
            else "NAME=VALUE"
        )
        yield Finding(
            "api-key",
            f"{where}: {path} does not exist",
            f"create it: `umask 077; echo {first} > {path}` (one NAME=VALUE line per secret)",
            severity=Severity.ERROR,
        )
    elif (held := not_held(lane, spec, key)) is not None:
        yield held
    elif key.mode & 0o077:
        yield Finding(
            "api-key",
            f"{where}: {path} is mode {key.mode:04o}: others can read its secrets",
            f"chmod 600 {path}",
            severity=Severity.ERROR,
        )
    elif key.unreadable is not None:
        yield Finding(
            "api-key",
            f"{where}: {path} cannot be read as NAME=VALUE lines: {key.unreadable}",
            "one NAME=VALUE per line (no `export`); # starts a comment",
            severity=Severity.ERROR,
        )
    elif missing := [n for n in engines.required_secrets(spec) if n not in key.names]:
        yield Finding(
            "api-key",
            f"{where}: {path} does not define {', '.join(missing)}",
            f"add a line {missing[0]}=... to {path}" + (" (one per name)" if missing[1:] else ""),
            severity=Severity.ERROR,
        )
    else:
        yield from _secrets_beside_env(lane, spec, key)


def not_held(lane: str, spec: LaneConfig, key: KeyFile) -> Finding | None:
    """A secrets file laned does not hand to systemd whatever `force` says (the start gate
    asks this too): a symbolic link (systemd would read the file it leads to, /etc/shadow
    as well as the user's own, into the engine's environment; `chmod 600` of the link would
    change that file), or a file of another user."""
    where, path = f"lanes.{lane}.{spec.secrets_key}", spec.secrets_path
    if key.link is not None:
        return Finding(
            "api-key",
            f"{where}: {path} is a symbolic link to {key.link}: laned does not have systemd "
            "read a file through a link as the engine's environment",
            f'name the file itself ({spec.secrets_key} = "{key.link}", if it is yours and '
            f"mode 0600), or put a copy of it in place of the link",
            severity=Severity.ERROR,
        )
    if key.foreign_owner is not None:
        return Finding(
            "api-key",
            f"{where}: {path} belongs to {key.foreign_owner}, not to the user laned runs as",
            "keep the lane's secrets in a file of your own, mode 0600",
            severity=Severity.ERROR,
        )
    return None


def _secrets_beside_env(lane: str, spec: LaneConfig, key: KeyFile) -> Iterator[Finding]:
    for name in key.names:
        if name in spec.env:
            yield Finding(
                "api-key",
                f"lanes.{lane}.env.{name} is set in the config and in {spec.secrets_path}",
                f"keep one: the secrets file for a secret (then remove lanes.{lane}.env.{name})",
                severity=Severity.WARNING,
            )


def _beside_sleepers(lane: str, spec: LaneConfig, facts: LaneFacts) -> list[Finding]:
    """The lane's GPUs as NVML reads them, against what laned's sleepers keep there: those
    asleep now, and those this swap puts to sleep as they were at their last sleep (one not
    measured yet is checked at the start gate, once it sleeps)."""
    sleepers = facts.sleepers
    if facts.host.gpus is None or not (sleepers.pids or sleepers.coming):
        return []
    wanted = gpu_indices(spec)
    gpus = [g for g in facts.host.gpus if wanted is None or g.index in wanted]
    found = beside_sleepers(lane, spec, gpus, sleepers.pids, sleepers.coming)
    unmeasured = sorted(peer for peer, kept in sleepers.coming.items() if not kept)
    if unmeasured:
        found.append(
            Finding(
                "sleepers",
                f"{', '.join(unmeasured)} goes to sleep in this swap and has not slept since laned "
                "started: what it keeps on the GPUs is not known yet",
                "the start gate checks the lane beside it once it sleeps",
                severity=Severity.NOTE,
            )
        )
    return found


def _port(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    if not facts.port_busy:
        return
    if facts.port_peer is not None:
        whose = (
            "the lane itself: its engine runs"
            if facts.port_peer == lane
            else f"lane {facts.port_peer}, which this activation stops first"
        )
        yield Finding("port", f"port {spec.port} is held by {whose}", severity=Severity.NOTE)
        return
    if not facts.lanes_known:
        yield Finding(
            "port",
            f"lanes.{lane}.port {spec.port} is in use; laned does not answer, so whether one of "
            "its own lanes holds it is not known here",
            f"start laned and ask again, or find the holder: ss -ltnp 'sport = :{spec.port}'",
            severity=Severity.WARNING,
        )
        return
    yield Finding(
        "port",
        f"lanes.{lane}.port {spec.port} is already in use by a process laned does not run",
        "a leftover engine may share it silently (vLLM binds with SO_REUSEPORT); "
        f"find it with `ss -ltnp 'sport = :{spec.port}'` and stop it",
        severity=Severity.ERROR,
    )


def _engine(lane: str, spec: LaneConfig, facts: LaneFacts) -> Iterator[Finding]:
    """The engine's own rules (laned.engines: vLLM's ready timeout and generation config),
    then a stop timeout shorter than its graceful shutdown."""
    base = f"lanes.{lane}"
    profile = engines.for_lane(spec)
    yield from profile.preflight(lane, spec, facts)
    if profile.weight_cache is not None:
        yield from profile.weight_cache.preflight(lane, spec, facts)
    shutdown = profile.shutdown(spec)
    graceful = GRACEFUL_STOP_MIN if shutdown is None else shutdown
    if spec.stop_timeout < graceful:
        yield Finding(
            "stop-timeout",
            f"{base}.stop_timeout ({spec.stop_timeout:g} s) is shorter than the engine's graceful "
            f"shutdown (~{graceful:g} s): systemd would SIGKILL it mid-shutdown",
            f'set {base}.stop_timeout = "{graceful:.0f}s" or more',
            severity=Severity.WARNING,
        )


def _sampling(lane: str, spec: LaneConfig) -> Iterator[Finding]:
    """No sampling defaults: requests that send none get the model's raw ones."""
    base = f"lanes.{lane}"
    if spec.sampling is None and engines.for_lane(spec).generation_config(spec) is None:
        yield Finding(
            "sampling",
            f"{base}.sampling is unset: requests that send no sampling parameters get the "
            "model's raw defaults (seed 000: top_p 1.0 on a 2-bit quant is word salad)",
            f"set {base}.sampling = {{ temperature = ..., top_p = ... }} from the model card",
            severity=Severity.WARNING,
        )
