"""Rendering: golden files byte for byte, the seed's command line flag for flag, writing and checking."""

from __future__ import annotations

import os
import shlex
import signal
import stat
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from laned.cli.main import main
from laned.config.secrecy import names_in
from laned.engines.vllm import CACHES
from laned.render import plan as render
from laned.render.units import daemon_unit
from laned.render.wrapper import engine_argv
from laned.validation.load import load_config, parse_config
from tests.helpers import ROOT, wait_until

GOLDEN = ROOT / "tests" / "golden"
EXAMPLE = str(ROOT / "config" / "laned.example.toml")
ENV = {"HOME": "/home/op"}

# Seed 000's `podman run` line, verbatim but for $RECIPE (the pack's recipe directory,
# /var/aios/recipes/dsv41 in the example) and the FlashInfer mount's destination, which
# the seed elides as "...".
SEED_COMMAND = r"""
podman run --rm --name dsv41-flash-exl3 \
  --device nvidia.com/gpu=all --network host --ipc host \
  --security-opt label=disable \
  -v /var/aios/models:/var/aios/models:ro \
  -v /var/aios/recipes/dsv41/patches/vllm/sitecustomize.py:/usr/lib/python3.12/sitecustomize.py:ro \
  -v /var/aios/recipes/dsv41/patches/flashinfer/sparse_mla_sm120_prefill.cu:/usr/local/lib/python3.12/dist-packages/flashinfer/data/csrc/sparse_mla_sm120_prefill.cu:ro \
  -e XMOE_EXT=xmoe -e XMOE_DIR=/opt/xmoe/build \
  -v /var/aios/recipes/dsv41/kernels/build:/opt/xmoe/build:ro \
  -e VLLM_PLUGINS=vllm_exl3 \
  -e DSV41_ENGRAM_DISK=1 -e DSV41_ENGRAM_DISK_THREADS=32 \
  -e NCCL_CUMEM_ENABLE=0 -e PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  --entrypoint vllm dsv41-flash-exl3-sm120 serve /var/aios/models/dsv41-flash-exl3-2bpw \
  --tensor-parallel-size 2 --host 0.0.0.0 --port 8004 \
  --max-model-len 524288 \
  --kv-cache-dtype fp8 --kv-cache-memory 8589934592 \
  --gpu-memory-utilization 0.92 \
  --max-num-seqs 8 --max-num-batched-tokens 4096 \
  --quantization exl3 --language-model-only \
  --tokenizer-mode deepseek_v41 \
  --tool-call-parser deepseek_v41 --reasoning-parser deepseek_v41 \
  --enable-auto-tool-choice \
  --enforce-eager \
  --disable-custom-all-reduce \
  --attention-config '{"indexer_kv_dtype":"mxfp4"}' \
  --linear-backend marlin \
  --default-chat-template-kwargs '{"thinking":true,"reasoning_effort":"high"}' \
  --speculative-config '{"method":"dspark","num_speculative_tokens":5,"draft_sample_method":"probabilistic"}' \
  --served-model-name deepseek-v4.1-flash
"""
# What laned adds, on purpose: the key by name, the sampling defaults (seed section 1) as
# --override-generation-config, merged over the model's own generation_config.json (whose
# stop ids stay) instead of a file written into the read-only model dir, and the persistent
# compile cache (seed 001: nothing is cached across --rm containers).
LANED_ADDITIONS_PODMAN = [
    ("-e", "VLLM_API_KEY"),
    ("-v", "/home/op/.cache/laned/lanes/dsv41:/laned/cache"),
    ("-e", "VLLM_ENGINE_READY_TIMEOUT_S=3600"),  # seed 001's fix for long cold starts
    # gpus = [0, 1] with --device nvidia.com/gpu=all: the engine on the GPUs laned places it on
    ("-e", "CUDA_DEVICE_ORDER=PCI_BUS_ID"),
    ("-e", "CUDA_VISIBLE_DEVICES=0,1"),
    *[("-e", f"{k}={v}") for k, v in sorted(CACHES.env.items())],
]
# What laned drops, on purpose: --rm, because the wrapper reads how the container ended
# (podman's OOMKilled) before it removes the container itself.
LANED_REMOVALS_PODMAN = [("--rm", None)]
LANED_ADDITIONS_ENGINE = [("--override-generation-config", '{"temperature":1.0,"top_p":0.95}')]


