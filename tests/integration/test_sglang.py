"""SGLang lanes on the real user manager, played by the simulator's SGLang face
(laned/sim/sglang.py, from SGLang's source: docs/simulator.md): a start read from SGLang's
own lines, its key handed over in a 0600 file (never argv), the six gates, a swap with a
vLLM lane of its group that releases its GPU memory (its sleep) and resumes it with the canary, a stall seen
in its own /metrics, and its death (SIGKILL of itself) taken for a failure."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
from pathlib import Path

import httpx

from laned import engines
from laned.config.model import GATES
from laned.core.lanes import LaneState
from laned.core.phases import Phase
from tests.helpers import argv_holding, free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_sleep import main_pid
from tests.integration.test_supervisor import run, supervising, until

KEY = "sk-sglang-SENTINEL"
PROBING = 'restart_sec = "200ms"\nprobe = { interval = "200ms", stall_after = "1s", start_interval_max = "200ms" }\n'


def sglang_lane(tmp: Path) -> str:
    (tmp / "models" / "s").mkdir(parents=True, exist_ok=True)
    (tmp / "s.env").write_text(f"SGLANG_API_KEY={KEY}\n")
    (tmp / "s.env").chmod(0o600)
    return (
        PROBING + 'engine = "sglang"\nsleep_level = 1\n'
        f'secrets_file = "{tmp}/s.env"\nsampling = {{ temperature = 0.6 }}\n'
        f'[lanes.s.exec]\ncommand = ["{sys.executable}", "-m", "laned", "sim", "sglang", '
        f'"--model-path", "{tmp}/models/s", "--tp-size", "2", "--context-length", "8192", '
        '"--reasoning-parser", "glm45", "--tool-call-parser", "glm45"]\n'
        '[lanes.s.env]\nLANED_SIM_STARTUP = "1"\nLANED_SIM_WEIGHTS_GIB = "0.5"\n'
        'LANED_SIM_DECODE_TPS = "400"\nLANED_SIM_PREFILL_TPS = "200000"\n'
        'SGLANG_HEALTH_CHECK_TIMEOUT = "1"\n'  # its /health's own wait for a token (20 s)
    )


def test_an_sglang_lane_starts_sleeps_wedges_and_dies_as_sglang_does(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    ports = {"s": free_port(), "v": free_port()}
    lanes = {"s": sglang_lane(tmp_path), "v": FAST}
    config = lane_config(harness, units, tmp_path, lanes, 0, ports=ports)
    assert engines.for_lane(config.lanes["s"]) is engines.SGLANG
    engine = f"http://127.0.0.1:{ports['s']}"
    auth = {"Authorization": f"Bearer {KEY}"}

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("s")
            # Ready with the key it read from the file laned wrote (its /v1 refuses without).
            assert httpx.get(f"{engine}/v1/models", timeout=10).status_code == 401
            assert httpx.get(f"{engine}/v1/models", headers=auth, timeout=10).status_code == 200
            assert argv_holding(KEY) == []
            # Its start, from SGLang's own lines.
            wanted = {Phase.LOADING_WEIGHTS.value, Phase.WEIGHTS_LOADED.value,
                      Phase.PROFILING.value, Phase.CUDA_GRAPHS.value, Phase.API_SERVER.value}  # fmt: skip
            await until(lambda: wanted <= set(sup.statuses["s"].last_phases), 10, "its phases")
            # Its load, read by SGLang's names.
            await until(lambda: sup.engine_summary("s") is not None, 10, "its /metrics read")
            # The six gates, with the key, its /tokenize and its window (/v1/models).
            checked = await sup.check("s")
            assert checked["passed"] is True, checked
            assert set(checked["gates"]) == set(GATES)
            assert checked["gates"]["context"]["measured"]["max_model_len"] == 8192

            # A swap to the vLLM lane of its group: SGLang releases its memory, same process.
            pid = main_pid(harness, units, "s")
            await sup.activate("v")
            assert sup.statuses["s"].state is LaneState.SLEEPING
            assert main_pid(harness, units, "s") == pid
            woke = await sup.activate("s")  # resumed, the canary the same as at the start
            assert woke.state is LaneState.READY and main_pid(harness, units, "s") == pid
            reasons = [e.reason for e in sup.events if e.lane == "s"]
            assert any("waking (level 1)" in r for r in reasons), reasons
            assert not any("canary" in r and "differ" in r for r in reasons), reasons

            # A stall: requests held, nothing moves. SGLang's /health generates a token, gets
            # none within SGLANG_HEALTH_CHECK_TIMEOUT and answers 503 (ServerStatus.UnHealthy):
            # its own verdict, which laned takes at once, before its /metrics could show it.
            httpx.post(f"{engine}/sim/fault", json={"kind": "stall"}, timeout=10)

            def hang() -> None:
                with contextlib.suppress(httpx.HTTPError):
                    httpx.post(f"{engine}/v1/completions", headers=auth, timeout=20,
                               json={"model": "s", "prompt": "hi", "max_tokens": 8})  # fmt: skip

            thread = threading.Thread(target=hang)
            thread.start()
            await until(
                lambda: any(
                    e.lane == "s" and e.reason.startswith("health 503: SGLang's own health check")
                    for e in sup.events
                ),
                15,
                "SGLang's own 503",
            )
            await until(lambda: sup.statuses["s"].restarts == 1 and sup.statuses["s"].state is LaneState.READY, 30, "the restart")  # fmt: skip
            await asyncio.get_running_loop().run_in_executor(None, thread.join, 30)

            # Its death: a child fails, it kills itself (SIGKILL): a failure, restarted.
            httpx.post(f"{engine}/sim/fault", json={"kind": "engine-dead"}, timeout=10)
            await until(lambda: sup.statuses["s"].restarts == 2 and sup.statuses["s"].state is LaneState.READY, 30, "the restart after its death")  # fmt: skip
            last = sup.statuses["s"].last_exit
            assert last is not None and last.verdict.value == "failure", last
            assert "signal 9" in last.reason, last.reason

    run(scenario())
