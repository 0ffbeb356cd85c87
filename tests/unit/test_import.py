"""`laned import`: the seeds' published command lines as lanes (golden files), the wrappers
rendered from them against the seeds' own argv, and each translation and refusal."""

from __future__ import annotations

import io
import os
import re
import shlex
from pathlib import Path

import pytest

from laned import engines
from laned.cli.main import main
from laned.config import paths
from laned.errors import BadImport
from laned.importer.cmdline import CommandLineError
from laned.importer.toml_out import render_import
from laned.importer.translate import import_run
from laned.render.wrapper import cache_env, engine_argv
from laned.validation.load import parse_config
from tests.helpers import ROOT

SEEDS = ROOT / "tests" / "seeds"
GOLDEN = ROOT / "tests" / "golden"
ENV = {"HOME": "/home/op"}
CASES = {
    "import-seed-001.toml": "001-4x-rtx-pro-6000.txt",
    "import-seed-002.toml": "002-2x-dgx-spark.txt",
}


def imported(seed: str) -> str:
    return render_import(import_run((SEEDS / seed).read_text()), seed)


def lane_config(text: str):  # type: ignore[no-untyped-def]
    config = parse_config(text, source="imported", env=ENV)
    (name,) = config.lanes
    return config, name


@pytest.mark.parametrize(("golden", "seed"), sorted(CASES.items()))
def test_the_seeds_import_to_their_golden_lanes(golden: str, seed: str) -> None:
    text = imported(seed)
    if os.environ.get("LANED_UPDATE_GOLDEN"):
        (GOLDEN / golden).write_text(text)
    assert (GOLDEN / golden).read_text() == text, (
        f"{golden} differs (LANED_UPDATE_GOLDEN=1 rewrites)"
    )
    config, _ = lane_config(text)
    # Valid: no errors (parse_config raises on one); warnings only for the per-node placeholders.
    assert all("placeholder" in w.message for w in config.warnings), config.warnings


def test_the_copied_seeds_are_the_published_ones() -> None:
    shared = ROOT.parent / "shared" / "seeds"
    if not shared.is_dir():
        pytest.skip("../shared/seeds is not next to this clone")
    for copy in SEEDS.glob("*.txt"):
        (original,) = shared.glob(copy.name[:3] + "_*.txt")
        assert original.read_text() == copy.read_text(), copy.name


def seed_words(seed: str) -> list[str]:
    """The seed's start command split by shlex alone: lines joined, nothing translated."""
    text = (SEEDS / seed).read_text()
    start = text.index("docker run")
    block = []
    for line in text[start:].splitlines():
        block.append(line)
        if not line.rstrip().endswith("\\"):
            break
    return shlex.split("\n".join(block).replace("\\\n", " "))[2:]


def podman_pairs(words: list[str]) -> list[tuple[str, str | None]]:
    """(option, value) of a run's options, up to the image (`--entrypoint` is the last)."""
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words) and words[i].startswith("-"):
        if words[i] in ("--rm", "--privileged"):
            out.append((words[i], None))
        elif "=" in words[i]:
            out.append(tuple(words[i].split("=", 1)))  # type: ignore[arg-type]
        else:
            out.append((words[i], words[i + 1]))
            i += 1
        i += 1
    return out