def pairs(argv: list[str]) -> list[tuple[str, str | None]]:
    """Flags with their values: ("--port", "8004"), ("--enforce-eager", None)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        if i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            out.append((argv[i], argv[i + 1]))
            i += 2
        else:
            out.append((argv[i], None))
            i += 1
    return out


def split_podman(argv: list[str]) -> tuple[list[str], list[str], list[str]]:
    """(podman options, [entrypoint image serve model], engine flags) of a `podman run` argv."""
    assert argv[:2] == ["podman", "run"], argv
    image_at = argv.index("dsv41-flash-exl3-sm120")
    entry_at = argv.index("--entrypoint")
    options = argv[2:entry_at]
    head = [argv[entry_at + 1], *argv[image_at : image_at + 3]]
    return options, head, argv[image_at + 3 :]


@pytest.fixture
def example() -> object:
    return load_config(EXAMPLE, ENV).model_copy(update={"source": "config/laned.example.toml"})


def golden_files(config: object) -> dict[str, str]:
    out = {}
    for item in render.plan(config):  # type: ignore[arg-type]
        path = Path(item.path)
        name = (
            f"{path.parent.parent.name}.{path.name}" if path.name.endswith(".json") else path.name
        )
        out[name] = item.content
    return out


def test_golden_files(example: object) -> None:
    rendered = golden_files(example)
    if os.environ.get("LANED_UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        for name, text in rendered.items():
            (GOLDEN / name).write_text(text)
    for name, text in rendered.items():
        assert (GOLDEN / name).read_text() == text, (
            f"{name} differs from tests/golden (LANED_UPDATE_GOLDEN=1 rewrites)"
        )


def test_rendering_is_deterministic(example: object) -> None:
    assert golden_files(example) == golden_files(
        load_config(EXAMPLE, ENV).model_copy(update={"source": "config/laned.example.toml"})
    )


def test_daemon_unit_golden() -> None:
    text = daemon_unit(
        ["/home/op/.local/bin/laned", "serve"], "/home/op/.config/laned/laned.toml", "/home/op"
    )
    assert (ROOT / "units" / "laned.service").read_text() == text


def install_wrapper(wrapper: str, tmp: Path, secrets: dict[str, str]) -> Path:
    """The wrapper as `serve` in tmp, its record and secrets file there too; the secrets file
    holds `secrets` (systemd's EnvironmentFile=, which the test's env stands in for)."""
    secrets_file = tmp / "dsv41.env"
    secrets_file.write_text("".join(f"{k}={v}\n" for k, v in secrets.items()))
    script = tmp / "serve"
    script.write_text(
        wrapper.replace("record=/home/op", f"record={tmp}")
        .replace("mkdir -p /home/op", f"mkdir -p {tmp}")
        .replace("secrets=/home/op/.config/laned/dsv41.env", f"secrets={secrets_file}")
    )
    script.chmod(0o755)
    return script


def run_wrapper(
    wrapper: str, tmp: Path, env_extra: dict[str, str], oom: str = "false"
) -> list[str]:
    """Run a rendered wrapper with a `podman` that records its `run` argv (NUL-separated) and
    answers `inspect` with OOMKilled=`oom`."""
    fake = tmp / "fakebin"
    fake.mkdir(exist_ok=True)
    record = tmp / "argv"
    (fake / "podman").write_text(
        "#!/bin/bash\n"
        f'if [[ $1 == run ]]; then printf "%s\\0" "$@" > {shlex.quote(str(record))}; fi\n'
        f"if [[ $1 == inspect ]]; then echo {oom}; fi\n"
        f"if [[ $1 == rm ]]; then echo removed > {shlex.quote(str(tmp / 'removed'))}; fi\n"
        "exit 0\n"
    )
    (fake / "podman").chmod(0o755)
    script = install_wrapper(wrapper, tmp, env_extra)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp), **env_extra}
    result = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
    # podman "exited 0" on its own: the wrapper must report a failure (75), not success.
    assert result.returncode == 75, result.stderr
    assert "exited on its own with status 0" in result.stderr
    return ["podman", *record.read_bytes().decode().split("\0")[:-1]]


def test_wrapper_reproduces_the_seed_command_line(example: object, tmp_path: Path) -> None:
    wrapper = golden_files(example)["dsv41-serve"]
    argv = run_wrapper(wrapper, tmp_path, {"VLLM_API_KEY": "sk-secret-value"})
    assert not any("sk-secret-value" in word for word in argv), "the API key leaked into argv"
    assert argv == engine_argv(example, "dsv41", ["VLLM_API_KEY"])  # type: ignore[arg-type]
    seed = shlex.split(SEED_COMMAND.replace("\\\n", " "))
    got_options, got_head, got_engine = split_podman(argv)
    seed_options, seed_head, seed_engine = split_podman(seed)
    assert got_head == seed_head
    expected = Counter(pairs(seed_options) + LANED_ADDITIONS_PODMAN)
    expected.subtract(Counter(LANED_REMOVALS_PODMAN))
    assert Counter(pairs(got_options)) == +expected
    assert Counter(pairs(got_engine)) == Counter(pairs(seed_engine) + LANED_ADDITIONS_ENGINE)


@pytest.mark.parametrize(("oom", "flag"), [("true", "oom=1"), ("false", "oom=0")])
def test_wrapper_records_podmans_oom_verdict_and_removes_the_container(
    example: object, tmp_path: Path, oom: str, flag: str
) -> None:
    wrapper = golden_files(example)["dsv41-serve"]
    run_wrapper(wrapper, tmp_path, {"VLLM_API_KEY": "k"}, oom=oom)
    record = (tmp_path / ".local/state/laned/lanes/dsv41/last-exit").read_text()
    assert "status=0 requested=0" in record and flag in record
    assert (tmp_path / "removed").exists(), "the wrapper must remove the container it ran"
    assert (tmp_path / ".cache/laned/lanes/dsv41").is_dir(), "the compile cache directory"


def gated_podman(tmp: Path, run: str) -> Path:
    """A `podman` whose `run` does `run` (shell) and whose `inspect` — the wrapper's
    clean-up after the engine ended — says it began (`cleanup` file) and then waits for the
    test's `go` file: a slow teardown, as on a cold machine, held open for as long as needed."""
    fake = tmp / "fakebin"
    fake.mkdir(exist_ok=True)
    (fake / "podman").write_text(
        "#!/bin/bash\n"
        f"if [[ $1 == run ]]; then {run}; fi\n"
        "if [[ $1 == inspect ]]; then\n"
        f"  touch {tmp}/cleanup\n"
        f"  for _ in $(seq 600); do [[ -e {tmp}/go ]] && break; sleep 0.05; done\n"
        "  echo false\n"
        "fi\n"
        "exit 0\n"
    )
    (fake / "podman").chmod(0o755)
    return fake


