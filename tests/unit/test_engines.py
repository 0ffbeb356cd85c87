"""Each engine's profile (laned.engines): which engine a lane runs, the flags laned adds to
its command, the rules of its lanes, its log lines and /metrics as the real engine writes
them, and the key file of an engine that reads its key from no variable (SGLang). Pure, but
for the wrapper run against a stand-in engine that records what it was given."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from laned import engines
from laned.adapters.engine_api import parse_engine_metrics
from laned.config.model import LaneConfig
from laned.core.phases import Phase
from laned.errors import ConfigError
from laned.render.units import lane_unit
from laned.render.wrapper import engine_argv, key_file_path, render_wrapper
from laned.validation.load import parse_config
from tests.helpers import ROOT

GOLDEN = ROOT / "tests" / "golden"


def config(lane: str, tmp: Path = Path("/tmp/laned-test-engines")) -> object:
    text = (
        f'[daemon]\nunit_dir = "{tmp}/units"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
        f'[lanes.a]\nport = 8001\nserved_model_name = "m"\n{lane}'
    )
    return parse_config(text, str(tmp / "laned.toml"), {"HOME": str(tmp)})


def lane(text: str) -> LaneConfig:
    return config(text).lanes["a"]  # type: ignore[attr-defined, no-any-return]


def problems(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        config(text)
    return [f"{p.where}: {p.message} | {p.hint}" for p in caught.value.problems]


@pytest.mark.parametrize(
    ("command", "engine"),
    [
        ('exec = { command = ["vllm", "serve", "/m"] }', "vllm"),
        (
            'exec = { command = ["python3", "-m", "sglang.launch_server", "--model-path", "/m"] }',
            "sglang",
        ),
        (
            'exec = { command = ["/opt/llama.cpp/build/bin/llama-server", "-m", "/m.gguf"] }',
            "llamacpp",
        ),
        (
            'exec = { command = ["taskset", "-c", "0", "/x/llama-server", "-m", "/m.gguf"] }',
            "llamacpp",
        ),
        ('exec = { command = ["env", "A=1", "python", "-m", "sglang.launch_server"] }', "sglang"),
        (
            'container = { image = "lmsysorg/sglang:v0.5.3-cu129", command = ["python3", "-m", "sglang.launch_server"] }',
            "sglang",
        ),
        (
            'container = { image = "ghcr.io/ggml-org/llama.cpp:server", command = ["-m", "/models/x.gguf"] }',
            "llamacpp",
        ),
        ('container = { image = "vllm/vllm-openai:v0.32.0" }', "vllm"),
        # A model path that names another engine does not decide: the program does.
        ('exec = { command = ["/venv/bin/vllm", "serve", "/models/llama.cpp-tiny"] }', "vllm"),
        ('exec = { command = ["/bin/my-engine", "--port-file", "x"] }', "vllm"),  # the default
        ('engine = "llamacpp"\nexec = { command = ["/bin/my-engine"] }', "llamacpp"),
    ],
)
def test_a_lane_names_its_engine_or_its_command_does(command: str, engine: str) -> None:
    assert engines.for_lane(lane(command)).name == engine


def test_an_unknown_engine_is_refused_with_the_closest_name() -> None:
    found = problems('engine = "llama.cpp"\nexec = { command = ["/x"] }')
    assert found == [
        "lanes.a.engine: 'llama.cpp' is not an engine laned knows | did you mean 'llamacpp'? "
        "one of: 'sglang', 'llamacpp', 'vllm' (unset, laned reads it from the command, vLLM by default)"
    ]


def test_llama_server_gets_its_own_flags_and_none_of_vllms() -> None:
    spec = 'sampling = { temperature = 0.6, top_p = 0.95, max_new_tokens = 512 }\nexec = { command = ["/x/llama-server", "-m", "/m.gguf"] }'
    argv = engine_argv(config(spec), "a")  # type: ignore[arg-type]
    assert argv == [
        "/x/llama-server", "-m", "/m.gguf", "--temp", "0.6", "--top-p", "0.95",
        "--n-predict", "512", "--port", "8001", "--alias", "m", "--metrics",
    ]  # fmt: skip
    assert (
        "--metrics"
        not in engine_argv(
            config('args = ["--metrics"]\nexec = { command = ["/x/llama-server"] }'),  # type: ignore[arg-type]
            "a",
        )[2:]
    )


def test_the_rules_of_each_engine() -> None:
    llama = 'exec = { command = ["/x/llama-server"] }\n'
    assert problems(llama + 'args = ["--alias", "x"]') == [
        "lanes.a.args[0]: --alias is set by laned from lanes.a.served_model_name | remove it "
        "here; lanes.a.served_model_name is the single source of truth"
    ]
    [sleep] = problems(llama + "sleep_level = 1")
    assert sleep.startswith("lanes.a.sleep_level: = 1: llama.cpp (llama-server) cannot sleep")
    assert sleep.endswith("| set sleep_level = 0: a swap stops a lane that does not sleep")
    [key] = problems(llama + 'args = [{ flag = "--api-key", value = "k" }]')
    assert "LLAMA_API_KEY=" in key and key.startswith("lanes.a.args[0]: --api-key puts a secret")
    [temp] = problems(llama + 'sampling = { temperature = 0.2 }\nargs = ["--temp", "0.7"]')
    assert temp == (
        "lanes.a.args[0]: --temp conflicts with `sampling` | laned passes lanes.a.sampling "
        "as --temp; keep one of the two"
    )
    sglang = 'exec = { command = ["python", "-m", "sglang.launch_server"] }\n'
    [level] = problems(sglang + "sleep_level = 2")
    assert level.startswith("lanes.a.sleep_level: = 2: SGLang sleeps at level 1 only (")
    assert level.endswith("| set sleep_level = 1 or 0: a swap stops a lane that does not sleep")
    assert lane(sglang + "sleep_level = 1").sleep_level == 1
    [legacy] = problems(sglang + 'api_key_file = "/k.env"')
    assert "SGLANG_API_KEY=" in legacy and legacy.startswith("lanes.a.api_key_file:")
    # vLLM's dev-mode rule is vLLM's: SGLang's memory routes take the key instead.
    assert problems(
        'sleep_level = 1\nargs = ["--host", "0.0.0.0"]\nexec = { command = ["vllm", "serve", "/m"] }'
    )
    assert lane(sglang + 'sleep_level = 1\nargs = ["--host", "0.0.0.0"]').sleep_level == 1
    # vLLM refuses a --gpu-memory-utilization outside (0, 1], wherever it is written.
    vllm = 'exec = { command = ["vllm", "serve", "/m", "--gpu-memory-utilization", "%s"] }'
    [big] = problems(vllm % "1.5")
    assert big.startswith("lanes.a.exec.command: --gpu-memory-utilization '1.5': vLLM takes")
    assert "(vllm/config/cache.py)" in big and "e.g. --gpu-memory-utilization 0.9" in big
    assert len(problems(vllm % "abc")) == 1 and len(problems(vllm % "0")) == 1
    assert lane(vllm % "1").port == 8001
    # Given twice (refused as such), the last is judged, as argparse reads it: args come
    # after the command.
    [twice, arg] = problems('args = ["--gpu-memory-utilization=-1"]\n' + vllm % "0.5")
    assert "is given twice" in twice
    assert arg.startswith("lanes.a.args: --gpu-memory-utilization '-1'"), arg


def test_sglang_gets_its_flags_and_its_sleep_flags() -> None:
    spec = 'sleep_level = 1\nsampling = { temperature = 0.6 }\nexec = { command = ["python", "-m", "sglang.launch_server", "--model-path", "/m"] }'
    argv = engine_argv(config(spec), "a")  # type: ignore[arg-type]
    assert argv[5:] == [
        "--preferred-sampling-params", '{"temperature":0.6}', "--port", "8001",
        "--served-model-name", "m", "--enable-metrics", "--enable-memory-saver",
        "--enable-weights-cpu-backup",
    ]  # fmt: skip
    assert engines.for_lane(lane(spec)).model_of(argv, {}) == engines.Model(
        "/m", "/m", "SGLang serves it by its --model-path, as written"
    )
    named = engines.SGLANG.model_of(["sglang", "serve", "zai-org/GLM-4.6", "--tp", "4"], {})
    assert named is not None and named.source == "zai-org/GLM-4.6"


def test_llama_servers_real_startup_lines_are_its_phases() -> None:
    read = engines.LLAMACPP.read_line
    lines = (GOLDEN / "llamacpp-11434-startup.log").read_text().splitlines()
    seen = [s.phase for s in map(read, lines) if s is not None]
    assert seen == [
        Phase.LOADING_MODEL.value,
        Phase.WEIGHTS_LOADED.value,
        Phase.API_SERVER.value,
        Phase.SERVING.value,
    ]
    assert all(engines.VLLM.read_line(line) is None for line in lines)  # vLLM's words differ


def test_llama_servers_real_metrics_page_reads_by_its_names() -> None:
    page = (GOLDEN / "llamacpp-11434-metrics.txt").read_text()
    sample = parse_engine_metrics(page, engines.LLAMACPP.metrics)
    assert (sample.generation_tokens, sample.prompt_tokens, sample.steps) == (20, 2, 20)
    assert (sample.running, sample.waiting, sample.kv_cache_usage) == (0, 0, 0)
    assert parse_engine_metrics(page).generation_tokens == 0  # vLLM's names find nothing


def test_sglangs_key_reaches_it_in_a_0600_file_never_in_argv(tmp_path: Path) -> None:
    # A stand-in for SGLang: records its argv and the config file it was handed.
    engine = tmp_path / "sglang-launch"
    engine.write_text(
        '#!/bin/bash\nprintf "%s\\n" "$@" > "$0.argv"\n'
        'while [[ $# -gt 0 ]]; do [[ $1 == --config ]] && cp "$2" "$0.config" && stat -c %a "$2" > "$0.mode"; shift; done\n'
    )
    engine.chmod(0o755)
    (tmp_path / "s.env").write_text("SGLANG_API_KEY=sk-SENTINEL\n")
    spec = (
        f'engine = "sglang"\nsecrets_file = "{tmp_path}/s.env"\nexec = {{ command = ["{engine}"] }}'
    )
    cfg = config(spec, tmp_path)
    script = tmp_path / "serve"
    script.write_text(render_wrapper(cfg, "a"))  # type: ignore[arg-type]
    script.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SGLANG_API_KEY": "sk-SENTINEL"}
    subprocess.run([str(script)], env=env, capture_output=True, timeout=30)
    argv = Path(f"{engine}.argv").read_text().splitlines()
    path = key_file_path(cfg, "a")  # type: ignore[arg-type]
    assert argv[-2:] == ["--config", path] and "sk-SENTINEL" not in " ".join(argv)
    assert Path(f"{engine}.config").read_text() == 'api-key: "sk-SENTINEL"\n'
    assert Path(f"{engine}.mode").read_text().strip() == "600"
    # Issue 53: the copy outlived the engine. It goes when the engine ends, and the unit's
    # ExecStopPost= (`cleanup`) removes it however the wrapper ended, laned up or not.
    assert not Path(path).exists()
    Path(path).write_text("left by a killed wrapper\n")
    assert subprocess.run([str(script), "cleanup"], env=env, timeout=30).returncode == 0
    assert not Path(path).exists()
    [stop_post] = [line for line in lane_unit(cfg, "a", 252).splitlines() if line.startswith("ExecStopPost=")]  # type: ignore[arg-type]  # fmt: skip
    assert stop_post.startswith("ExecStopPost=-") and stop_post.endswith("-serve cleanup")
    vllm = config(f'secrets_file = "{tmp_path}/s.env"\nexec = {{ command = ["vllm"] }}', tmp_path)
    assert "ExecStopPost=" not in lane_unit(vllm, "a", 252)  # type: ignore[arg-type]  # no copy
    # A key the file cannot carry is refused, with where it is and what to do.
    bad = subprocess.run(
        [str(script)], env={**env, "SGLANG_API_KEY": 'a"b'}, capture_output=True, text=True
    )
    assert bad.returncode == 1 and "openssl rand -hex 32" in bad.stderr
    assert f"{tmp_path}/s.env (lanes.a.secrets_file)" in bad.stderr
    # No key: no file, no flag.
    os.unlink(f"{engine}.argv")
    del env["SGLANG_API_KEY"]
    subprocess.run([str(script)], env=env, capture_output=True, timeout=30)
    assert "--config" not in Path(f"{engine}.argv").read_text().splitlines()
    assert not Path(path).exists() or stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_every_engine_profile_is_whole() -> None:
    for name, profile in engines.ENGINES.items():
        assert profile.name == name and profile.api_key_env.endswith("_API_KEY")
        assert profile.metrics.summed and set(profile.metrics.summed.values()) <= {
            "running", "waiting", "generation_tokens", "prompt_tokens", "steps",
        }  # fmt: skip
        assert {"--port"} <= set(profile.owned)
        assert profile.sleep is None or profile.sleep.levels