@pytest.mark.parametrize("seed", sorted(CASES.values()))
def test_the_wrapper_runs_the_seeds_engine_argv_and_env(seed: str) -> None:
    config, lane = lane_config(imported(seed))
    spec = config.lanes[lane]
    ours = engine_argv(config, lane)
    theirs = seed_words(seed)
    image = spec.container.image
    # The engine's argv after the image: the seed's, flag for flag and in order, with
    # --port and --served-model-name moved to the end, where laned puts what it owns.
    after = theirs[theirs.index(image) + 1 :]
    owned = []
    for flag in ("--port", "--served-model-name"):
        at = after.index(flag)
        owned += after[at : at + 2]
        del after[at : at + 2]
    assert ours[ours.index(image) + 1 :] == after + owned
    # The environment, one for one: the seed's, plus only laned's compile-cache variables.
    options = podman_pairs(theirs)
    env = {v.split("=", 1)[0]: v.split("=", 1)[1] for f, v in options if f == "-e" and v}
    run = ours[: ours.index(image)]
    pairs = podman_pairs(run[2:])
    our_env = dict(v.split("=", 1) for f, v in pairs if f == "-e" and v and "=" in v)
    assert {k: v for k, v in our_env.items() if k not in cache_env(spec)} == env
    # Mounts: the seed's (~ expanded as laned expands it) and the lane's cache directory.
    volumes = {
        paths.expand(v.split(":", 1)[0], ENV) + ":" + v.split(":", 1)[1]
        for f, v in options
        if f == "-v" and v
    }
    our_volumes = {v for f, v in pairs if f == "-v"}
    assert volumes <= our_volumes and len(our_volumes - volumes) == 1
    # The documented translations, and nothing else changed.
    assert ("--device", "nvidia.com/gpu=all") in pairs and ("--gpus", "all") in options
    assert "--gpus" not in run and "--rm" not in run
    kept = {
        (f, v) for f, v in options if f not in ("-e", "-v", "--gpus", "--rm", "-p", "--shm-size")
    }
    assert kept <= {(f, v) for f, v in pairs} | {("--ipc", "host")}
    assert ("--entrypoint", "vllm") in pairs


def test_seed_002_keeps_each_doubled_option_once_and_drops_what_host_networking_makes_moot() -> (
    None
):
    text = imported("002-2x-dgx-spark.txt")
    assert "--gpus all is given twice (lines 33 and 35): kept once" in text
    assert "--shm-size 32g is given twice (lines 39 and 43): kept once" in text
    assert "-p 8000:8000 dropped: with --network host" in text
    assert "--shm-size 32g dropped: with --ipc host" in text
    for name in ("NODE_RANK", "HEAD_IP", "NODE_IP", "CX7_IF", "CX7_IB"):
        assert f"#   ${{{name}}}:" in text
    assert "#   ${HEAD_IP}: --master-addr ${HEAD_IP}" in text
    assert "needs = { gpus = 1," in text  # TP 2 over --nnodes 2: one GPU on each host
    assert "XDG_CACHE_HOME=/cache is inside the container" in text


def test_seed_001_keeps_what_its_notes_say_is_load_bearing() -> None:
    text = imported("001-4x-rtx-pro-6000.txt")
    config, lane = lane_config(text)
    spec = config.lanes[lane]
    assert spec.port == 8000 and spec.served_model_name == "deepseek-v4.1-flash"
    assert spec.needs.gpus == 4
    assert spec.container.podman_args == (
        "-p", "8000:8000", "--ulimit", "memlock=-1:-1", "--cap-add", "IPC_LOCK", "--shm-size", "48g",
    )  # fmt: skip
    transfer = spec.engine_arg("--kv-transfer-config")
    assert transfer is not None and '"secondary_tiers":[{"type":"fs"' in transfer
    assert spec.container.image.endswith(
        "@sha256:08f61e680ddab3f1f1b50f92020133c382630f9798ab0ff5729f8931a604f82d"
    )


def run_import(text: str) -> str:
    return render_import(import_run(text), "test")


def test_placeholders_come_from_set_and_unknown_ones_are_named_at_once() -> None:
    line = 'docker run -v "$MODELS/x":/m -e A="${FOO}" img serve /m --port 8001'
    with pytest.raises(BadImport) as caught:
        import_run(line)
    assert "${MODELS}" in caught.value.message and "${FOO}" in caught.value.message
    assert "--set MODELS=VALUE --set FOO=VALUE" in caught.value.hint
    lane = import_run(line, values={"MODELS": "/srv/models", "FOO": "bar"})
    assert lane.container["volumes"] == ["/srv/models/x:/m"] and lane.env["A"] == ("bar", "")
    # Inside single quotes a shell expands nothing, and neither does laned import.
    lane = import_run("docker run -e A='$FOO' img serve /m")
    assert lane.env["A"] == ("$FOO", "")
    assert import_run("docker run -v $HOME/models:/m img serve /m").container["volumes"] == [
        "~/models:/m"
    ]


