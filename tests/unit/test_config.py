"""The config model: defaults, expansion, and an error for every bad config, with its key path."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from laned import engines
from laned.config.durations import parse_duration, systemd_seconds
from laned.errors import ConfigError, Severity
from laned.validation.load import load_config, parse_config
from tests.helpers import ROOT

ENV = {"HOME": "/home/op"}

MINIMAL = """
[lanes.a]
port = 8001
served_model_name = "m"
[lanes.a.exec]
command = ["/opt/vllm/bin/vllm", "serve", "/models/a"]
"""


def problems(text: str, env: dict[str, str] | None = None) -> list[tuple[str, str]]:
    """(key path, message) of every error a config text produces."""
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), "t.toml", env or ENV)
    return [(p.where, p.message) for p in info.value.problems if p.severity is Severity.ERROR]


def paths_of(text: str) -> set[str]:
    return {path for path, _ in problems(text)}


def test_example_config_is_valid_and_complete() -> None:
    config = load_config(str(ROOT / "config/laned.example.toml"), ENV)
    assert set(config.lanes) == {"dsv41", "glm53", "glm53-sglang", "coder"}
    named = {name: engines.for_lane(spec).name for name, spec in config.lanes.items()}
    assert named == {
        "dsv41": "vllm",
        "glm53": "vllm",
        "glm53-sglang": "sglang",
        "coder": "llamacpp",
    }
    assert config.lanes["glm53-sglang"].group == config.lanes["dsv41"].group
    dsv = config.lanes["dsv41"]
    assert dsv.start_timeout == 3600 and dsv.stop_timeout == 120 and dsv.restart_sec == 15
    assert dsv.api_key_file == "/home/op/.config/laned/dsv41.env"
    assert config.daemon.unit_dir == "/home/op/.config/systemd/user"
    assert [w for w in config.warnings if w.severity is Severity.ERROR] == []


def test_demo_config_is_valid() -> None:
    config = load_config(str(ROOT / "config/demo.toml"), ENV)
    assert config.daemon.default_lane == "dsv41"
    assert all(lane.exec is not None for lane in config.lanes.values())


def test_defaults_follow_xdg_variables_like_systemd() -> None:
    config = parse_config(
        MINIMAL, "t", {"HOME": "/h", "XDG_CONFIG_HOME": "/cfg", "XDG_STATE_HOME": "/st"}
    )
    assert config.daemon.unit_dir == "/cfg/systemd/user"
    assert config.daemon.state_dir == "/st/laned"
    assert config.daemon.bin_dir == "/h/.local/bin"
    plain = parse_config(MINIMAL, "t", {"HOME": "/h"})
    assert plain.daemon.unit_dir == "/h/.config/systemd/user"
    assert plain.daemon.state_dir == "/h/.local/state/laned"
    lane = plain.lanes["a"]
    assert lane.unit is None and lane.group is None and lane.health_path == "/health"


def test_tilde_and_xdg_expand_in_paths() -> None:
    text = (
        MINIMAL
        + '\n[daemon]\nstate_dir = "$XDG_STATE_HOME/x"\nbin_dir = "~/bin"\ntoken_file = "${XDG_CONFIG_HOME}/t"\n'
    )
    config = parse_config(text, "t", {"HOME": "/h", "XDG_STATE_HOME": "/s"})
    assert config.daemon.state_dir == "/s/x"
    assert config.daemon.bin_dir == "/h/bin"
    assert config.daemon.token_file == "/h/.config/t"


def test_xdg_runtime_dir_unset_is_a_clear_error() -> None:
    found = problems(MINIMAL + '\n[daemon]\nstate_dir = "$XDG_RUNTIME_DIR/laned"\n', {"HOME": "/h"})
    assert any("XDG_RUNTIME_DIR" in message for _, message in found)


def test_config_is_immutable() -> None:
    config = parse_config(MINIMAL, "t", ENV)
    with pytest.raises(Exception):  # noqa: B017 - pydantic's frozen error
        config.lanes["a"].port = 1  # type: ignore[misc]


def test_unknown_key_gets_did_you_mean() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(
            MINIMAL.replace("port = 8001", "port = 8001\nserved_modle_name = 'x'"), "t.toml", ENV
        )
    problem = info.value.problems[0]
    assert problem.where == "lanes.a.served_modle_name"
    assert "unknown key" in problem.message
    assert "served_model_name" in problem.hint
    rendered = str(info.value)
    assert rendered.startswith("t.toml: 1 error")
    assert "t.toml: lanes.a.served_modle_name: unknown key" in rendered


def test_unknown_key_in_nested_tables() -> None:
    text = MINIMAL + '[lanes.a.container]\nimage = "x"\nvolume = ["/a:/b"]\n'
    found = problems(text)
    assert ("lanes.a.container.volume", "unknown key `volume`") in found


def test_every_problem_is_reported_at_once() -> None:
    text = """
    [daemon]
    listen = "nowhere"
    default_lane = "dsv4"
    [lanes.dsv41]
    port = 99999
    served_model_name = "m"
    start_timeout = "ten minutes"
    [lanes.dsv41.exec]
    command = ["x"]
    [lanes.Bad]
    port = 8000
    served_model_name = "m"
    """
    found = paths_of(text)
    assert {"lanes.dsv41.port", "lanes.dsv41.start_timeout"} <= found
    # pydantic errors come first; the semantic ones need a parsed model, so fix those and retry
    fixed = text.replace("99999", "8004").replace('"ten minutes"', '"10m"')
    found = paths_of(fixed)
    assert {"daemon.listen", "daemon.default_lane", "lanes.Bad"} <= found


def test_missing_and_wrong_types_name_the_key() -> None:
    found = problems('[lanes.a]\nport = "8001"\n[lanes.a.exec]\ncommand = ["x"]\n')
    assert ("lanes.a.served_model_name", "is required but missing") in found
    assert any(path == "lanes.a.port" and "integer" in msg for path, msg in found)


def test_a_secret_in_the_config_is_refused_with_the_file_to_move_it_to() -> None:
    text = MINIMAL.replace(
        'served_model_name = "m"',
        'served_model_name = "m"\nsecrets_file = "~/.config/laned/a.env"\n'
        'env = { HF_TOKEN = "hf_x", MAX_TOKENS_PER_SECRET_SANTA = { value = "3", secret = false } }',
    )
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text), "t.toml", ENV)
    (only,) = [p for p in info.value.problems if p.severity is Severity.ERROR]
    assert only.where == "lanes.a.env.HF_TOKEN"
    assert "HF_TOKEN=<the value>" in only.hint and "/home/op/.config/laned/a.env" in only.hint
    assert "hf_x" not in only.render(), "a refusal must not repeat the secret"
    # Without a secrets file, the hint names the one to create and the key to set.
    bare = MINIMAL.replace(
        'served_model_name = "m"', 'served_model_name = "m"\nenv = { HF_TOKEN = "x" }'
    )
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(bare), "t.toml", ENV)
    assert "~/.config/laned/a.env, set as lanes.a.secrets_file" in info.value.problems[0].hint


@pytest.mark.parametrize(
    ("lane_toml", "where"),
    [
        ('args = ["--api_key=sk-s3cret"]', "lanes.a.args[0]"),  # vLLM: `_` is `-`
        ('args = [{ flag = "--hf_token", value = "hf_s3cret" }]', "lanes.a.args[0]"),
        ('args = ["--api-k", "sk-s3cret"]', "lanes.a.args[0]"),  # argparse's abbreviation
        ('args = ["--api-key=sk-s3cret"]', "lanes.a.args[0]"),
        ('env = { API_KEY = "sk-s3cret" }', "lanes.a.env.API_KEY"),
        ('env = { TOKEN = "s3cret" }', "lanes.a.env.TOKEN"),
        (
            'container = { image = "img", podman_args = ["-eHF_TOKEN=hf_s3cret"] }',
            "lanes.a.container.podman_args",
        ),
        (
            'container = { image = "img", podman_args = ["--env=HF_TOKEN=hf_s3cret"] }',
            "lanes.a.container.podman_args",
        ),
        ('secrets_file = "/home/op/a.env\\\\"', "lanes.a.secrets_file"),  # continues its unit line
        ('secrets_file = "/home/op/a.env "', "lanes.a.secrets_file"),
    ],
)
def test_a_secret_or_a_unit_breaking_path_is_refused_in_every_spelling(
    lane_toml: str, where: str
) -> None:
    text = textwrap.dedent(MINIMAL).replace('served_model_name = "m"', f'served_model_name = "m"\n{lane_toml}')  # fmt: skip
    if "container =" in lane_toml:
        text = text.split("[lanes.a.exec]")[0]
    with pytest.raises(ConfigError) as info:
        parse_config(text, "t.toml", ENV)
    found = [p for p in info.value.problems if p.severity is Severity.ERROR and p.where == where]
    assert found, [p.render() for p in info.value.problems]
    assert all("s3cret" not in p.render() for p in info.value.problems)


def test_env_file_in_podman_args_is_a_warning_naming_the_secrets_file() -> None:
    config = parse_config(
        textwrap.dedent(
            """
            [lanes.a]
            port = 8001
            served_model_name = "m"
            [lanes.a.container]
            image = "img"
            podman_args = ["--env-file", "/x.env"]
            """
        ),
        "t.toml",
        ENV,
    )
    assert any("--env-file" in w.message and "secrets_file" in w.hint for w in config.warnings)


@pytest.mark.parametrize(
    ("snippet", "path", "words"),
    [
        ('args = ["--port", "9"]', "lanes.a.args[0]", "--port is set by laned"),
        ('args = ["--port=9"]', "lanes.a.args[0]", "--port is set by laned"),
        (
            'args = [{flag = "--served-model-name", value = "x"}]',
            "lanes.a.args[0]",
            "served_model_name",
        ),
        (
            'args = [{flag = "--api-key", value = "k"}]',
            "lanes.a.args[0]",
            "--api-key puts a secret in the engine's argv",
        ),
        (
            'args = [{flag = "--hf-token", value = "k"}]',
            "lanes.a.args[0]",
            "--hf-token puts a secret in the engine's argv",
        ),
        ('env = { VLLM_API_KEY = "k" }', "lanes.a.env.VLLM_API_KEY", "looks like a secret"),
        ('env = { HF_TOKEN = "hf_x" }', "lanes.a.env.HF_TOKEN", "looks like a secret"),
        ('env = { DB_PASSWORD = "x" }', "lanes.a.env.DB_PASSWORD", "looks like a secret"),
        (
            'secrets_file = "/s.env"\napi_key_file = "/k.env"',
            "lanes.a.api_key_file",
            "older name of secrets_file",
        ),
        ('secrets_file = "relative.env"', "lanes.a.secrets_file", "not an absolute path"),
        ('env = { "BAD-NAME" = "1" }', "lanes.a.env.BAD-NAME", "not a valid environment"),
        ('description = "a\\nExecStartPre=/bin/evil"', "lanes.a.description", "control character"),
        ('description = "ends with \\\\"', "lanes.a.description", "backslash"),
        ('unit = "x.socket"', "lanes.a.unit", "not a service unit"),
        ('unit = "laned.service"', "lanes.a.unit", "laned's own unit"),
        ('health_path = "health"', "lanes.a.health_path", "not a URL path"),
        ('group = "GPU 1"', "lanes.a.group", "not a valid group"),
        ('api_key_file = "relative.env"', "lanes.a.api_key_file", "not an absolute path"),
        ('args = ["--x\\u0000y"]', "lanes.a.args[0]", "NUL"),
        ("stop_timeout = 0", "lanes.a.stop_timeout", "longer than zero"),
        ("env = { DSV41_ENGRAM_DISK = 1 }", "lanes.a.args", "--enforce-eager"),
        (
            'sampling = { temperature = 1.0 }\nargs = [{flag = "--override-generation-config", value = "{}"}]',
            "lanes.a.args[0]",
            "conflicts with `sampling`",
        ),
    ],
)
def test_lane_rules(snippet: str, path: str, words: str) -> None:
    text = MINIMAL.replace('served_model_name = "m"', f'served_model_name = "m"\n{snippet}')
    found = problems(text)
    assert any(p == path and words in m for p, m in found), found


@pytest.mark.parametrize(
    ("container", "words"),
    [
        ('ipc = "host"\npodman_args = ["--shm-size", "48g"]', "--shm-size together with ipc"),
        ('podman_args = ["--cap-add", "IPC_LOCK"]', "--cap-add IPC_LOCK with DSV41_ENGRAM_DISK=1"),
        ('podman_args = ["-e", "VLLM_API_KEY=abc"]', "VLLM_API_KEY looks like a secret"),
        ('podman_args = ["-e", "HUGGING_FACE_HUB_TOKEN=abc"]', "looks like a secret"),
        ('podman_args = ["--name", "x"]', "--name is set by laned"),
        ('volumes = ["models:/models"]', "is not absolute"),
        ('volumes = ["/models"]', "SRC:DST"),
        ('name = "bad name"', "not a valid container name"),
    ],
)
def test_container_rules_from_the_seed(container: str, words: str) -> None:
    text = f"""
    [lanes.a]
    port = 8001
    served_model_name = "m"
    args = ["--enforce-eager"]
    env = {{ DSV41_ENGRAM_DISK = "1" }}
    [lanes.a.container]
    image = "img"
    {container}
    """
    found = problems(text)
    assert any(words in m for _, m in found), found


def test_warnings_do_not_block() -> None:
    text = MINIMAL.replace(
        "[lanes.a.exec]", '[lanes.a.container]\nimage = "i"\npodman_args = ["--gpus", "all"]\n#'
    )
    text = text.replace('command = ["/opt/vllm/bin/vllm", "serve", "/models/a"]', "")
    config = parse_config(text, "t", ENV)
    assert [w.where for w in config.warnings] == ["lanes.a.container.podman_args"]
    assert config.warnings[0].severity is Severity.WARNING


@pytest.mark.parametrize(
    ("lines", "warned"),
    [
        ("", True),  # podman gives a container no GPU unless asked
        ("gpus = [0]", True),
        ("gpus = []", False),  # a lane that needs none says so
        ('devices = ["nvidia.com/gpu=all"]', False),
        ('podman_args = ["--device", "/dev/nvidia0"]', False),
    ],
)
def test_a_container_given_no_gpu_is_a_warning_unless_the_lane_needs_none(
    lines: str, warned: bool
) -> None:
    lane, container = (lines, "") if lines.startswith("gpus") else ("", lines)
    text = f"""
    [lanes.a]
    port = 8001
    served_model_name = "m"
    {lane}
    [lanes.a.container]
    image = "ghcr.io/ggml-org/llama.cpp:server-cuda"
    command = ["-m", "/models/m.gguf", "-ngl", "99"]
    {container}
    """
    config = parse_config(textwrap.dedent(text), "t", ENV)
    found = [w for w in config.warnings if w.where == "lanes.a.container.devices"]
    assert bool(found) == warned, config.warnings
    if found:
        assert "given no GPU" in found[0].message and "nvidia.com/gpu=all" in found[0].hint
        assert ("narrows it to lanes.a.gpus" in found[0].hint) == ("gpus" in lines)


def test_lane_needs_exactly_one_of_container_and_exec() -> None:
    neither = MINIMAL.split("[lanes.a.exec]")[0]
    assert "lanes.a" in paths_of(neither)
    both = MINIMAL + '[lanes.a.container]\nimage = "i"\n'
    assert ("lanes.a", "has both of `container` and `exec`") in problems(both)


def test_lanes_on_one_port_never_run_together_and_are_told_so() -> None:
    two = MINIMAL + MINIMAL.replace("lanes.a", "lanes.b")
    parse_config(two, "t", ENV)  # same port: one base URL across swaps, never together
    said = [f for f in parse_config(two, "t", ENV).warnings if f.where == "lanes.b.port"]
    assert said and said[0].severity is Severity.NOTE
    assert "port 8001 is shared by lanes a, b: they never run together" in said[0].message
    own = MINIMAL.replace("8001", "9000")
    assert any("laned's own listen port" in m for _, m in problems(own))


def test_duplicate_units_and_containers() -> None:
    two = (MINIMAL + MINIMAL.replace("lanes.a", "lanes.b")).replace(
        "served_model_name", 'unit = "same.service"\nserved_model_name'
    )
    assert any("also used by lane" in m for _, m in problems(two))


def test_default_lane_did_you_mean() -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(MINIMAL + '[daemon]\ndefault_lane = "b"\n', "t", ENV)
    problem = info.value.problems[0]
    assert problem.where == "daemon.default_lane"
    with pytest.raises(ConfigError) as info:
        parse_config(
            MINIMAL.replace("lanes.a", "lanes.dsv41") + '[daemon]\ndefault_lane = "dsv4"\n',
            "t",
            ENV,
        )
    assert "did you mean 'dsv41'" in info.value.problems[0].hint


def test_unreadable_and_malformed_files(tmp_path: object) -> None:
    with pytest.raises(ConfigError) as info:
        load_config("/nonexistent/laned.toml", ENV)
    assert "no such file" in str(info.value) and "LANED_CONFIG" in str(info.value)
    with pytest.raises(ConfigError) as info:
        parse_config("[lanes.a\nport=1", "bad.toml", ENV)
    assert "not valid TOML" in str(info.value) and "bad.toml" in str(info.value)


def test_a_secrets_file_that_is_a_symlink_is_refused_naming_where_it_leads(
    tmp_path: Path,
) -> None:
    """Issue 53: a link to /etc/shadow passed `laned validate`; systemd's EnvironmentFile=
    follows it. Refused at load (validate, serve, reload), with the real path in the hint."""
    own = tmp_path / "own.env"
    own.write_text("VLLM_API_KEY=k\n")
    (tmp_path / "shadow.env").symlink_to("/etc/shadow")
    (tmp_path / "own-link.env").symlink_to(own)
    lanes = "".join(
        f'[lanes.{name}]\nport = {8001 + i}\nserved_model_name = "{name}"\n{key} = "{tmp_path}/{file}"\n'
        f'exec = {{ command = ["/opt/vllm/bin/vllm", "serve", "/m"] }}\n'
        for i, (name, key, file) in enumerate(
            [("a", "secrets_file", "shadow.env"), ("b", "api_key_file", "own-link.env"),
             ("c", "secrets_file", "own.env")]
        )
    )  # fmt: skip
    path = tmp_path / "laned.toml"
    path.write_text(lanes)
    with pytest.raises(ConfigError) as info:
        load_config(str(path), {"HOME": str(tmp_path)})
    found = {p.where: p for p in info.value.problems}
    assert set(found) == {"lanes.a.secrets_file", "lanes.b.api_key_file"}
    shadow = found["lanes.a.secrets_file"]
    assert "symbolic link to /etc/shadow" in shadow.message
    assert 'secrets_file = "/etc/shadow"' in shadow.hint and "chmod" not in shadow.hint
    assert f'api_key_file = "{own}"' in found["lanes.b.api_key_file"].hint


def test_numbers_in_args_and_env_become_their_text() -> None:
    text = MINIMAL.replace(
        'served_model_name = "m"',
        'served_model_name = "m"\nargs = [{flag = "--tp", value = 2}, {flag = "--u", value = 0.92}]\nenv = { N = 32 }',
    )
    lane = parse_config(text, "t", ENV).lanes["a"]
    assert lane.engine_args() == ["--tp", "2", "--u", "0.92"]
    assert lane.env["N"].value == "32"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("90s", 90),
        ("15m", 900),
        ("1h", 3600),
        ("1h30m", 5400),
        ("500ms", 0.5),
        (600, 600),
        ("42", 42),
    ],
)
def test_durations(text: object, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "10 minutes", "1x", "-5", True, None, "m"])
def test_bad_durations(bad: object) -> None:
    with pytest.raises(ValueError):
        parse_duration(bad)


def test_duration_rendering() -> None:
    assert systemd_seconds(3600) == "3600"
    assert systemd_seconds(1.5) == "1500ms"


def test_hints_name_the_address_laned_listens_on() -> None:
    from laned.config.listener import api_address

    assert api_address("127.0.0.1:55429") == "localhost:55429"
    assert api_address("0.0.0.0:9000") == api_address("[::]:9000") == "localhost:9000"
    assert api_address("10.0.0.5:9000") == "10.0.0.5:9000"
    assert api_address("[fd00::5]:9000") == "[fd00::5]:9000"


def test_the_engines_flags_are_read_from_its_command_too() -> None:
    from laned.config.command import command_flags

    assert command_flags(["vllm", "serve", "/m", "--max-model-len", "8192"]) == [
        "--max-model-len",
        "8192",
    ]
    assert command_flags(["serve", "/m", "--x=1"]) == ["--x=1"]  # a container's command
    assert command_flags(["--model", "/m"]) == ["--model", "/m"]  # an image's entrypoint serves
    python = ["/v/bin/python3", "-u", "-m", "sglang.launch_server", "--model-path", "/m"]
    assert command_flags(python) == ["--model-path", "/m"]
    assert command_flags(["python", "serve.py", "--port-file", "p"]) == ["--port-file", "p"]
    assert command_flags(["taskset", "-c", "0-7", "llama-server", "-m", "x.gguf"]) == [
        "-m",
        "x.gguf",
    ]
    assert command_flags(["env", "A=B", "numactl", "--cpunodebind=0", "vllm", "serve"]) == []
    text = MINIMAL.replace('"/models/a"]', '"/models/a", "--headless"]').replace(
        'served_model_name = "m"', 'served_model_name = "m"\nargs = ["--tp", "2"]'
    )
    lane = parse_config(text, "t", ENV).lanes["a"]
    assert lane.engine_args() == ["--headless", "--tp", "2"] and engines.headless(lane)
    assert lane.arg_words() == ["--tp", "2"] and lane.engine_arg("--tp") == "2"
