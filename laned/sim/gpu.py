"""GPU memory held as an engine holds it: on a simulated host's GPUs (LANED_SIM_GPUS), or for
real with torch (LANED_SIM_HOLD_GPU_GIB, for runs on a GPU host).

LANED_SIM_GPUS=DIR is a host with no GPU that laned reads as if NVML did
(laned.adapters.gpus.SimGpus): DIR/gpus.json lists the GPUs (one marked `"unified": true` is a
GB10's, whose memory is the host's pool, DIR/meminfo), and each simulated engine writes
what its process holds to DIR/held/PID.json when it takes the memory (vLLM: at its worker's
start, before the weights), rewrites it at a sleep and a wake, and leaves it at its exit (a
process that has ended holds nothing). vLLM's rule is played as vllm/v1/worker/utils.py
`request_memory` has it: on each of its GPUs it takes --gpu-memory-utilization × the GPU's
memory, and refuses to start ("Free memory on device ... on startup is less than desired GPU
memory utilization") when less is free. Its GPUs: CUDA_VISIBLE_DEVICES, else all.

vLLM takes its GPU memory while it loads the weights and profiles the KV cache, and the
driver gives it back only after the process holding it has ended. With
LANED_SIM_HOLD_GPU_GIB=N the simulator does the same on GPU 0 with torch: N GiB taken and
written when the weights start to load, held until the process exits.

LANED_SIM_GPU_LINGER=S moves the memory into a child process of its own session that
outlives the engine by S seconds: an engine-core or worker process left behind when the
process a supervisor waits for has gone (one outside the unit's cgroup, say, or a container's
under conmon when the `podman run` client was killed) — the case laned's GPU-memory gate is
for. Unset (the default, and in the simulator image, which has no torch), nothing is
imported and nothing is taken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

from laned.errors import EngineError

_held: list[Any] = []
# A sleeping engine keeps its context: 0.60 GiB seen on an H200 (bench/gpu_sleep.py).
RESIDUAL = 0.6 * 2**30


def _sim_gpus(root: str) -> list[dict[str, Any]]:
    with open(os.path.join(root, "gpus.json")) as f:
        return list(json.load(f)["gpus"])


def _sim_used(root: str, gpus: set[int]) -> int:
    """What the other live processes hold on simulated GPUs `gpus`."""
    folder, used = os.path.join(root, "held"), 0
    for name in os.listdir(folder) if os.path.isdir(folder) else ():
        try:
            with open(os.path.join(folder, name)) as f:
                record = json.load(f)
            if int(record["pid"]) != os.getpid():
                os.kill(int(record["pid"]), 0)
                used += sum(int(record["gpus"].get(str(gpu), 0)) for gpu in gpus)
        except (OSError, ValueError, KeyError):
            continue  # ended, or being written
    return used


def _sim_meminfo(root: str) -> dict[str, int]:
    """DIR/meminfo (a simulated host's /proc/meminfo) in bytes by key (as
    laned.core.unified.parse_meminfo reads it: the simulator stands below laned's core, which
    it may not import, tests/unit/test_architecture.py)."""
    out = {}
    with open(os.path.join(root, "meminfo"), encoding="ascii") as f:
        for line in f:
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                out[key.strip()] = int(parts[0]) * (1024 if parts[1:] == ["kB"] else 1)
    return out


def sim_device(root: str, gpu: int) -> tuple[int, int]:
    """(total, free) of a simulated GPU as CUDA's cudaMemGetInfo tells the engine. On a
    unified one (a GB10: `"unified": true` in gpus.json) the host's memory, one pool: DIR/meminfo's
    MemTotal, and its MemAvailable less what the live processes hold on the unified GPUs
    (laned reads the same pool: laned.adapters.gpus.sim_pool)."""
    gpus = _sim_gpus(root)
    if gpus[gpu].get("unified"):
        memory = _sim_meminfo(root)
        shared = {i for i, g in enumerate(gpus) if g.get("unified")}
        return memory["MemTotal"], memory["MemAvailable"] - _sim_used(root, shared)
    total = int(gpus[gpu]["total_bytes"])
    return total, total - _sim_used(root, {gpu})


def sim_write(root: str, held: dict[int, int]) -> None:
    """Say what this process holds on the simulated GPUs (atomically)."""
    folder = os.path.join(root, "held")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{os.getpid()}.json")
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "gpus": {str(g): b for g, b in held.items()}}, f)
    os.replace(path + ".tmp", path)


def sim_asleep(root: str, held: dict[int, int], asleep: bool) -> None:
    """A sleep (or a wake) on the simulated GPUs: asleep, the process keeps its context
    only (RESIDUAL on each GPU it holds); awake, all it took again."""
    sim_write(root, {g: int(RESIDUAL) for g in held} if asleep else held)


def _gib(size: int) -> float:
    """vllm/utils/mem_utils.py `format_gib`."""
    return round(size / 2**30, 2)


def sim_take(
    root: str, visible: str | None, share: float | None, of_free: float = 0.85
) -> dict[int, int]:
    """Take the memory of an engine on the simulated host's GPUs: `share` of each (vLLM),
    or (None) `of_free` of what is free on each (SGLang's --mem-fraction-static). vLLM's
    refusal as a ValueError with its text."""
    count = len(_sim_gpus(root))
    mine = [int(v) for v in visible.split(",") if v.strip().isdigit()] if visible else []
    held = {}
    for index, gpu in enumerate(mine or range(count)):
        total, free = sim_device(root, gpu)
        want = int(total * share) if share is not None else int(free * of_free)
        if free < want:
            raise ValueError(
                f"Free memory on device cuda:{index} ({_gib(free)}/{_gib(total)} GiB) on startup "
                f"is less than desired GPU memory utilization ({share}, {_gib(want)} GiB). "
                "Decrease GPU memory utilization or reduce GPU memory used by other processes."
            )
        held[gpu] = want
    sim_write(root, held)
    return held


_offloaded: list[Any] = []  # level 1: the held blocks' copies in pinned host memory

# The lingering holder: take the memory, say so, outlive the engine (argv: GiB, pid, seconds).
_HOLDER = """
import os, sys, time, torch
block = torch.empty(int(float(sys.argv[1]) * 2**30), dtype=torch.uint8, device="cuda:0")
block.fill_(1)
torch.cuda.synchronize()
print("held", flush=True)
parent = int(sys.argv[2])
while True:
    try:
        os.kill(parent, 0)
    except ProcessLookupError:
        break
    time.sleep(0.05)
time.sleep(float(sys.argv[3]))
"""


def hold(gib: float, linger: float = 0.0) -> None:
    """Take `gib` GiB on GPU 0 and keep it until the process ends (`linger` s after it, in a
    child of its own)."""
    if gib <= 0:
        return
    if linger > 0:
        child = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(gib), str(os.getpid()), str(linger)],
            stdout=subprocess.PIPE, text=True, start_new_session=True,
        )  # fmt: skip
        assert child.stdout is not None
        if child.stdout.readline().strip() != "held":
            raise EngineError(f"could not take {gib:g} GiB of GPU 0", "see the log above")
        _held.append(child)
        return
    try:
        import torch  # type: ignore[import-not-found]  # only on GPU hosts: the image has none
    except ImportError:
        raise EngineError(
            "LANED_SIM_HOLD_GPU_GIB is set but torch is not importable",
            "unset it, or run the simulator with a Python that has torch",
        ) from None
    block = torch.empty(int(gib * 2**30), dtype=torch.uint8, device="cuda:0")
    block.fill_(1)
    torch.cuda.synchronize()
    _held.append(block)


def release() -> None:
    """Give back what `hold` took in this process (a level-2 sleep discards it)."""
    _held[:] = [h for h in _held if isinstance(h, subprocess.Popen)]
    if "torch" in sys.modules:
        sys.modules["torch"].cuda.empty_cache()


def offload() -> None:
    """A level-1 sleep, as vLLM's allocator does it (vllm/device_allocator/cumem.py `sleep`):
    a pinned host buffer asked for at this sleep for each block, the block copied into it,
    the GPU memory given back. Blocking: seconds per tens of GiB (pinning dominates)."""
    _offloaded.extend(_pinned_copy(h) for h in _held if not isinstance(h, subprocess.Popen))
    release()  # no reference to a block is left here: the driver gets its memory back


def _pinned_copy(block: Any) -> Any:
    torch = sys.modules["torch"]
    copy = torch.empty(block.numel(), dtype=torch.uint8, pin_memory=True)
    copy.copy_(block)
    return copy


def restore() -> None:
    """A level-1 wake (cumem.py `wake_up`): the GPU memory taken again, each block copied back
    from its pinned buffer, the buffer freed. Blocking."""
    torch = sys.modules["torch"]
    for copy in _offloaded:
        block = torch.empty(copy.numel(), dtype=torch.uint8, device="cuda:0")
        block.copy_(copy, non_blocking=True)
        _held.append(block)
    torch.cuda.synchronize()
    _offloaded.clear()
