"""A swap reads the next lane's weights into the page cache while the running lane stops
([daemon.prefetch], docs/prefetch.md): on the real user manager, with simulator lanes whose
weight phase reads real files (LANED_SIM_READ_WEIGHTS), and the page cache read by mincore."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

from laned.adapters.pagecache import evict, residency, weight_files
from laned.core.lanes import EventKind, LaneState
from laned.owner.supervisor import Supervisor
from tests.helpers import free_port
from tests.integration.conftest import Harness, Units
from tests.integration.lanes import FAST, lane_config
from tests.integration.test_supervisor import run, supervising, until

MIB = 2**20


def weights(model: Path, files: int, mib: int) -> list[str]:
    """Weight files of `mib` MiB each, on disk and out of the page cache."""
    block = os.urandom(MIB)
    for i in range(files):
        with open(model / f"model-{i + 1:05d}-of-{files:05d}.safetensors", "wb") as out:
            for _ in range(mib):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())  # dirty pages cannot be dropped
    found = weight_files(str(model))
    evict(found)
    assert residency(found).resident_bytes < 0.05 * residency(found).total_bytes, (
        "the page cache did not drop the files: this test needs a disk filesystem under tmp"
    )
    return found


def notes(sup: Supervisor, lane: str) -> list[str]:
    return [e.reason for e in sup.events if e.lane == lane and e.kind is EventKind.PREFETCH]


def two_lanes(
    harness: Harness, units: Units, tmp_path: Path, daemon: str, mib: int = 64
) -> tuple[object, list[str]]:
    """Lane `old` (slow to stop: its engine takes 2 s to exit) and lane `new`, whose engine
    reads its two weight files at its start."""
    ports = {"old": free_port(), "new": free_port()}
    env = {
        "old": {"LANED_SIM_SHUTDOWN": "2"},
        "new": {"LANED_SIM_READ_WEIGHTS": "1"},
    }
    config = lane_config(
        harness, units, tmp_path, {"old": FAST, "new": FAST}, 0, daemon, env=env, ports=ports
    )
    return config, weights(tmp_path / "models" / "new", 2, mib)


def test_a_swap_reads_the_next_lanes_weights_while_the_running_lane_stops(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    config, files = two_lanes(harness, units, tmp_path, "")

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("old")
            evict(files)
            ready = await sup.activate("new")
            assert ready.state is LaneState.READY
            said = notes(sup, "new")
            assert any(n.startswith("prefetch: reading up to 128 MiB") for n in said), said
            assert any(n.startswith("prefetch done: 128 MiB read") for n in said), said
            await until(lambda: sup.statuses["new"].weights_at_start is not None, 10, "the residency at the start")  # fmt: skip
            warm = sup.statuses["new"].weights_at_start
            # What laned read is its own; what the kernel kept of it by the start is not.
            assert warm is not None and 0 <= warm["fraction"] <= 1, warm
            assert warm["prefetched_bytes"] == 128 * MIB, warm
            assert warm["total_bytes"] == 128 * MIB and warm["files"] == 2, warm
            # Back to `old`: its own files are none, so nothing is read and nothing noted.
            await sup.activate("old")
            assert not notes(sup, "old")

    run(scenario())


def test_without_the_prefetch_nothing_is_read_ahead_and_preflight_says_what_is_cached(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    config, files = two_lanes(harness, units, tmp_path, "[daemon.prefetch]\nenabled = false\n")

    async def scenario() -> None:
        async with supervising(harness, config, host=True) as sup:
            await sup.activate("old")
            evict(files)
            await sup.activate("new")
            await until(lambda: sup.statuses["new"].weights_at_start is not None, 10, "the residency at the start")  # fmt: skip
            warm = sup.statuses["new"].weights_at_start
            assert warm is not None and 0 <= warm["fraction"] <= 1, warm
            assert "prefetched_bytes" not in warm
            assert not [n for n in notes(sup, "new") if n.startswith("prefetch")]
            # The engine read them itself; preflight says what the page cache holds of them
            # now, as the kernel says it before and after (nothing reads them meanwhile, so
            # it can only fall: the kernel may take pages back, CI saw 117 of 128 MiB).
            before = residency(files).resident_bytes
            found = await sup.preflight("new")
            after = residency(files).resident_bytes
            said = [f.message for f in found if f.where == "weights"]
            form = r"(\d+) MiB of 128 MiB of its weight files are in the page cache \((\d+)%\)"
            got = re.match(form, said[0] if said else "")
            assert got, said
            assert after // MIB <= int(got[1]) <= -(-before // MIB), (before, said, after)

    run(scenario())


def test_a_superseded_swap_stops_its_prefetch_and_a_slow_one_never_delays_the_start(
    harness: Harness, units: Units, tmp_path: Path
) -> None:
    # 1 MiB/s: the 256 MiB would take over four minutes, far past these waits.
    config, files = two_lanes(
        harness, units, tmp_path, "[daemon.prefetch]\nmax_gibps = 0.001\n", mib=128
    )

    async def scenario() -> None:
        async with supervising(harness, config) as sup:
            await sup.activate("old")
            evict(files)
            swap = sup.activate("new")
            await until(lambda: any(n.startswith("prefetch: reading") for n in notes(sup, "new")), 10, "the prefetch")  # fmt: skip
            back = sup.activate("old")  # supersedes the swap while `old` is still stopping
            await until(lambda: any(n.startswith("prefetch stopped") for n in notes(sup, "new")), 10, "the prefetch stopped")  # fmt: skip
            await asyncio.gather(back, swap, return_exceptions=True)
            assert sup.prefetches.running == {}
            assert residency(files).fraction < 0.5
            # A slow prefetch is stopped at the start: the lane is ready long before it
            # could have read its weights at 1 MiB/s.
            evict(files)
            ready = await asyncio.wait_for(sup.activate("new"), 60)
            assert ready.state is LaneState.READY
            said = notes(sup, "new")
            assert len([n for n in said if n.startswith("prefetch stopped")]) == 2, said

    run(scenario())