@pytest.mark.parametrize(
    ("line", "words"),
    [
        ("docker run img serve $(cat model)", "command substitution"),
        ("docker run img serve `cat model`", "command substitution"),
        ("docker run -e 'A=b img serve /m", "quote is never closed"),
        ("echo hello", "no `docker run` / `podman run` command found"),
        ("docker run a serve /m\ndocker run b serve /m", "2 (lines 1, 2)"),
        ("docker run -e MODEL_DIR img serve /m", "-e MODEL_DIR takes its value from the shell"),
        ("docker run -v <models>:/m img serve /m", "${MODELS}"),
        ("docker run --set-me img serve --hf-token x", "name no model"),
        ("docker run -v ./models:/m img serve /m", "laned import --cwd DIR"),
        ("docker run --gpus device=x img serve /m", "cannot be translated"),
        ("docker run img --port eighty --model m", "is not a port number"),
        ("docker run img --max-model-len 8", "name no model"),
    ],
)
def test_what_cannot_be_imported_is_refused_with_the_reason(line: str, words: str) -> None:
    with pytest.raises(CommandLineError) as caught:
        import_run(line)
    assert words in str(caught.value)


def test_api_keys_leave_every_argv_and_never_reach_the_output() -> None:
    line = "docker run -e VLLM_API_KEY=s3cret-one img serve /m --api-key s3cret-two --port 8123"
    text = run_import(line)
    assert "s3cret" not in text
    config, lane = lane_config(text)
    spec = config.lanes[lane]
    assert spec.secrets_file == "/home/op/.config/laned/m.env" and spec.api_key_file is None
    assert engines.required_secrets(spec) == ("VLLM_API_KEY",)
    assert "--api-key" not in engine_argv(config, lane)


@pytest.mark.parametrize(
    "spelling",
    ["-eHF_TOKEN=hf_s3cret", "--env=HF_TOKEN=hf_s3cret", "-e HF_TOKEN=hf_s3cret"],
)
def test_a_secret_in_any_spelling_of_e_leaves_the_argv_and_the_next_option_stays_one(
    spelling: str,
) -> None:
    # An attached short option is one word: the `-p` after it is an option, not the image.
    line = f"docker run {spelling} -p 8000:8000 img serve /m --api_key=sk-s3cret --hf_token hf_s3cret2 --api-k sk-s3cret3"  # fmt: skip
    imported = import_run(line)
    text = render_import(imported, "test")
    said = " ".join(imported.warnings + imported.changes + list(imported.secrets.values()))
    assert "s3cret" not in text and "s3cret" not in said, said
    config, lane = lane_config(text)
    spec = config.lanes[lane]
    assert spec.container is not None and spec.container.image == "img"
    assert set(engines.required_secrets(spec)) == {"HF_TOKEN", "VLLM_API_KEY"}
    argv = engine_argv(config, lane)
    assert not any(a.startswith(("--api", "--hf")) for a in argv), argv
    assert "8000:8000" in spec.container.podman_args


RECIPES = ROOT / "tests" / "recipes"
CWD = "/home/op/recipes"


def imported_as_golden(recipe: str, golden: str, values: dict[str, str] | None = None) -> str:
    """`laned import` of a recipe, held to its golden file, with no secret's value in it (run
    from /home/op/recipes, where a relative bind mount is taken to be)."""
    text = render_import(
        import_run((RECIPES / recipe).read_text(), "t1", values or {}, cwd=CWD), recipe
    )
    if os.environ.get("LANED_UPDATE_GOLDEN"):
        (GOLDEN / golden).write_text(text)
    assert (GOLDEN / golden).read_text() == text, (
        f"{golden} differs (LANED_UPDATE_GOLDEN=1 rewrites)"
    )
    assert "SENTINEL" not in text, "a secret's value reached the imported TOML"
    return text


