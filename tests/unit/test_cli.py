"""The command line forgives what systemctl and podman users type: global options after the
command, token counts as vLLM writes them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from laned.cli.main import main
from laned.config.durations import parse_count
from tests.helpers import ROOT

DEMO = str(ROOT / "config" / "demo.toml")


@pytest.mark.parametrize("argv", [["--config", DEMO, "validate"], ["validate", "--config", DEMO]])
def test_config_goes_before_or_after_the_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 0
    assert "demo.toml: valid (2 lane(s)" in capsys.readouterr().out


def test_the_option_after_the_command_wins(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "/nonexistent.toml", "validate", "--config", DEMO]) == 0
    assert main(["--config", DEMO, "validate", "--config", "/nonexistent.toml"]) == 2
    assert "/nonexistent.toml: 1 error" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("text", "count"),
    [
        ("8192", 8192),
        ("8k", 8000),
        ("8K", 8192),
        ("32K", 32768),
        ("512K", 524288),
        ("1M", 1048576),
        ("1m", 1000000),
        ("25.6k", 25600),
    ],
)
def test_token_counts_read_as_vllm_reads_them(text: str, count: int) -> None:
    assert parse_count(text) == count


@pytest.mark.parametrize("text", ["", "8x", "-1", "1.5K", "k"])
def test_what_is_not_a_count_is_refused_with_the_forms_it_takes(text: str) -> None:
    with pytest.raises(ValueError, match=r"8k|fraction"):
        parse_count(text)


def test_bench_refuses_a_bad_size_before_it_reaches_the_engine(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["--config", DEMO, "bench", "dsv41", "--contexts", "8k,lots"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "'lots' is not a count" in err and "8K,16K,32K" in err


def test_the_status_table_colours_states_on_a_terminal_only() -> None:
    from laned.cli.client import table

    lanes = [
        {"name": "a", "state": "ready", "desired": "active", "port": 8000,
         "served_model_name": "m", "restarts": 0, "reason": ""},
        {"name": "bb", "state": "failed", "desired": "active", "port": 8001,
         "served_model_name": "n", "restarts": 5, "reason": "crash-loop"},
    ]  # fmt: skip
    plain, coloured = table(lanes), table(lanes, colour=True)
    assert "\033[" not in plain
    assert "\033[32mready" in coloured and "\033[31;1mfailed" in coloured
    # The colour codes do not shift the columns: stripped, both tables are the same.
    assert re.sub(r"\033\[[0-9;]*m", "", coloured) == plain


def test_init_writes_a_starter_config_and_never_overwrites_one_unasked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "cfg" / "laned.toml"
    assert main(["init", "--config", str(target), "--example", "demo"]) == 0
    out = capsys.readouterr().out
    assert target.read_text() == (ROOT / "config" / "demo.toml").read_text()
    assert "edit next:" in out and "it validates now (lanes: dsv41, glm53)" in out
    target.write_text("# mine\n")
    assert main(["init", "--config", str(target)]) == 2
    assert "exists; nothing written" in capsys.readouterr().err
    assert target.read_text() == "# mine\n"
    assert main(["init", "--config", str(target), "--force"]) == 0
    assert (tmp_path / "cfg" / "laned.toml.bak").read_text() == "# mine\n"
    assert "api_key_file" in capsys.readouterr().out  # seed 000's lanes: what to edit


def complete(words: list[str]) -> list[str]:
    """What bash completes for `words` (the last one being typed), with laned's script."""
    script = (
        'source <(laned completion bash); COMP_WORDS=("$@"); COMP_CWORD=$(($# - 1)); '
        '_laned; printf "%s\\n" "${COMPREPLY[@]}"'
    )
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = subprocess.run(
        ["bash", "-c", script, "bash", *words], capture_output=True, text=True, env=env, check=True
    )
    return [line for line in out.stdout.splitlines() if line]


def test_bash_completes_commands_options_and_lane_names_from_the_config() -> None:
    assert complete(["laned", "deac"]) == ["deactivate"]
    assert complete(["laned", "status", "--w"]) == ["--watch"]
    assert complete(["laned", "--config", DEMO, "activate", ""]) == ["dsv41", "glm53"]
    assert complete(["laned", "activate", "--config", DEMO, "g"]) == ["glm53"]
    assert complete(["laned", "--config", DEMO, "events", "--lane", "d"]) == ["dsv41"]


def test_validate_says_which_lanes_may_run_together_and_why(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    lanes = (("big", 8001, "[0, 1]", "0.9"), ("s1", 8002, "[2, 3]", "0.45"),
             ("s2", 8003, "[2, 3]", "0.45"), ("whole", 8004, "", "0.92"))  # fmt: skip
    text = "".join(
        f'[lanes.{n}]\nport = {p}\nserved_model_name = "{n}"\n'
        + (f"gpus = {g}\n" if g else "")
        + f'args = ["--gpu-memory-utilization", "{u}"]\n[lanes.{n}.exec]\ncommand = ["vllm", "serve", "m"]\n'
        for n, p, g, u in lanes
    )
    path = tmp_path / "laned.toml"
    path.write_text(text)
    assert main(["--config", str(path), "validate"]) == 0
    out = capsys.readouterr().out
    assert "which lanes may run together (GPU memory not read here" in out
    rows = {tuple(line.split()[:3]) for line in out.splitlines() if line.startswith("  ")}
    assert ("big", "s1", "together") in rows and ("s1", "s2", "together") in rows
    assert ("s1", "whole", "apart") in rows and ("big", "whole", "apart") in rows
    assert "s1 0.45 + whole 0.92 of its memory is more than all of it" in out


def test_status_fit_shows_each_gpu_with_its_lanes_and_what_is_left() -> None:
    from laned.cli.client import fit_table
    from laned.config.load import parse_config
    from laned.core.placement import Footprint
    from laned.preflight.facts import GpuReading, HostFacts
    from laned.preflight.fit import fit_report

    text = "".join(
        f'[lanes.{n}]\nport = {p}\nserved_model_name = "{n}"\ngpus = {g}\n'
        f'args = ["--gpu-memory-utilization", "{u}"]\n[lanes.{n}.exec]\ncommand = ["vllm", "serve", "m"]\n'
        for n, p, g, u in (("big", 8001, "[0]", "0.5"), ("small", 8002, "[0]", "0.25"))
    )
    lanes = parse_config(text, "t.toml", {"HOME": "/h"}).lanes
    gpu = GpuReading(0, "H100", 80 * 2**30, 0, ())
    asleep = [Footprint.asleep("nap", {0: 6 * 2**30}, 8003)]  # a sleeper: what it keeps
    body = fit_report(
        dict(lanes), HostFacts((gpu,), "", 100.0, 90.0), placed=["big", "small"], asleep=asleep
    )
    out = fit_table(body)
    assert (
        "placed now:\n  GPU 0 (80 GiB): big 40.0 GiB, small 20.0 GiB, nap 6.0 GiB asleep; "
        "14.0 GiB left" in out
    )
    assert "  big              small            together  both fit on GPU 0" in out
