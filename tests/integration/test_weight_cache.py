"""A lane that keeps its weights in vLLM's weight-cache daemon (`weight_cache`), on the real
user manager, played by the simulator's two processes (laned/sim/preload.py: the daemon and
the engine's --load-format ipc_cache, from vLLM's source, docs/simulator.md): the daemon's
unit starts first and is ready first; an engine's death restarts the engine alone, which
maps the daemon's weights; the daemon's death restarts both; a config change restarts the
daemon only where it changes what it loads, and so does a checkpoint replaced on disk; a
deactivate stops both."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from laned.config.names import weights_unit_name
from laned.core.lanes import LaneState, LaneStatus
from laned.engines.vllm_preload import WC_MAPPED
from laned.sim.weightwire import hash_checkpoint
from laned.validation.load import parse_config
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising, until
from tests.unit.test_weight_cache import shard

GIB = 2**30


SHAPES = {"model.embed_tokens.weight": [64, 16]}


def cache_lane(tmp: Path, health: int, master: int, extra: str = "") -> str:
    (tmp / "models" / "w").mkdir(parents=True, exist_ok=True)
    shard(tmp / "models" / "w" / "model.safetensors", SHAPES, 1)
    return (
        FAST + f"weight_cache = {{ health_port = {health}, master_port = {master} }}\n"
        f'args = ["--tensor-parallel-size", "2", "--max-num-seqs", "8"{extra}]\n'
        f'[lanes.w.exec]\ncommand = ["{sys.executable}", "-m", "laned", "sim", "serve", '
        f'"{tmp}/models/w"]\n'
        '[lanes.w.env]\nLANED_SIM_STARTUP = "2"\nLANED_SIM_WEIGHTS_GIB = "0.5"\n'
    )


def test_a_weight_cache_lane_restarts_from_its_daemon_and_fails_with_it(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    health, master = free_port(), free_port()
    lanes = {"w": cache_lane(tmp_path, health, master)}
    config = lane_config(harness, units, tmp_path, lanes, free_port())
    daemon = weights_unit_name("w", config.lanes["w"])
    units.track(daemon)
    engine = f"http://127.0.0.1:{config.lanes['w'].port}"

    def daemon_pid() -> int:
        return int(harness.show(daemon, "MainPID")["MainPID"])

    async def scenario() -> None:
        async with supervising(harness, config) as sup:

            def status() -> LaneStatus:  # the lane's record now (the machine replaces it)
                return sup.statuses["w"]

            ready = await sup.activate("w")
            assert ready.state is LaneState.READY
            # The daemon came first, and its start job ended with its /health answering 200.
            assert harness.show(daemon, "ActiveState")["ActiveState"] == "active"
            assert httpx.get(f"http://127.0.0.1:{health}/health", timeout=5).status_code == 200
            assert status().weights == "ready" and status().start_kind == "cold"
            await until(lambda: status().weights_held == GIB // 2, 10, "what the daemon holds")
            await until(lambda: WC_MAPPED in status().notes, 10, "the engine mapped the weights")
            first = daemon_pid()

            # The engine dies (exit 0, as vLLM's API server when its engine dies): the engine
            # alone restarts, and maps the daemon's weights again.
            httpx.post(f"{engine}/sim/fault", json={"kind": "engine-dead"}, timeout=10)
            await until(lambda: status().restarts == 1 and status().state is LaneState.READY, 30, "the engine's restart")  # fmt: skip
            assert daemon_pid() == first
            assert status().start_kind == "weight-cache"
            assert set(status().last_starts) == {"cold", "weight-cache"}
            await until(lambda: WC_MAPPED in status().notes, 10, "mapped at the restart")

            # The daemon dies: the lane's failure, counted once; both restart.
            harness.systemctl("kill", "--signal=SIGKILL", daemon)
            await until(lambda: status().restarts == 2 and status().state is LaneState.READY, 30, "both restarted")  # fmt: skip
            assert daemon_pid() not in (0, first)
            assert status().start_kind == "cold"
            reasons = [e.reason for e in sup.events if e.lane == "w"]
            assert any("weight-cache daemon exited" in r for r in reasons), reasons
            assert len(status().failures) == 2  # the engine's death, then the daemon's

            # A change the daemon does not load (--max-num-seqs): the engine alone restarts.
            second = daemon_pid()
            lanes["w"] = lanes["w"].replace('"--max-num-seqs", "8"', '"--max-num-seqs", "4"')
            changed = lane_config(harness, units, tmp_path, lanes, config.lanes["w"].port)
            await sup.reload(changed)
            await sup.restart("w")
            assert daemon_pid() == second and status().start_kind == "weight-cache"
            # One it does (--dtype): both.
            lanes["w"] = lanes["w"].replace(
                '"--max-num-seqs", "4"', '"--max-num-seqs", "4", "--dtype", "float16"'
            )
            changed = lane_config(harness, units, tmp_path, lanes, config.lanes["w"].port)
            await sup.reload(changed)
            await sup.restart("w")
            assert daemon_pid() not in (0, second) and status().start_kind == "cold"
            reasons = [e.reason for e in sup.events if e.lane == "w"]
            assert any("what the weight cache loads changed" in r for r in reasons), reasons

            # Issue 54: a fine-tune of the same shapes copied over the shard (to a temporary
            # name, renamed). vLLM's fingerprint (the headers) does not see it, and neither
            # does the simulated daemon's; laned does before the engine maps: at the engine's
            # next start (a restart here; its death goes the same way: tests/unit/test_owner.py)
            # the daemon restarts first, with an event that names the file.
            third = daemon_pid()
            model = tmp_path / "models" / "w"
            headers = hash_checkpoint(str(model))
            shard(model / "new", SHAPES, 2)
            os.replace(model / "new", model / "model.safetensors")
            assert headers is not None and hash_checkpoint(str(model)) == headers

            def said() -> list[str]:
                return [e.reason for e in sup.events if e.lane == "w"]

            # The last restart's request is over first (a restart under way is joined).
            await until(
                lambda: not any(s.op for s in sup.statuses.values()), 10, "the last restart over"
            )
            await sup.restart("w")
            assert any("(model.safetensors) changed on disk" in r for r in said()), said()
            assert daemon_pid() not in (0, third) and status().start_kind == "cold"
            assert status().weights == "ready"

            # A deactivate stops both.
            await sup.deactivate("w")
            assert harness.show(daemon, "ActiveState")["ActiveState"] in ("inactive", "failed")
            assert status().weights in ("stopped", "failed")

    run(scenario())


def test_an_engine_without_its_daemon_reads_its_weights_from_disk(tmp_path: Path) -> None:
    """vLLM's fallback (ipc_loader.py): no daemon answers, a WARNING, then the disk."""
    import subprocess

    port = free_port()
    argv = [sys.executable, "-m", "laned", "sim", "serve", "m", "--port", str(port),
            "--load-format", "ipc_cache",
            "--model-loader-extra-config", f'{{"socket_dir": "{tmp_path}/none"}}']  # fmt: skip
    proc = subprocess.Popen(
        argv, stderr=subprocess.PIPE, text=True, env={"LANED_SIM_STARTUP": "0.3", "PATH": ""}
    )
    try:
        lines = []
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "Application startup complete" in line:
                break
        text = "".join(lines)
        assert "Weight cache unusable (Weight cache socket" in text, text
        assert "falling back to disk loading" in text and "Loading weights took" in text, text
        config = parse_config(
            f'[lanes.x]\nport = {port}\nserved_model_name = "x"\n'
            '[lanes.x.exec]\ncommand = ["vllm", "serve", "m"]\n',
            "x.toml",
            {"HOME": str(tmp_path)},
        )
        from laned import engines

        seen = engines.for_lane(config.lanes["x"]).read_line(
            next(line for line in lines if "falling back" in line)
        )
        assert seen is not None and seen.note == engines.VLLM.weight_cache.missed  # type: ignore[union-attr]
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr is not None:
            proc.stderr.close()