SECRET_RECIPES = {
    "import-secrets-vllm-docker-page.toml": ("vllm-docker-page.txt", ["HUGGING_FACE_HUB_TOKEN"]),
    "import-secrets-hf-token-from-shell.toml": (
        "hf-token-from-shell.txt",
        ["HF_TOKEN", "VLLM_API_KEY"],
    ),
    "import-secrets-literal-token.toml": ("literal-token.txt", ["VLLM_API_KEY", "HF_TOKEN"]),
}


@pytest.mark.parametrize(("golden", "case"), sorted(SECRET_RECIPES.items()))
def test_recipes_that_pass_secrets_import_with_a_named_line_for_each(
    golden: str, case: tuple[str, list[str]]
) -> None:
    recipe, names = case
    text = imported_as_golden(recipe, golden)
    config, lane = lane_config(text)  # valid: parse_config raises on an error
    spec = config.lanes[lane]
    assert spec.secrets_file == "/home/op/.config/laned/t1.env"
    assert list(spec.secrets) == names
    assert all(f"{name}=<the value>" in text for name in names)
    assert not (set(spec.env) & set(names)), "a secret stayed in env"
    argv = engine_argv(config, lane, names)
    assert [argv[i + 1] for i, w in enumerate(argv) if w == "-e" and argv[i + 1] in names] == names


def test_a_secret_given_with_set_is_refused_with_the_file_to_use() -> None:
    with pytest.raises(BadImport) as caught:
        import_run((RECIPES / "hf-token-from-shell.txt").read_text(), values={"HF_TOKEN": "hf_x"})
    assert "--set HF_TOKEN" in caught.value.message and "secrets file" in caught.value.hint
    assert "hf_x" not in caught.value.message + caught.value.hint


def test_docker_only_options_are_translated_each_with_a_note() -> None:
    line = (
        "sudo docker run -dit --restart unless-stopped --pull always --runtime nvidia --gpus 2 "
        "-p 127.0.0.1:9100:8000 --ipc=host --shm-size 16g --cap-add SYS_NICE --frobnicate 3 "
        "vllm/vllm-openai:v0.11 --model org/Model-7B --served-model-name m7 m7-alias"
    )
    lane = import_run(line)
    text = render_import(lane, "test")
    for dropped in (
        "-d dropped",
        "-i dropped",
        "-t dropped",
        "--restart dropped",
        "--pull dropped",
        "--runtime dropped",
    ):
        assert dropped in text
    assert lane.container["devices"] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]
    # laned passes --port and probes it on the host: the mapping's two sides now agree.
    assert (
        lane.lane["port"] == 9100
        and (["-p", "127.0.0.1:9100:9100"], "the engine's port, published on the host")
        in lane.podman_args
    )
    assert "--shm-size 16g dropped" in text and lane.container["ipc"] == "host"
    assert lane.lane["aliases"] == ["m7-alias"] and lane.lane["served_model_name"] == "m7"
    assert lane.warnings == [
        "--frobnicate is kept as written in podman_args; laned does not know it"
    ]
    assert ["--cap-add", "SYS_NICE"] in [words for words, _ in lane.podman_args]
    lane_config(text)  # and it validates
    spelled_out = import_run("docker run --detach --interactive --tty img serve /m")
    assert [c.split(" dropped")[0] for c in spelled_out.changes] == ["-d", "-i", "-t"]


def test_a_lines_comment_explains_the_last_flag_on_it() -> None:
    line = (
        "podman run --name x --network host \\\n"
        "  --ulimit memlock=-1 \\  # pinning needs it\n"
        "  img serve /m \\\n"
        "  --kv-cache-dtype fp8 --kv-cache-memory 8589934592 \\  # 8 GiB is plenty\n"
        "  --enforce-eager\n"
    )
    lane = import_run(line)
    assert ("--kv-cache-dtype", "fp8", "") in lane.args
    assert ("--kv-cache-memory", "8589934592", "8 GiB is plenty") in lane.args
    assert (["--ulimit", "memlock=-1"], "pinning needs it") in lane.podman_args