def start_wrapper(example: object, tmp: Path, fake: Path) -> subprocess.Popen[str]:
    script = install_wrapper(golden_files(example)["dsv41-serve"], tmp, {"VLLM_API_KEY": "k"})
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp), "VLLM_API_KEY": "k"}
    return subprocess.Popen(
        [str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_a_stop_during_the_clean_up_leaves_the_engines_own_exit_a_failure(
    example: object, tmp_path: Path
) -> None:
    # The engine exits 0 on its own (vLLM's API server after its engine died); while the
    # wrapper still inspects and removes the container, laned's stop arrives (a restart after
    # failed probes). That stop came too late to be the cause: status 0 stays a failure.
    wrapper = start_wrapper(example, tmp_path, gated_podman(tmp_path, "exit 0"))
    try:
        wait_until(lambda: (tmp_path / "cleanup").exists(), 20, "the clean-up to begin")
        wrapper.send_signal(signal.SIGTERM)
        (tmp_path / "go").touch()
        _, err = wrapper.communicate(timeout=30)
    finally:
        wrapper.kill()
    assert wrapper.returncode == 75, err
    assert "exited on its own with status 0 before a stop arrived" in err
    record = (tmp_path / ".local/state/laned/lanes/dsv41/last-exit").read_text()
    assert record.startswith("status=0 requested=0 late=1 "), record


def test_a_stop_while_the_engine_runs_is_requested_with_the_engines_status(
    example: object, tmp_path: Path
) -> None:
    # The counterpart: the stop reaches a running engine, which exits of SIGTERM (143).
    fake = gated_podman(tmp_path, f"touch {tmp_path}/running; exec sleep 60")
    (tmp_path / "go").touch()
    wrapper = start_wrapper(example, tmp_path, fake)
    try:
        wait_until(lambda: (tmp_path / "running").exists(), 20, "the engine to run")
        wrapper.send_signal(signal.SIGTERM)
        _, err = wrapper.communicate(timeout=30)
    finally:
        wrapper.kill()
    assert wrapper.returncode == 0, err
    assert "stopped on request (status 143)" in err
    record = (tmp_path / ".local/state/laned/lanes/dsv41/last-exit").read_text()
    assert record.startswith("status=143 requested=1 late=0 "), record


def test_the_wrapper_passes_every_secret_by_name_only(example: object, tmp_path: Path) -> None:
    # The names the wrapper finds at run time are the names laned.config.secrecy reads (comments,
    # blank lines, a value continued onto the next line), each as -e NAME, no value in argv.
    text = (
        "# secrets of dsv41\nVLLM_API_KEY=sk-SENTINEL-1\n\n  HF_TOKEN = hf-SENTINEL-2\n"
        "; note\nLONG=SENTINEL-3 \\\nNOT_A_NAME=SENTINEL-4\n"
    )
    wrapper = golden_files(example)["dsv41-serve"]
    script = install_wrapper(wrapper, tmp_path, {})
    (tmp_path / "dsv41.env").write_text(text)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    (fake / "podman").write_text(
        f'#!/bin/bash\nif [[ $1 == run ]]; then printf "%s\\0" "$@" > {tmp_path}/argv; fi\nexit 0\n'
    )
    (fake / "podman").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin", "HOME": str(tmp_path), "VLLM_API_KEY": "sk-SENTINEL-1"}
    subprocess.run([str(script)], env=env, capture_output=True, timeout=30)
    argv = (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]
    passed = [argv[i + 1] for i, word in enumerate(argv) if word == "-e" and "=" not in argv[i + 1]]
    assert passed == names_in(text) == ["VLLM_API_KEY", "HF_TOKEN", "LONG"]
    assert not [word for word in argv if "SENTINEL" in word]


def test_wrapper_refuses_to_start_without_the_key(example: object, tmp_path: Path) -> None:
    script = tmp_path / "serve"
    script.write_text(golden_files(example)["dsv41-serve"])
    script.chmod(0o755)
    result = subprocess.run(
        [str(script)], env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True
    )
    assert result.returncode != 0
    assert "VLLM_API_KEY" in result.stderr and "/home/op/.config/laned/dsv41.env" in result.stderr


def lane_config(tmp: Path, extra: str = "", lanes: str = "a") -> str:
    text = f'[daemon]\nunit_dir = "{tmp}/units"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
    for name in lanes.split():
        text += (
            f'[lanes.{name}]\nport = 8001\nserved_model_name = "m"\n{extra}\n'
            f'[lanes.{name}.exec]\ncommand = ["/bin/true"]\n'
        )
    path = tmp / "laned.toml"
    path.write_text(text)
    return str(path)


def test_render_writes_atomically_with_modes_and_is_idempotent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = lane_config(tmp_path, "sampling = { temperature = 0.7 }", "a b")
    assert main(["--config", path, "render"]) == 0
    out = capsys.readouterr().out
    assert out.count("created") == 4
    unit = tmp_path / "units" / "laned-a.service"
    wrapper = tmp_path / "bin" / "laned-a-serve"
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert stat.S_IMODE(wrapper.stat().st_mode) == 0o755
    # The sampling defaults travel as an override over the model's own generation config.
    assert "--override-generation-config '{\"temperature\":0.7}'" in wrapper.read_text()
    assert main(["--config", path, "render"]) == 0
    assert "unchanged: 4 file(s)" in capsys.readouterr().out
    assert main(["--config", path, "render", "--check"]) == 0
    assert not list((tmp_path / "units").glob(".laned-*"))  # no temp files left behind


def test_render_check_finds_hand_edits_and_modes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = lane_config(tmp_path)
    assert main(["--config", path, "render"]) == 0
    unit = tmp_path / "units" / "laned-a.service"
    unit.write_text(unit.read_text().replace("KillMode=mixed", "KillMode=process"))
    (tmp_path / "bin" / "laned-a-serve").chmod(0o700)
    capsys.readouterr()
    assert main(["--config", path, "render", "--check"]) == 1
    out = capsys.readouterr().out
    assert "-KillMode=process" in out and "+KillMode=mixed" in out
    assert "mode:" in out and "0700" in out
    assert main(["--config", path, "render"]) == 0
    assert "updated" in capsys.readouterr().out
    assert main(["--config", path, "render", "--check"]) == 0


def test_render_removes_only_its_own_files_of_lanes_that_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = lane_config(tmp_path, lanes="a b")
    assert main(["--config", path, "render"]) == 0
    mine = tmp_path / "units" / "hand-written.service"
    mine.write_text("[Service]\nExecStart=/bin/true\n")
    lane_config(tmp_path, lanes="a")
    capsys.readouterr()
    assert main(["--config", path, "render", "--check"]) == 1
    assert "would remove" in capsys.readouterr().out
    assert main(["--config", path, "render"]) == 0
    out = capsys.readouterr().out
    assert "removed" in out and "laned-b.service" in out
    assert not (tmp_path / "units" / "laned-b.service").exists()
    assert not (tmp_path / "bin" / "laned-b-serve").exists()
    assert mine.exists()


def test_render_reports_an_unwritable_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "units"
    blocker.write_text("a file where a directory should be")
    path = lane_config(tmp_path)
    assert main(["--config", path, "render"]) == 1
    err = capsys.readouterr().err
    assert "cannot write" in err and "hint:" in err


def test_cli_exit_codes_and_help(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["version"]) == 0
    assert main(["--config", str(tmp_path / "none.toml"), "validate"]) == 2
    assert "no such file" in capsys.readouterr().err
    bad = tmp_path / "bad.toml"
    bad.write_text('[lanes.a]\nport = 1\nservd_model_name = "x"\n')
    assert main(["--config", str(bad), "validate"]) == 2
    err = capsys.readouterr().err
    assert f"{bad}: lanes.a.servd_model_name: unknown key" in err
    assert main(["bogus"]) == 2
    assert main(["render", "--help"]) == 0
    assert "--check" in capsys.readouterr().out
    good = lane_config(tmp_path)
    assert main(["--config", good, "validate"]) == 0
    env_path = dict(os.environ, LANED_CONFIG=good)
    result = subprocess.run(["laned", "validate"], env=env_path, capture_output=True, text=True)
    assert result.returncode == 0 and "valid (1 lane(s): a)" in result.stdout


def test_example_lane_units_have_no_install_section_and_order_one_way(example: object) -> None:
    files = golden_files(example)
    dsv, glm = files["dsv41.service"], files["glm53-tr3.service"]
    assert "\n[Install]\n" not in dsv and "\n[Install]\n" not in glm
    assert "Conflicts=glm53-tr3.service" in dsv and "Conflicts=dsv41.service" in glm
    assert "After=dsv41.service" in glm and "glm53-tr3.service network" not in dsv
    assert "VLLM_API_KEY" not in dsv and "EnvironmentFile=/home/op/.config/laned/dsv41.env" in dsv


def test_specifiers_and_dollars_are_escaped(tmp_path: Path) -> None:
    text = (
        '[daemon]\nbin_dir = "/opt/100%/b in"\n'
        '[lanes.a]\nport = 1\nserved_model_name = "m"\ndescription = "50% of $HOME"\n'
        '[lanes.a.exec]\ncommand = ["/bin/true"]\n'
    )
    config = parse_config(text, "t", ENV)
    unit = render.plan(config)[0].content
    assert "Description=50%% of $HOME" in unit
    assert 'ExecStart="/opt/100%%/b in/laned-a-serve"' in unit


@pytest.mark.parametrize(
    ("image", "command", "kept", "not_set"),
    [
        ("vllm/vllm-openai", '["vllm", "serve", "/m"]', "DG_JIT_CACHE_DIR", "SGLANG_CACHE_DIR"),
        # SGLang sets DG_JIT_CACHE_DIR from SGLANG_CACHE_DIR whatever was set before.
        (
            "lmsysorg/sglang",
            '["python3", "-m", "sglang.launch_server", "--model-path", "/m"]',
            "SGLANG_CACHE_DIR",
            "DG_JIT_CACHE_DIR",
        ),
        (
            "ghcr.io/ggml-org/llama.cpp:server-cuda",
            '["-m", "/m.gguf"]',
            "CUDA_CACHE_PATH",
            "VLLM_CACHE_ROOT",
        ),
    ],
)
def test_each_engine_gets_its_own_cache_variables(
    image: str, command: str, kept: str, not_set: str
) -> None:
    text = (
        '[lanes.a]\nport = 1\nserved_model_name = "m"\n'
        f'[lanes.a.container]\nimage = "{image}"\ncommand = {command}\n'
        'devices = ["nvidia.com/gpu=all"]\n'
    )
    argv = engine_argv(parse_config(text, "t", ENV), "a")
    pairs = {argv[i + 1].split("=")[0] for i, word in enumerate(argv[:-1]) if word == "-e"}
    assert kept in pairs and not_set not in pairs and "XDG_CACHE_HOME" in pairs, argv


def test_restart_policy_follows_the_managers_version(example: object) -> None:
    # systemd >= 254 backs off by itself (RestartSteps=); older managers leave it to laned.
    new = render.plan(example, systemd_version=254)[0].content  # type: ignore[arg-type]
    assert "Restart=on-failure" in new and "RestartSec=15" in new
    assert "RestartSteps=5" in new and "RestartMaxDelaySec=300" in new
    assert "StartLimitBurst=5" in new and "StartLimitIntervalSec=1800" in new
    old = render.plan(example, systemd_version=252)[0].content  # type: ignore[arg-type]
    assert "Restart=no" in old and "RestartSteps" not in old and "StartLimitIntervalSec=0" in old


def test_the_generation_config_file_of_an_older_laned_is_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """laned once wrote sampling to state_dir/lanes/NAME/generation-config/ and passed
    --generation-config; now it passes --override-generation-config, and cleans the file up."""
    path = lane_config(tmp_path, "sampling = { temperature = 0.7 }", "a")
    old = tmp_path / "state/lanes/a/generation-config/generation_config.json"
    old.parent.mkdir(parents=True)
    old.write_text('{\n  "temperature": 0.7\n}\n')
    (tmp_path / "state/generated.json").write_text(f'{{"files": ["{old}"]}}\n')
    assert main(["--config", path, "render"]) == 0
    assert f"removed   {old}" in capsys.readouterr().out
    assert not old.exists()
