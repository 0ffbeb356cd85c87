"""`laned validate --engine-flags` against real llama-server's own options (its --help):
the example config's llama.cpp lane's flags, and a lane with a typo."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from laned.engines.llamacpp import read_help
from tests.llamacpp.conftest import RealLlamacpp


def validate(path: Path) -> str:
    ran = subprocess.run(
        [sys.executable, "-m", "laned", "--config", str(path), "validate", "--engine-flags"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stdout + ran.stderr
    return ran.stdout + ran.stderr


def test_a_llama_lanes_flags_are_checked_against_llama_servers_own_help(
    real_llamacpp: RealLlamacpp, tmp_path: Path
) -> None:
    help_text = subprocess.run(
        [real_llamacpp.server, "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    _, flags = read_help(help_text)
    # laned's own flags and the example's are llama-server's.
    assert {"--port", "--alias", "-a", "--metrics", "--temp", "--top-p", "--n-predict"} <= flags
    assert {"--ctx-size", "-c", "--parallel", "-np", "--threads", "--jinja", "-m"} <= flags
    lane = tmp_path / "laned.toml"
    lane.write_text(
        f'[daemon]\nunit_dir = "{tmp_path}/u"\nbin_dir = "{tmp_path}/b"\nstate_dir = "{tmp_path}/s"\n'
        '[lanes.l]\nport = 8001\nserved_model_name = "l"\nsampling = { temperature = 0.2 }\n'
        'args = ["--ctx-size", "4096", "--n-gpu-layer", "99", "--jinja"]\n'
        f'[lanes.l.exec]\ncommand = ["{real_llamacpp.server}", "-m", "{real_llamacpp.model}"]\n'
    )
    out = validate(lane)
    assert "warning: lanes.l.args[2]: --n-gpu-layer is not a flag of llama.cpp" in out, out
    assert "did you mean --n-gpu-layers?" in out and "1 warning(s)" in out, out
    assert "lanes.l: 1 unknown engine flag(s), 0 note(s)" in out, out
