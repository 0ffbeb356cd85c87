"""GPU memory held as an engine holds it (LANED_SIM_HOLD_GPU_GIB, for runs on a GPU host).

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

import os
import subprocess
import sys
from typing import Any

from laned.errors import EngineError

_held: list[Any] = []
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
