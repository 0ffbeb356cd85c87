"""A worker rank of a lane over several hosts under laned, against the real user manager:
it serves no API, so it is ready once its unit runs; the head going away ends it (exit 1),
a failure laned restarts; it joins again when the head returns; /sd leaves it out."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from laned.api.front import Front
from laned.core.lanes import LaneState, Verdict
from tests.helpers import free_port, sim_env
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import lane_config
from tests.integration.test_supervisor import run, saw, supervising, until


def head_rank(master: int, port: int, log: Path) -> subprocess.Popen[bytes]:
    """Rank 0 of the lane, run by hand here (on its own host, its laned would run it)."""
    argv = [
        sys.executable, "-m", "laned", "sim", "serve", "/m", "--host", "127.0.0.1",
        "--port", str(port), "--nnodes", "2", "--node-rank", "0",
        "--master-addr", "127.0.0.1", "--master-port", str(master),
    ]  # fmt: skip
    with log.open("ab") as out:
        return subprocess.Popen(
            argv, stdout=out, stderr=subprocess.STDOUT, env=sim_env(LANED_SIM_STARTUP="0.2")
        )


def test_a_worker_rank_runs_without_an_api_and_fails_when_its_head_goes(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    master, head_port = free_port(), free_port()
    lane = (
        'restart_sec = "500ms"\n'
        'nodes = [{ host = "head-host", laned = "http://127.0.0.1:1" }, { host = "this-host", laned = "http://127.0.0.1:2" }]\n'
        'values = { HEAD_IP = "127.0.0.1" }\n'
        f'args = ["--nnodes", "${{NNODES}}", "--node-rank", "${{NODE_RANK}}", "--master-addr", "${{HEAD_IP}}", "--master-port", "{master}"]\n'
        '[lanes.w.rank.1]\nargs = [{ flag = "--headless" }]\n'
    )
    config = lane_config(
        harness, units, tmp_path, {"w": lane}, free_port(), daemon='host = "this-host"\n'
    )
    log = tmp_path / "head.log"

    async def scenario() -> None:
        head = head_rank(master, head_port, log)
        try:
            async with supervising(harness, config) as sup:
                front = Front(sup)
                await sup.activate("w")  # ready: its unit runs (no port to probe)
                view = await front.view("w")
                assert view["rank"]["rank"] == 1 and view["rank"]["headless"] is True
                assert [n["host"] for n in view["rank"]["nodes"]] == ["head-host", "this-host"]
                assert front.sd_targets() == []  # the head's engine speaks for the lane
                await until(lambda: b"all 2 nodes joined" in log.read_bytes(), 20, "the join")
                head.send_signal(signal.SIGKILL)
                head.wait(10)
                await until(lambda: saw(sup, "w", LaneState.RESTARTING), 15, "the worker's failure")
                last = sup.statuses["w"].last_exit
                assert last is not None and (last.code, last.verdict) == (1, Verdict.FAILURE)
                # Restarted, it waits for the head again; the head's return joins them.
                await until(lambda: sup.statuses["w"].state is LaneState.READY, 15, "the restart")
                assert sup.statuses["w"].restarts == 1
                again = head_rank(master, head_port, log)
                try:
                    await until(
                        lambda: log.read_bytes().count(b"all 2 nodes joined") == 2,
                        30,
                        "the second join",
                    )
                    assert sup.statuses["w"].state is LaneState.READY
                finally:
                    again.kill()
                    again.wait(10)
        finally:
            head.kill()
            head.wait(10)

    run(scenario())
