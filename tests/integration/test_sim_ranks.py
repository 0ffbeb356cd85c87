"""The simulator's ranks over several nodes, over real sockets: the head waits for its
workers before it loads, a worker that goes away kills the head's engine (health 503, exit
0), a head that goes away ends its workers (exit 1), a stop ends a worker cleanly."""

from __future__ import annotations

import signal
from typing import Any

import httpx

from tests.helpers import free_port, port_open, wait_until


def ranks(start_sim: Any, master: int, worker_first: bool = False) -> tuple[Any, Any]:
    """A head and a headless worker joined at 127.0.0.1:master (the worker started first
    when asked: it waits for the head)."""
    common = ("--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", str(master))

    def worker() -> Any:
        return start_sim(*common, "--node-rank", "1", "--headless", ready=False)

    first = worker() if worker_first else None
    if first is not None:
        wait_until(
            lambda: "waiting for the head at 127.0.0.1" in first.log(), 20, "the worker's wait"
        )
    head = start_sim(*common, "--node-rank", "0", ready=False)
    wait_until(
        lambda: "waiting for 1 worker node(s)" in head.log() or first is not None,
        20,
        "the head's wait",
    )
    return head, first or worker()


def test_the_head_loads_only_once_its_worker_joined(start_sim: Any) -> None:
    master = free_port()
    head = start_sim(
        "--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1",
        "--master-port", str(master), ready=False,
    )  # fmt: skip
    wait_until(lambda: "waiting for 1 worker node(s) at 127.0.0.1" in head.log(), 20, "the wait")
    assert "Loading weights" not in head.log() and not port_open(head.port)
    worker = start_sim(
        "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
        "--master-port", str(master), "--headless", ready=False,
    )  # fmt: skip
    head.wait_ready()
    log = head.log()
    assert log.index("node rank 1 joined") < log.index("Loading weights")
    wait_until(lambda: "node rank 1 ready" in worker.log(), 20, "the worker's ready line")
    assert not port_open(worker.port), "a headless rank serves no API"


def test_a_worker_that_dies_kills_the_heads_engine(start_sim: Any) -> None:
    head, worker = ranks(start_sim, free_port())
    head.wait_ready()
    with httpx.Client(base_url=head.url, timeout=5) as client:
        assert client.get("/health").status_code == 200
        worker.process.send_signal(signal.SIGKILL)
        wait_until(
            lambda: client.get("/health").status_code == 503, 10, "the head's /health failing"
        )
    # Like vLLM's API server after an engine death: it exits, with status 0.
    assert head.wait_exit(15) == 0
    assert "node rank 1 went away" in head.log() and "EngineDeadError" in head.log()


def test_a_head_that_dies_ends_its_worker_and_a_stop_ends_it_cleanly(start_sim: Any) -> None:
    head, worker = ranks(start_sim, free_port(), worker_first=True)
    head.wait_ready()
    wait_until(lambda: "node rank 1 ready" in worker.log(), 20, "the worker's ready line")
    head.process.send_signal(signal.SIGKILL)
    assert worker.wait_exit(10) == 1
    assert "lost the head at 127.0.0.1" in worker.log()
    head, worker = ranks(start_sim, free_port())
    head.wait_ready()
    worker.process.send_signal(signal.SIGTERM)
    assert worker.wait_exit(10) == 0