def test_an_option_given_twice_with_two_values_keeps_the_last_and_says_so() -> None:
    lane = import_run("docker run --shm-size 8g --shm-size 16g img serve /m")
    assert lane.podman_args == [(["--shm-size", "16g"], "")]
    assert "kept the last, as docker does" in lane.warnings[0]


def test_the_cli_prints_the_table_and_refuses_bad_input(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seed = str(SEEDS / "001-4x-rtx-pro-6000.txt")
    assert main(["import", "--name", "dsv41", seed]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Imported by `laned import` from 001-4x-rtx-pro-6000.txt.")
    assert "[lanes.dsv41.container]" in out
    monkeypatch.setattr("sys.stdin", io.StringIO("docker run img serve $(x)"))
    assert main(["import", "-"]) == 2
    assert "command substitution" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "missing.txt")]) == 2
    assert "cannot read" in capsys.readouterr().err
    # An imported lane that laned's rules refuse: printed, with the errors, exit 2.
    monkeypatch.setattr("sys.stdin", io.StringIO("docker run img serve /m --port 9000"))
    assert main(["import"]) == 2
    assert re.search(r"port 9000 is laned's own listen port", capsys.readouterr().err)


@pytest.mark.parametrize("example", sorted(p.name for p in (ROOT / "config").glob("*.toml")))
def test_every_example_config_validates_and_renders(example: str) -> None:
    from laned.render import plan as render

    text = (ROOT / "config" / example).read_text()
    if "nodes = [" in text:  # a lane over several hosts: as its head renders it
        text = text.replace("[daemon]\n", '[daemon]\nhost = "spark-a"\n', 1)
    config = parse_config(text, example, ENV)
    assert not [w for w in config.warnings if w.severity.value == "error"]
    files = render.plan(config)
    assert files, example


def test_the_seed_001_lane_is_the_recipe_and_fit_says_what_a_small_host_lacks() -> None:
    from laned.core.facts import GIB, GpuReading, HostFacts
    from laned.preflight.fit import fit_report
    from laned.validation.load import load_config

    config = load_config(str(ROOT / "config" / "seed-001-4x-rtx-pro-6000.toml"), ENV)
    spec = config.lanes["dsv41-tp4"]
    seed = import_run((SEEDS / "001-4x-rtx-pro-6000.txt").read_text())
    # The recipe's flags and environment, one for one (only reasons were added by hand).
    assert [(a.flag, a.value) for a in spec.args] == [(f, v) for f, v, _ in seed.args]
    assert {k: v.value for k, v in spec.env.items()} == {k: v for k, (v, _) in seed.env.items()}
    assert (
        spec.env["VLLM_ENGINE_READY_TIMEOUT_S"].why
        and "22 min" in spec.env["VLLM_ENGINE_READY_TIMEOUT_S"].why
    )
    assert (spec.needs.gpus, spec.needs.gpu_memory_gib) == (4, 378.8)

    def lanes_on(host: HostFacts) -> dict[str, object]:
        return {row["name"]: row for row in fit_report(config.lanes, host)["lanes"]}

    bare = lanes_on(HostFacts(None, "NVML is not available", 23.5, 20.0))["dsv41-tp4"]
    messages = [f["message"] for f in bare["findings"]]  # type: ignore[index]
    assert any("needs 4 GPU(s) with 378.8 GiB" in m and "no GPU here" in m for m in messages)
    assert any("needs 43.8 GiB of RAM, this host has 23.5 GiB" in m for m in messages)
    two = tuple(GpuReading(i, "RTX PRO 6000", int(95.6 * GIB), 0, ()) for i in range(2))
    small = lanes_on(HostFacts(two, "", 125.0, 120.0))["dsv41-tp4"]
    messages = [f["message"] for f in small["findings"]]  # type: ignore[index]
    assert small["fits"] is False  # type: ignore[index]
    assert any("needs 4 GPUs, this host has 2" in m for m in messages)
    assert any("378.8 GiB of GPU memory, its GPUs have 191.2 GiB" in m for m in messages)


