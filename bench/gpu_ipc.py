#!/usr/bin/env python3
"""The floor under a restart from vLLM's weight cache (issue 45): what it costs a fresh
process to reach weights another process holds on the GPU (prints figures, writes JSON,
asserts nothing). For a GPU host (the `device` machine): needs torch only.

    python3 bench/gpu_ipc.py [--gib 10,30,60] [--tensors 1,2000] [--rounds 3] [--json OUT.json]

A holder (the weight-cache daemon's part, vllm/model_executor/model_loader/weight_cache/
daemon.py) takes GIB GiB of GPU 0 as TENSORS tensors and fills them (a model is thousands of
tensors, and the daemon hands each over as its own IPC handle: daemon.py export_entries;
torch opens one handle per allocation it came from, so both ends are measured). For each round a fresh process (an engine's
restart, weight_cache/ipc_loader.py) is started and timed from its own start:

- `context`: Python and torch imported, its CUDA context made (a first allocation);
- `map`: the holder's memory mapped through CUDA IPC (zero-copy mode: torch.multiprocessing
  hands the tensor over as an IPC handle, the child opens it: cudaIpcOpenMemHandle);
- `copy`: the mapped memory copied into memory of its own (copy mode), where the GPU has
  room for both;
- a checksum of a strided sample against the holder's pattern, so nothing is taken on trust.

Seconds per 100 GiB are each part over the size, scaled.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

GIB = 2**30


def child(inbox: Any, outbox: Any, started: float) -> None:
    """A restarted engine: its context first, then the holder's weights, mapped and copied."""
    import torch

    torch.empty(1, device="cuda")  # the CUDA context
    torch.cuda.synchronize()
    context = time.time() - started
    outbox.put({"context_s": context})
    t0 = time.perf_counter()
    tensors, expected, copy = inbox.get()  # the rebuild opens the IPC handles: the map
    torch.cuda.synchronize()
    mapped = time.perf_counter() - t0
    out: dict[str, Any] = {"map_s": mapped, "sample_ok": _sample(tensors) == expected}
    if copy:
        t1 = time.perf_counter()
        own = [t.clone() for t in tensors]
        torch.cuda.synchronize()
        out["copy_s"] = time.perf_counter() - t1
        out["copy_ok"] = _sample(own) == expected
        del own
    del tensors
    torch.cuda.synchronize()
    outbox.put(out)


def _sample(tensors: Any) -> int:
    """A strided sum over every tensor: the child checks it read what the holder wrote."""
    import torch

    return sum(int(t[:: 2**20].to(torch.int64).sum().item()) for t in tensors)


def run(gib: float, count: int, rounds: int) -> dict[str, Any]:
    import torch
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    size = int(gib * GIB)
    each = size // count
    t0 = time.perf_counter()
    held = [torch.empty(each, dtype=torch.uint8, device="cuda") for _ in range(count)]
    ramp = torch.arange(min(each, GIB), dtype=torch.int32, device="cuda").remainder_(251)
    ramp = ramp.to(torch.uint8)
    for tensor in held:
        _fill(tensor, ramp)
    del ramp
    torch.cuda.synchronize()
    fill = time.perf_counter() - t0
    expected = _sample(held)
    free, total = torch.cuda.mem_get_info()
    copy = free > size + GIB  # room for a copy beside what is held
    rows = []
    for _ in range(rounds):
        inbox, outbox = ctx.Queue(), ctx.Queue()
        started = time.time()
        proc = ctx.Process(target=child, args=(inbox, outbox, started))
        proc.start()
        first = outbox.get(timeout=300)
        inbox.put((held, expected, copy))
        second = outbox.get(timeout=600)
        proc.join(120)
        rows.append({**first, **second})
    out: dict[str, Any] = {
        "gib": gib,
        "tensors": count,
        "fill_s": round(fill, 3),
        "gpu_total_gib": round(total / GIB, 1),
        "copied": copy,
        "rounds": rows,
    }
    for key in ("context_s", "map_s", "copy_s"):
        values = sorted(r[key] for r in rows if key in r)
        if values:
            median = values[len(values) // 2]
            out[f"{key[:-2]}_median_s"] = round(median, 6)
            if key != "context_s":
                out[f"{key[:-2]}_s_per_100_gib"] = round(median * 100 / gib, 6)
    del held
    torch.cuda.empty_cache()
    return out


def _fill(held: Any, ramp: Any) -> None:
    """A pattern over the whole buffer, a ramp's length at a time."""
    step = ramp.numel()
    for start in range(0, held.numel(), step):
        end = min(start + step, held.numel())
        held[start:end].copy_(ramp[: end - start])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gib", default="10,30,60", help="sizes held, in GiB")
    parser.add_argument("--tensors", default="1,2000", help="how many tensors hold them")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json")
    args = parser.parse_args()
    import torch

    result: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "sizes": [],
    }
    for gib in (float(g) for g in args.gib.split(",")):
        for count in (int(n) for n in args.tensors.split(",")):
            row = run(gib, count, args.rounds)
            result["sizes"].append(row)
            print(
                f"{gib:g} GiB held as {count} tensor(s): context {row.get('context_median_s', 0):.3f} s, "
                f"map {row.get('map_median_s', 0) * 1e3:.1f} ms "
                f"({row.get('map_s_per_100_gib', 0):.4f} s/100 GiB), "
                + (
                    f"copy {row['copy_median_s'] * 1e3:.1f} ms ({row['copy_s_per_100_gib']:.3f} s/100 GiB), "
                    if "copy_median_s" in row
                    else "no room to copy, "
                )
                + f"samples ok: {all(r['sample_ok'] for r in row['rounds'])}",
                flush=True,
            )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
