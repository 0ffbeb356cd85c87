"""`laned validate --engine-flags` against real vLLM's own argument parser: every config in
config/ (the seed lanes among them), and a lane with a typo."""

from __future__ import annotations

import functools
import subprocess
import sys
from pathlib import Path

import pytest

from laned.adapters import engine_parser
from laned.cli import main as cli
from tests.helpers import ROOT
from tests.vllm.conftest import RealVllm


def validate(path: Path, python: str) -> str:
    ran = subprocess.run(
        [sys.executable, "-m", "laned", "--config", str(path), "validate", "--engine-flags",
         "--python", python],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout + ran.stderr


def test_the_configs_lanes_flags_are_checked_against_real_vllms_parser(
    real_vllm: RealVllm,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The configs through laned's own CLI in this process, vLLM's parser read once for them all
    # (a command of its own imports vLLM again: 6 s apiece); the typo below runs as a command.
    monkeypatch.setattr(engine_parser, "read_flags", functools.cache(engine_parser.read_flags))

    def validate_here(path: Path) -> str:
        argv = ["--config", str(path), "validate", "--engine-flags", "--python", real_vllm.python]
        code = cli.main(argv)
        out = capsys.readouterr()
        assert code == 0, out.out + out.err
        return out.out + out.err

    said = {}
    for path in sorted((ROOT / "config").glob("*.toml")):
        said[path.name] = validate_here(path)
        print(f"VALIDATE {path.name}\n{said[path.name]}")
    # Seed 002's lane runs on spark-a and spark-b: checked as spark-a's laned would.
    spark = tmp_path / "spark-a.toml"
    text = (ROOT / "config" / "seed-002-2x-dgx-spark.toml").read_text()
    spark.write_text(text.replace("[daemon]\n", '[daemon]\nhost = "spark-a"\n', 1))
    said["spark-a"] = validate_here(spark)
    print(f"VALIDATE seed-002 as spark-a\n{said['spark-a']}")
    # Seed 000's `--kv-cache-memory` is an abbreviation vLLM 0.32 takes (argparse prefixes).
    example = said["laned.example.toml"]
    assert "--kv-cache-memory abbreviates --kv-cache-memory-bytes" in example, example
    assert "lanes.glm53: 0 unknown engine flag(s), 0 note(s), for vLLM 0.32.0" in example
    assert "lanes.dsv41-tp4: 0 unknown engine flag(s)" in said["seed-001-4x-rtx-pro-6000.toml"]
    # Seed 002's image carries a newer vLLM than 0.32: a warning, not an error.
    assert "--swa-block-size is not a flag of vLLM 0.32.0" in said["spark-a"], said["spark-a"]
    # A typo is a warning that names the nearest flag; the config stays valid.
    typo = tmp_path / "laned.toml"
    typo.write_text(
        f'[daemon]\nunit_dir = "{tmp_path}/u"\nbin_dir = "{tmp_path}/b"\nstate_dir = "{tmp_path}/s"\n'
        '[lanes.v]\nport = 8001\nserved_model_name = "v"\n'
        'args = ["--max-modle-len", "2048", "--enforce-eager"]\n'
        f'[lanes.v.exec]\ncommand = ["{real_vllm.python}", "-m", "vllm.entrypoints.openai.api_server"]\n'
    )
    out = validate(typo, real_vllm.python)
    assert "warning: lanes.v.args[0]: --max-modle-len is not a flag of vLLM 0.32.0" in out, out
    assert "did you mean --max-model-len?" in out and "1 warning(s)" in out, out
