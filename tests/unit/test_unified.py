"""Unified-memory GPUs (DGX Spark's GB10; laned.core.unified, docs/placement.md): the pool read
from the host's memory and cgroups, NVML's errors mapped by the adapter (over a module that
answers as pynvml does on a GB10), and what the gate, placement, the sleep's level, fit and
the memory guard make of a unified reading."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
from types import SimpleNamespace
from typing import Any

from laned.adapters.gpus import Nvml
from laned.config.model import LaneConfig
from laned.core.facts import GIB, GpuReading, HostFacts
from laned.core.gpu_memory import held
from laned.core.liveness import MemoryFloor
from laned.core.placement import fits, together
from laned.core.unified import Pool, parse_meminfo, pool_available, pool_of, unified_reading
from laned.engines.footprints import footprints
from laned.engines.vllm import level_now
from laned.errors import Severity
from laned.owner import watchers
from laned.preflight.fit import fit, sleep_fit
from laned.validation.load import parse_config

MEMINFO = "MemTotal:       127600748 kB\nMemFree:  1 kB\nMemAvailable:   118566368 kB\n"
TOTAL, AVAILABLE = 127600748 * 1024, 118566368 * 1024  # a DGX Spark's (XuehaiPan/nvitop #208)


def test_meminfo_is_read_in_bytes_and_the_pool_is_the_hosts_memory() -> None:
    memory = parse_meminfo(MEMINFO)
    assert memory["MemTotal"] == TOTAL and memory["MemAvailable"] == AVAILABLE
    pool = pool_of(memory)
    assert pool == Pool(TOTAL, AVAILABLE, limited=False)
    assert pool is not None and pool.used_bytes == TOTAL - AVAILABLE
    assert pool_of({"MemTotal": TOTAL}) is None  # no MemAvailable: not read


def test_a_cgroup_limit_bounds_the_pool_where_it_is_lower() -> None:
    memory = parse_meminfo(MEMINFO)
    # laned's slice may use 64 GiB and uses 60: 4 GiB available, whatever MemAvailable says.
    pool = pool_of(memory, [(64 * GIB, 60 * GIB)])
    assert pool == Pool(64 * GIB, 4 * GIB, limited=True)
    # A limit above the host's memory leaves it as it is; the lowest of several counts.
    assert pool_of(memory, [(200 * GIB, GIB)]) == Pool(TOTAL, AVAILABLE, limited=False)
    assert pool_of(memory, [(200 * GIB, GIB), (100 * GIB, 90 * GIB)]) == Pool(
        100 * GIB, 10 * GIB, limited=True
    )
    # Over its limit (memory.current can pass memory.max briefly): nothing available.
    assert pool_of(memory, [(10 * GIB, 11 * GIB)]) == Pool(10 * GIB, 0, limited=True)
    # What a simulated host's engines hold is gone from MemAvailable.
    assert pool_of(memory, (), 8 * GIB) == Pool(TOTAL, AVAILABLE - 8 * GIB)


# --- the adapter's mapping of NVML's errors --------------------------------------------------


class FakeNvml:
    """A module that answers as pynvml does: on a GB10 by default (memory "Not Supported",
    processes listed); `broken` names the calls that raise another NVML error."""

    class NVMLError(Exception):
        pass

    class NVMLError_NotSupported(NVMLError):
        pass

    nvmlMemory_v2 = 2

    def __init__(self, unified: bool = True, broken: tuple[str, ...] = ()) -> None:
        self.unified, self.broken = unified, broken

    def _call(self, name: str) -> None:
        if name in self.broken:
            raise self.NVMLError("Unknown Error")

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        self._call("count")
        return 1

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        self._call("handle")
        return index

    def nvmlDeviceGetName(self, handle: int) -> bytes:
        self._call("name")
        return b"NVIDIA GB10"

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: int = 0) -> Any:
        self._call("memory")
        if self.unified:
            raise self.NVMLError_NotSupported("Not Supported")  # v2 and v1 alike
        return SimpleNamespace(total=80 * GIB, used=GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        self._call("processes")
        return [SimpleNamespace(pid=4242, usedGpuMemory=30 * GIB)]


def pool() -> Pool:
    return Pool(120 * GIB, 80 * GIB)


def test_a_gpu_whose_memory_nvml_does_not_support_but_whose_processes_it_lists_is_unified() -> None:
    readings, skipped = Nvml(FakeNvml(), pool).survey()
    assert skipped == []
    assert readings == [
        GpuReading(0, "NVIDIA GB10", 120 * GIB, 40 * GIB, ((4242, 30 * GIB),), unified=True)
    ]
    assert readings[0].to_json()["unified"] is True
    # A discrete GPU is read as before.
    assert Nvml(FakeNvml(unified=False), pool).read() == [
        GpuReading(0, "NVIDIA GB10", 80 * GIB, GIB, ((4242, 30 * GIB),))
    ]


def test_no_nvml_error_escapes_a_read_each_is_a_reading_or_a_skip_with_its_reason() -> None:
    def survey(*broken: str, unified: bool = True, host: Any = pool) -> Any:
        return Nvml(FakeNvml(unified, broken), host).survey()

    assert survey("count") == ([], ["NVML cannot count the GPUs (Unknown Error)"])
    assert survey("handle") == ([], ["GPU 0: NVML cannot find it (Unknown Error)"])
    (named,), _ = survey("name")
    assert named.name == "GPU 0" and named.unified  # a name it cannot read is the index's
    assert survey("processes") == (
        [],
        ["GPU 0: NVML reads neither its memory nor its processes (Not Supported)"],
    )
    (unlisted,), _ = survey("processes", unified=False)
    assert unlisted.processes is None  # discrete: the device's count stands in (the gate)
    assert survey("memory") == ([], ["GPU 0: NVML cannot read its memory (Unknown Error)"])
    assert survey(host=lambda: None) == (
        [],
        ["GPU 0: a unified-memory GPU (its memory is the host's), and the host's memory "
         "cannot be read"],
    )  # fmt: skip
    # `read` (the gate's, the sleep's) gives the readings alone and never raises.
    assert Nvml(FakeNvml(broken=("count",)), pool).read() == []


# --- what the owner's decisions make of a unified reading ------------------------------------


def gb10(used_gib: float, *processes: tuple[int, int], total_gib: float = 120) -> GpuReading:
    pool = Pool(int(total_gib * GIB), int((total_gib - used_gib) * GIB))
    return unified_reading(0, "NVIDIA GB10", pool, processes)


def test_the_gate_on_unified_memory_counts_processes_not_the_hosts_use() -> None:
    # 20 GiB of the pool taken by the host (CPU processes, the page cache), no GPU process:
    # nothing holds the GPU, the gate opens.
    assert gb10(20).compute_bytes == 0
    assert held([gb10(20)], GIB) == []
    # A lane taken off still holds memory: wait for it.
    assert held([gb10(50, (7, 30 * GIB))], GIB) == ["GPU 0 has 30.00 GiB in use by pid 7"]
    # Beside a staying lane: room is what the pool has available.
    staying = {7: "a"}
    assert held([gb10(50, (7, 30 * GIB))], GIB, (), staying, {0: 60 * GIB}) == []
    short = held([gb10(80, (7, 30 * GIB))], GIB, (), staying, {0: 60 * GIB})
    assert short == [
        "GPU 0 has 40.0 GiB free, the lane takes 60.0 GiB; held by lane a 30.0 GiB (pid 7)"
    ]
    assert pool_available([gb10(80)]) == 40 * GIB
    assert pool_available([GpuReading(0, "H100", 80 * GIB, 0, ())]) is None


def lanes(extra: str = "", share: float = 0.4) -> dict[str, LaneConfig]:
    text = ""
    for name, port in (("a", 8001), ("b", 8002), ("c", 8003)):
        text += (
            f'[lanes.{name}]\nport = {port}\nserved_model_name = "{name}"\n{extra}'
            f'args = ["--gpu-memory-utilization", "{share}"]\n'
            f'exec = {{ command = ["vllm", "serve", "/m/{name}"] }}\n'
        )
    return parse_config(text, "t.toml", {"HOME": "/h"}).lanes


def test_placement_on_a_gb10_shares_the_pool_by_each_engines_rule() -> None:
    totals = {0: gb10(10).total_bytes}  # the pool: 120 GiB
    fps = footprints(lanes())
    assert together(fps["a"], fps["b"], totals) == (True, "both fit on GPU 0")
    why = fits(fps["c"], [fps["a"], fps["b"]], totals)
    assert "is more than its 120.0 GiB" in why, why


def test_a_level_1_sleep_on_unified_memory_is_a_level_2_sleep_and_fit_says_why() -> None:
    level, why = level_now(1, 10.0, 100.0, False, unified=True)
    assert level == 2 and "unified memory" in why and "free nothing" in why
    assert level_now(1, 10.0, 100.0, True, unified=True)[0] == 2  # pinned buffers: no matter
    assert level_now(2, 10.0, 100.0, False, unified=True) == (2, "")
    spec = lanes("sleep_level = 1\n")["a"]
    host = HostFacts((gb10(10),), "", 119.0, 110.0)
    (note,) = sleep_fit("a", spec, host, 10.0)
    assert note.severity is Severity.NOTE and "unified memory" in note.message
    assert "sleep_level = 2" in note.hint
    discrete = HostFacts((GpuReading(0, "H100", 80 * GIB, 0, ()),), "", 119.0, 110.0)
    assert sleep_fit("a", spec, discrete, 10.0) == []


def test_fit_warns_of_a_lane_on_unified_memory_without_a_memory_floor() -> None:
    host = HostFacts((gb10(10),), "", 119.0, 110.0)
    (warning,) = [f for f in fit("a", lanes()["a"], host) if "memory_floor_gib" in f.message]
    assert warning.severity is Severity.WARNING and "takes the whole host down" in warning.message
    guarded = lanes("probe = { memory_floor_gib = 4 }\n")["a"]
    assert [f for f in fit("a", guarded, host) if "memory_floor_gib" in f.message] == []


class Guarded:
    """A serving engine (health 200, no /metrics), the host's MemAvailable plenty, and a GB10
    whose pool has `free_gib` available."""

    def __init__(self, free_gib: float) -> None:
        self.free_gib = free_gib

    async def health(self, port: int, path: str = "/health") -> int:
        return 200

    async def sample(self, spec: LaneConfig) -> None:
        return None

    def mem_available(self) -> float:
        return 500.0 * GIB

    def unread(self) -> None:
        return None

    def read(self, indices: Any) -> list[GpuReading]:
        return [gb10(120 - self.free_gib)]


def test_the_memory_guard_on_unified_memory_watches_the_pool() -> None:
    assert MemoryFloor(4.0, 0.2).observe(3.0, 0.0) is False  # low, not yet for long
    spec = lanes('probe = { interval = "50ms", memory_floor_gib = 4, memory_floor_for = "150ms" }\n')["a"]  # fmt: skip
    seen = guard_reports(spec, 2.5)  # MemAvailable says 500 GiB; the pool has 2.5
    low = [s for s in seen if isinstance(s, watchers.MemoryLow)]
    assert low == [watchers.MemoryLow(2.5, 4.0, 0.15, unified=True)]
    assert not [s for s in guard_reports(spec, 10.0) if isinstance(s, watchers.MemoryLow)]


def guard_reports(spec: Any, free_gib: float) -> list[watchers.Observation]:
    """What the liveness watcher reports over 2 s (or until its guard's report ends it) of a
    GB10 host whose pool has `free_gib` available."""
    seen: list[watchers.Observation] = []

    def report(observation: watchers.Observation) -> bool:
        seen.append(observation)
        return True

    async def run(host: Guarded) -> None:
        watching = watchers.watch_liveness(host, host, spec, report, None, host)  # type: ignore[arg-type]
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(watching, 2)

    asyncio.run(run(Guarded(free_gib)))
    return seen


def test_metrics_and_status_fit_say_which_gpu_is_unified() -> None:
    from laned.api.metrics import LanedMetrics
    from laned.cli.client import fit_table
    from laned.preflight.fit import fit_report

    metrics = LanedMetrics()
    host = HostFacts((gb10(10),), "", 119.0, 110.0)
    reads = []

    async def facts() -> HostFacts:
        reads.append(1)
        return host

    async def scrape_twice() -> bytes:
        first = await metrics.scrape()
        assert await metrics.scrape() == first
        return first

    metrics.host = facts
    page = asyncio.run(scrape_twice()).decode()
    assert len(reads) == 1  # scrapes within GPU_FRESH share one reading of the GPUs
    assert 'laned_gpu_memory_total_bytes{gpu="0",name="NVIDIA GB10",unified="true"}' in page
    assert 'laned_gpu_memory_used_bytes{gpu="0",name="NVIDIA GB10",unified="true"}' in page
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (apt-get install prometheus)"
    check = subprocess.run([promtool, "check", "metrics"], input=page, capture_output=True, text=True)  # fmt: skip
    assert check.returncode == 0 and not check.stdout.strip(), check.stdout + check.stderr
    table = fit_table(fit_report(lanes(), host))
    assert table.startswith("host: 1 GPU(s), 0: NVIDIA GB10 120 GiB unified (110 GiB free)"), table


def test_a_start_beside_a_sleeper_on_unified_memory_counts_what_the_host_takes_too() -> None:
    from laned.preflight.fit import beside_sleepers

    spec = lanes()["a"]  # vLLM, 0.4 of the pool: 48 GiB
    # A sleeper keeps 10 GiB; the host's other processes take 70 GiB more: 40 GiB free.
    (found,) = beside_sleepers("a", spec, [gb10(80, (7, 10 * GIB))], {7})
    assert "would find 40.0 GiB" in found.message, found.message
    # With the host idle the pool has room beside the sleeper.
    assert beside_sleepers("a", spec, [gb10(12, (7, 10 * GIB))], {7}) == []


def test_a_worker_rank_serves_no_api_and_its_hosts_pool_is_guarded_all_the_same() -> None:
    text = (
        '[lanes.w]\nport = 8001\nserved_model_name = "w"\n'
        'probe = { interval = "50ms", memory_floor_gib = 4, memory_floor_for = "100ms" }\n'
        'exec = { command = ["vllm", "serve", "/m/w", "--headless"] }\n'
    )
    spec = parse_config(text, "t.toml", {"HOME": "/h"}).lanes["w"]
    seen = guard_reports(spec, 1.0)
    assert seen[-1] == watchers.MemoryLow(1.0, 4.0, 0.1, unified=True)