ENGINE_RECIPES = {
    # golden: (recipe, engine, served name, port, secrets, gpus)
    "import-engines-sglang-docker-page.toml": (
        "sglang-docker-page.txt", "sglang", "meta-llama/Llama-3.1-8B-Instruct", 30000, ["HF_TOKEN"], 1,
    ),
    "import-engines-sglang-glm-cookbook.toml": (
        "sglang-glm-cookbook.txt", "sglang", "glm-4.6", 30000, ["SGLANG_API_KEY"], 4,
    ),
    "import-engines-llamacpp-server-readme.toml": (
        "llamacpp-server-readme.txt", "llamacpp", "models/7B/ggml-model.gguf", 8080, [], 1,
    ),
    "import-engines-llamacpp-docker-page.toml": (
        "llamacpp-docker-page.txt", "llamacpp", "/models/7B/ggml-model-q4_0.gguf", 8080, ["LLAMA_API_KEY"], 0,
    ),
}  # fmt: skip


@pytest.mark.parametrize(("golden", "case"), sorted(ENGINE_RECIPES.items()))
def test_sglang_and_llama_cpp_recipes_import_as_lanes_of_their_engine(
    golden: str, case: tuple[str, str, str, int, list[str], int]
) -> None:
    recipe, engine, served, port, secrets, gpus = case
    text = imported_as_golden(recipe, golden)
    config, lane = lane_config(text)
    spec = config.lanes[lane]
    assert engines.for_lane(spec).name == engine and spec.engine == engine
    assert (spec.served_model_name, spec.port, list(spec.secrets)) == (served, port, secrets)
    assert spec.needs.gpus == gpus
    argv = engine_argv(config, lane, secrets)
    flags = {"sglang": ["--port", "--served-model-name"], "llamacpp": ["--port", "--alias"]}[engine]
    assert all(argv.count(flag) == 1 for flag in flags), argv  # laned's, once
    assert not [w for w in argv if w.startswith("--api-key")], argv


PUBLISHED = {
    # golden: (recipe, --set values, engine, served name, needs.gpus, volumes as laned reads them)
    "import-published-llamacpp-readme-hf.toml": (
        "llamacpp-readme-hf.txt", {}, "llamacpp", "ggml-org/gemma-3-1b-it-GGUF", 1,
        ["/path/to/models:/models"],
    ),
    "import-published-llamacpp-compose-relative-volume.toml": (
        "llamacpp-compose-relative-volume.txt", {}, "llamacpp", "/models/my_model.gguf", 0,
        ["/home/op/recipes/models:/models"],
    ),
    "import-published-sglang-deepseek-dp-attention.toml": (
        "sglang-deepseek-dp-attention.txt", {}, "sglang", "deepseek-ai/DeepSeek-V3.2-Exp", 8,
        ["/home/op/.cache/huggingface:/root/.cache/huggingface"],
    ),
    "import-published-vllm-data-parallel-two-nodes.toml": (
        "vllm-data-parallel-two-nodes.txt", {"MODEL": "ibm-research/PowerMoE-3b"}, "vllm",
        "ibm-research/PowerMoE-3b", 2, ["/home/op/.cache/huggingface:/root/.cache/huggingface"],
    ),
}  # fmt: skip


@pytest.mark.parametrize(("golden", "case"), sorted(PUBLISHED.items()))
def test_published_launch_lines_name_their_model_and_gpus_by_their_engines_rules(
    golden: str, case: tuple[str, dict[str, str], str, str, int, list[str]]
) -> None:
    recipe, values, engine, served, gpus, volumes = case
    text = imported_as_golden(recipe, golden, values)
    config, lane = lane_config(text)  # valid: parse_config raises on an error
    spec = config.lanes[lane]
    assert engines.for_lane(spec).name == engine
    assert (spec.served_model_name, spec.needs.gpus) == (served, gpus)
    assert spec.container is not None and list(spec.container.volumes) == volumes
    flag = {"vllm": "--served-model-name", "sglang": "--served-model-name"}.get(engine, "--alias")
    argv = engine_argv(config, lane)
    assert argv[argv.index(flag) + 1] == served  # the name clients asked the recipe's engine for


