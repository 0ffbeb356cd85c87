"""Preflight, fit and the GPU gate's decision: pure checks over facts (no I/O)."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laned.adapters import secret_files
from laned.adapters.podman import parse_container
from laned.core.facts import GIB, GpuReading, HostFacts, KeyFile, LaneFacts, blocking
from laned.core.gpu_memory import held
from laned.core.lanes import LaneStatus, phase_durations
from laned.core.modes import Mode
from laned.errors import ConfigError, Finding, Severity
from laned.preflight.fit import fit
from laned.preflight.rules import evaluate, model_path, not_held
from laned.validation.load import LaneConfig, parse_config
from tests.helpers import parse_phase

ENV = {"HOME": "/home/op"}
CONTAINER = """
[lanes.c]
port = 8004
served_model_name = "m"
api_key_file = "/keys/c.env"
sampling = { temperature = 1.0 }
stop_timeout = "60s"
start_timeout = "5m"
{extra}
[lanes.c.container]
image = "vllm-local"
entrypoint = "vllm"
command = ["serve", "/models/dsv41/weights"]
volumes = ["/srv/models:/models:ro", "/srv/patches/site.py:/usr/lib/site.py:ro"]
{container}
"""


def lane(extra: str = "", container: str = "") -> LaneConfig:
    text = CONTAINER.replace("{extra}", extra).replace("{container}", container)
    return parse_config(text, "t.toml", ENV).lanes["c"]


def gpu(index: int, total_gib: float, used_gib: float = 0.0, pids: int = 0) -> GpuReading:
    processes = tuple((1000 + i, int(used_gib * GIB / max(pids, 1))) for i in range(pids))
    return GpuReading(index, "NVIDIA H200", int(total_gib * GIB), int(used_gib * GIB), processes)


HOST = HostFacts((gpu(0, 96), gpu(1, 96)), "", mem_total_gib=123.0, mem_available_gib=100.0)
GOOD = LaneFacts(
    host=HOST,
    paths={"/srv/models/dsv41/weights": True, "/srv/models": True, "/srv/patches/site.py": True},
    disk_total_gib=4000,
    key_file=KeyFile(True, 0o600, ("VLLM_API_KEY",)),
    image_id="sha256:aaa",
)


def checks(findings: list[Finding], severity: Severity) -> set[str]:
    return {f.where for f in findings if f.severity is severity}


def test_a_good_lane_passes_with_nothing_to_say() -> None:
    assert evaluate("c", lane(), GOOD) == []


def test_model_dir_is_found_through_the_bind_mounts() -> None:
    assert model_path(lane()) == "/srv/models/dsv41/weights"
    assert model_path(lane('model_dir = "/data/m"')) == "/data/m"
    hub = lane().model_copy(
        update={"container": lane().container.model_copy(update={"command": ("serve", "org/m")})}  # type: ignore[union-attr]
    )
    assert model_path(hub) is None


@pytest.mark.parametrize(
    ("facts", "check", "words"),
    [
        (replace(GOOD, image_id=None), "image", "not present locally"),
        (
            replace(GOOD, paths={**GOOD.paths, "/srv/models/dsv41/weights": False}),
            "paths",
            "model directory",
        ),
        (replace(GOOD, paths={**GOOD.paths, "/srv/patches/site.py": False}), "paths", "volumes[1]"),
        (replace(GOOD, key_file=KeyFile(False)), "api-key", "does not exist"),
        (replace(GOOD, key_file=KeyFile(True, 0o644, ("VLLM_API_KEY",))), "api-key", "chmod 600"),
        (replace(GOOD, key_file=KeyFile(True, 0o600, ("HF_TOKEN",))), "api-key", "VLLM_API_KEY"),
        (
            replace(GOOD, key_file=KeyFile(True, 0o600, unreadable="line 2 is not NAME=VALUE")),
            "api-key",
            "line 2",
        ),
        (replace(GOOD, port_busy=True), "port", "SO_REUSEPORT"),
    ],
)
def test_each_error_blocks_and_names_the_place(facts: LaneFacts, check: str, words: str) -> None:
    found = evaluate("c", lane(), facts)
    errors = blocking(found)
    assert [f.where for f in errors] == [check]
    assert words in errors[0].message + errors[0].hint
    assert "lanes.c" in errors[0].message or check in ("image",)


def test_a_secrets_file_through_a_link_or_of_another_user_is_refused_never_chmodded(
    tmp_path: Path,
) -> None:
    """Issue 53: a secrets file linked to /etc/shadow was read through the link (its mode,
    its names) and the hint said `chmod 600 <the link>`, which changes /etc/shadow. The link
    is read as a link; the hint names where it leads; the same finding stops a forced start
    (laned.owner.gate asks not_held)."""
    shadow_mode = os.stat("/etc/shadow").st_mode
    link = tmp_path / "c.env"
    link.symlink_to("/etc/shadow")
    key = secret_files.key_file(str(link))
    assert key == KeyFile(exists=True, link="/etc/shadow")
    spec = lane().model_copy(update={"api_key_file": str(link)})
    [error] = blocking(evaluate("c", spec, replace(GOOD, key_file=key)))
    assert error.where == "api-key" and "symbolic link to /etc/shadow" in error.message
    assert "chmod" not in error.hint and 'api_key_file = "/etc/shadow"' in error.hint
    assert not_held("c", spec, key) == error
    assert os.stat("/etc/shadow").st_mode == shadow_mode
    # Another user's file: refused, whatever its mode.
    theirs = KeyFile(True, 0o600, ("VLLM_API_KEY",), foreign_owner="nobody (uid 65534)")
    [error] = blocking(evaluate("c", lane(), replace(GOOD, key_file=theirs)))
    assert "belongs to nobody (uid 65534)" in error.message and "of your own" in error.hint
    if os.getuid() == 0:  # a file chowned away, read as such by the adapter
        other = tmp_path / "other.env"
        other.write_text("VLLM_API_KEY=k\n")
        os.chown(other, 65534, 65534)
        assert secret_files.key_file(str(other)).foreign_owner is not None
    # The user's own file, 0600: read as before.
    own = tmp_path / "own.env"
    own.write_text("VLLM_API_KEY=k\n")
    own.chmod(0o600)
    assert secret_files.key_file(str(own)) == KeyFile(True, 0o600, ("VLLM_API_KEY",))


def test_a_port_held_by_a_group_peer_is_only_a_note() -> None:
    found = evaluate("c", lane(), replace(GOOD, port_busy=True, port_peer="glm"))
    assert blocking(found) == [] and checks(found, Severity.NOTE) == {"port"}


def test_a_held_port_asked_without_laned_is_a_warning_not_a_strangers() -> None:
    """The CLI's own preflight while laned does not answer cannot tell which lane holds a
    port: it warns, and says how to know, instead of calling the holder a stranger."""
    found = evaluate("c", lane(), replace(GOOD, port_busy=True, lanes_known=False))
    assert blocking(found) == [] and checks(found, Severity.WARNING) == {"port"}
    assert "not known" in found[0].message and "ss -ltnp" in found[0].hint


def test_podman_unreachable_is_a_warning_not_a_refusal() -> None:
    found = evaluate("c", lane(), replace(GOOD, image_id=None, image_error="socket down"))
    assert blocking(found) == []
    assert "podman.socket" in found[0].hint


def test_image_drift_names_the_prepare_steps() -> None:
    facts = replace(GOOD, last_image_id="sha256:old")
    plain = evaluate("c", lane(), facts)
    assert checks(plain, Severity.WARNING) == {"image-drift"}
    assert "prepare" in plain[0].hint
    steps = evaluate("c", lane('prepare = [["/srv/kernels/build.sh", "-j8"]]'), facts)
    assert "/srv/kernels/build.sh -j8" in steps[0].hint


def test_engine_warnings_ready_timeout_stop_timeout_sampling_cache() -> None:
    hour = {"start_timeout": 3600.0}
    spec = lane("", "compile_cache = false").model_copy(
        update={"sampling": None, "stop_timeout": 10.0, **hour}
    )
    warned = checks(evaluate("c", spec, GOOD), Severity.WARNING)
    assert warned == {"ready-timeout", "stop-timeout", "sampling", "compile-cache"}
    fixed = lane('env = { VLLM_ENGINE_READY_TIMEOUT_S = "3600" }\n').model_copy(update=hour)
    assert evaluate("c", fixed, GOOD) == []
    short = lane('env = { VLLM_ENGINE_READY_TIMEOUT_S = "600" }\n').model_copy(update=hour)
    assert checks(evaluate("c", short, GOOD), Severity.WARNING) == {"ready-timeout"}
    drain = lane('args = [{ flag = "--shutdown-timeout", value = "120" }]\n')
    assert checks(evaluate("c", drain, GOOD), Severity.WARNING) == {"stop-timeout"}


def test_fit_compares_needs_with_the_host() -> None:
    needs = "needs = { gpus = 4, gpu_memory_gib = 360, host_memory_gib = 47, disk_gib = 520 }\n"
    spec = lane(needs)
    found = fit("c", spec, HOST, disk_total_gib=500)
    messages = " ".join(f.message for f in blocking(found))
    assert "needs 4 GPUs, this host has 2" in messages
    assert "360 GiB of GPU memory" in messages and "192.0 GiB" in messages
    assert "520 GiB of disk" in messages
    big = HostFacts(tuple(gpu(i, 96) for i in range(4)), "", 125.0, 120.0)
    assert fit("c", spec, big, disk_total_gib=4000) == []
    assert checks(fit("c", spec, replace(big, mem_available_gib=20.0), 4000), Severity.WARNING) == {
        "needs"
    }
    pinned = lane("gpus = [0, 3]\n")
    assert "GPU 3 does not exist" in blocking(fit("c", pinned, HOST))[0].message


def test_without_nvml_gpu_needs_are_a_warning_not_a_block() -> None:
    # NVML may be missing where the GPUs are not (laned in a container): warn, do not refuse.
    spec = lane("needs = { gpus = 2 }\n")
    found = fit("c", spec, HostFacts(None, "no NVIDIA driver", 64.0, 60.0))
    assert [(f.severity, f.where) for f in found] == [(Severity.WARNING, "needs")]
    assert "needs 2 GPU(s)" in found[0].message and "no NVIDIA driver" in found[0].message


def test_new_keys_are_validated_with_their_paths() -> None:
    with pytest.raises(ConfigError) as bad:
        lane(
            'gpus = [0, 0]\nneeds = { gpus = 3 }\nprepare = [["/bin/true"]]\n',
            'cache_env = { "b-x" = "rel" }',
        )
    text = str(bad.value)
    assert "lanes.c.gpus" in text
    with pytest.raises(ConfigError) as bad:
        lane("", 'cache_env = { B12X = "relative/path" }')
    assert "lanes.c.container.cache_env.B12X" in str(bad.value)
    assert lane('prepare = ["/srv/fix.sh", ["/srv/build.sh", "-j", "8"]]\n').prepare[1].command == (
        "/srv/build.sh",
        "-j",
        "8",
    )


def test_gate_decision_uses_compute_processes_or_device_memory() -> None:
    limit = 1 * GIB
    assert held([gpu(0, 96, 0.3, pids=1)], limit) == []
    busy = held([gpu(0, 96, 8.0, pids=2), gpu(1, 96)], limit)
    assert busy == ["GPU 0 has 8.00 GiB in use by pid 1000, 1001"]
    unlisted = GpuReading(1, "x", 96 * GIB, 5 * GIB, None)  # NVML cannot list processes
    assert held([unlisted], limit) == ["GPU 1 has 5.00 GiB in use"]


def test_container_state_parses_podman_4_and_5() -> None:
    v4 = {
        "State": {
            "Status": "exited",
            "ExitCode": 137,
            "OOMKilled": True,
            "StartedAt": "2026-12-02T10:00:00Z",
        },
        "Image": "sha256:abc",
    }
    v5 = {
        "State": {
            "Status": "running",
            "ExitCode": 0,
            "OomKilled": False,
            "StartedAt": "2026-12-02T10:00:00.1+00:00",
        }
    }
    a, b = parse_container("x", v4), parse_container("y", v5)
    assert (a.status, a.exit_code, a.oom_killed, a.image_id) == ("exited", 137, True, "sha256:abc")
    assert (b.status, b.oom_killed) == ("running", False)
    assert parse_container("z", {"State": "running"}).status == "running"


def test_startup_phases_and_prediction() -> None:
    assert parse_phase("INFO [autotuner.py:1] FlashInfer autotune: tuning kernels 3/8") == (
        "FlashInfer autotune",
        37.5,
    )
    assert parse_phase("DeepGEMM JIT: compiling kernels 2/4") == ("DeepGEMM JIT", 50.0)
    marks = [("loading weights", 10.0), ("FlashInfer autotune", 40.0), ("serving", 100.0)]
    assert phase_durations(marks, 101.0) == [
        ("loading weights", 30.0),
        ("FlashInfer autotune", 60.0),
        ("serving", 1.0),
    ]
    status = LaneStatus("c", Mode.STARTING, started_at=10.0, phases=marks, last_cold_start=120.0)
    shown = status.startup(70.0)
    assert shown is not None and shown["remaining"] == 60.0 and shown["elapsed"] == 60.0
    assert LaneStatus("c").startup(70.0) is None


@given(st.text(max_size=300))
def test_unknown_log_lines_never_break_phase_parsing(line: str) -> None:
    found = parse_phase(line)
    assert found is None or (isinstance(found[0], str) and (found[1] is None or found[1] >= 0))


def test_a_lanes_gpus_come_from_gpus_its_cdi_devices_or_cuda_visible_devices() -> None:
    from laned.config.model import gpu_indices

    assert gpu_indices(lane("gpus = [1, 0]\n")) == (1, 0)
    cdi = 'devices = ["nvidia.com/gpu=1", "nvidia.com/gpu=0"]'
    assert gpu_indices(lane("", cdi)) == (0, 1)
    assert gpu_indices(lane("", 'devices = ["nvidia.com/gpu=all"]')) is None
    assert gpu_indices(lane('env = { CUDA_VISIBLE_DEVICES = "2,3" }\n')) == (2, 3)
    assert gpu_indices(lane()) is None
    host = HostFacts(tuple(gpu(i, 96) for i in range(4)), "", 125.0, 120.0)
    assert fit("c", lane("needs = { gpus = 2, gpu_memory_gib = 190 }\n", cdi), host) == []
    short = fit("c", lane("needs = { gpu_memory_gib = 200 }\n", cdi), host)
    assert "its GPUs have 192.0 GiB" in short[0].message, "two of the four GPUs are the lane's"


GLM_CONFIG = {"eos_token_id": [151329, 151336, 151338], "top_k": 40, "temperature": 1.0}


def test_the_models_own_sampling_keys_are_noted_under_the_lanes_sampling() -> None:
    found = evaluate("c", lane(), replace(GOOD, model_generation_config=GLM_CONFIG))
    notes = [f for f in found if f.where == "sampling"]
    assert [f.severity for f in notes] == [Severity.NOTE]
    assert "top_k=40" in notes[0].message and "temperature" not in notes[0].message
    assert "stop-ids" not in checks(found, Severity.WARNING)


def test_a_generation_config_dir_without_the_models_stop_ids_is_warned() -> None:
    spec = lane('args = [{ flag = "--generation-config", value = "/models/gen" }]\n')
    facts = replace(
        GOOD,
        model_generation_config=GLM_CONFIG,
        flag_generation_config={"temperature": 1.0, "top_p": 0.95},
    )
    found = evaluate("c", spec, facts)
    warned = [f for f in found if f.where == "stop-ids"]
    assert warned and warned[0].severity is Severity.WARNING
    assert "#45591" in warned[0].message and "eos_token_id" in warned[0].hint
    # The same directory with the model's stop ids is fine.
    keeps = replace(facts, flag_generation_config={**GLM_CONFIG, "top_p": 0.95})
    assert "stop-ids" not in checks(evaluate("c", spec, keeps), Severity.WARNING)


def test_the_generation_config_dir_is_found_through_the_bind_mounts() -> None:
    from laned.preflight.rules import generation_config_path

    spec = lane('args = [{ flag = "--generation-config", value = "/models/gen" }]\n')
    assert generation_config_path(spec) == "/srv/models/gen"
    assert generation_config_path(lane('args = ["--generation-config", "vllm"]\n')) is None