def test_a_relative_bind_mount_is_made_explicit_and_said_to_check(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    line = "docker run -v ./models:/models:ro -v ../hf:/hf -v ~/m:/m -v cache:/c img serve /m"
    lane = import_run(line, cwd="/srv/recipes")
    assert lane.container["volumes"] == ["/srv/recipes/models:/models:ro", "/srv/hf:/hf", "~/m:/m"]
    assert lane.podman_args == [(["-v", "cache:/c"], "a named volume: podman keeps it")]
    [models, hf] = lane.warnings  # ~ is the shell's, as laned's: no warning
    assert "laned import took /srv/recipes (--cwd DIR gives another)" in models
    assert "the bind mount is /srv/recipes/models. Check" in models and "/srv/hf" in hf
    # The CLI takes its current directory, or --cwd.
    recipe = tmp_path / "recipe.txt"
    recipe.write_text("docker run -v ./models:/models img serve /models\n")
    monkeypatch.chdir(tmp_path)
    assert main(["import", str(recipe)]) == 0
    assert f'volumes = ["{tmp_path}/models:/models"]' in capsys.readouterr().out
    assert main(["import", "--cwd", "/srv", str(recipe)]) == 0
    assert 'volumes = ["/srv/models:/models"]' in capsys.readouterr().out


@pytest.mark.parametrize(
    ("mount", "volumes", "podman_args", "warned"),
    [
        ("type=bind,src=./x,dst=/y", ["/r/x:/y"], [], True),
        ("type=bind,source=/x,target=/y,readonly", ["/x:/y:ro"], [], False),
        ("type=bind,source=/x,destination=/y,ro=true", ["/x:/y:ro"], [], False),
        ("type=bind,src=/x,dst=/y,ro=false,bind-propagation=rslave", ["/x:/y:rslave"], [], False),
        ("type=bind,src=~/x,dst=/y", ["~/x:/y"], [], True),  # no shell expands ~ there
        ("type=bind,src=x,dst=/y,relabel=shared", [], ["type=bind,src=/r/x,dst=/y,relabel=shared"], True),
        ("type=volume,src=models,dst=/models", [], ["type=volume,src=models,dst=/models"], False),
        ("type=tmpfs,dst=/tmp", [], ["type=tmpfs,dst=/tmp"], False),
    ],
)  # fmt: skip
def test_a_bind_mount_by_mount_is_a_volume_with_its_path_explicit(
    mount: str, volumes: list[str], podman_args: list[str], warned: bool
) -> None:
    lane = import_run(f"docker run --mount {mount} img serve /m", cwd="/r")
    assert lane.container.get("volumes", []) == volumes
    assert [w for words, _ in lane.podman_args for w in words if w != "--mount"] == podman_args
    assert bool(lane.warnings) is warned, lane.warnings


def test_a_recipe_that_maps_its_weights_from_the_cache_imports_as_a_weight_cache_lane() -> None:
    line = (
        "podman run --name g --device nvidia.com/gpu=all --ipc host --network host "
        "--entrypoint vllm vllm-img serve /models/g --tensor-parallel-size 2 "
        '--load-format ipc_cache --model-loader-extra-config \'{"socket_dir": "/tmp/s"}\' --port 8000'
    )
    lane = import_run(line)
    assert lane.lane.get("weight_cache") is True
    assert all(
        flag not in ("--load-format", "--model-loader-extra-config") for flag, _v, _w in lane.args
    )
    text = render_import(lane, "test")
    assert "weight_cache = true" in text and "ipc_cache" in text  # the note says where it went
    config = parse_config(text, "imported.toml", {"HOME": "/home/op"})
    assert config.lanes[next(iter(config.lanes))].weight_cache is not None
