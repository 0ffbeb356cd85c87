#!/usr/bin/env python3
"""A swap to a lane whose weights are real files, after a cold page cache, with and without
laned's prefetch during the swap (prints figures, writes JSON, asserts nothing):

    scripts/harness up && .venv/bin/python bench/prefetch.py [--gib 4] [--files 4]
        [--rounds 3] [--stop 5] [--json F]

Two simulator lanes of one group on the real user manager, driven by laned's supervisor:
`old`, whose engine takes --stop seconds to exit after SIGTERM (what a drain and vLLM's own
shutdown take), and `new`, whose weight phase reads its model directory's --files files
(--gib in all, written once, random bytes) for real (LANED_SIM_READ_WEIGHTS). Each round
runs `old`, drops `new`'s files from the page cache (POSIX_FADV_DONTNEED), then times the swap
to `new`: activate -> ready, the weight phase as laned saw it in the engine's log, and how
much of the weights was resident as the engine started (mincore). The rounds alternate
between a supervisor with `[daemon.prefetch] enabled = false` (cold) and one with the
defaults (prefetched).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import free_port, harness_env, sim_lane, supervisor_on
from laned.adapters.pagecache import evict, weight_files
from laned.core.lanes import LaneState

MIB = 2**20


def write_weights(model: Path, gib: float, files: int) -> list[str]:
    model.mkdir(parents=True, exist_ok=True)
    block = os.urandom(MIB)
    each = int(gib * 1024 / files)
    for i in range(files):
        with open(model / f"model-{i + 1:05d}-of-{files:05d}.safetensors", "wb") as out:
            for _ in range(each):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())
    return weight_files(str(model))


async def bench(gib: float, files: int, rounds: int, stop_s: float, where: str) -> dict[str, Any]:
    env = harness_env()
    os.environ.update(env)
    tag = f"benchprefetch{uuid.uuid4().hex[:6]}"
    unit_dir = Path(env["XDG_CONFIG_HOME"]) / "systemd" / "user"
    results: dict[str, Any] = {"gib": gib, "files": files, "stop_s": stop_s, "cores": os.cpu_count()}  # fmt: skip
    probe = 'probe = { start_interval_min = "50ms", start_interval_max = "200ms" }\nstart_timeout = "10m"\n'  # fmt: skip
    with tempfile.TemporaryDirectory(dir=where) as tmp:
        model = Path(tmp) / "model"
        weights = write_weights(model, gib, files)
        ports = {"old": free_port(), "new": free_port()}
        lanes = sim_lane("old", f"{tag}-old.service", ports["old"], probe, f'LANED_SIM_SHUTDOWN = "{stop_s:g}"\n')  # fmt: skip
        lanes += sim_lane("new", f"{tag}-new.service", ports["new"], probe, 'LANED_SIM_READ_WEIGHTS = "1"\n', str(model))  # fmt: skip
        base = (
            f'[daemon]\nunit_dir = "{unit_dir}"\nbin_dir = "{tmp}/bin"\nstate_dir = "{tmp}/state"\n'
            'listen = "127.0.0.1:1"\n'
        )
        texts = {
            "cold": base + "[daemon.prefetch]\nenabled = false\n" + lanes,
            "prefetched": base + lanes,
        }
        rows: dict[str, list[dict[str, Any]]] = {"cold": [], "prefetched": []}
        try:
            for _ in range(rounds):
                for case, text in texts.items():
                    sup = supervisor_on(text, tmp, env)
                    await sup.start()
                    try:
                        await sup.activate("old")
                        await asyncio.to_thread(evict, weights)
                        began = time.monotonic()
                        ready = await sup.activate("new")
                        took = time.monotonic() - began
                        assert ready.state is LaneState.READY, ready
                        deadline = time.monotonic() + 30
                        while sup.statuses["new"].weights_at_start is None and time.monotonic() < deadline:  # fmt: skip
                            await asyncio.sleep(0.05)
                        warm = sup.statuses["new"].weights_at_start or {}
                        row = {
                            "activate_to_ready_s": round(took, 3),
                            "weight_phase_s": sup.statuses["new"].last_phases.get(
                                "loading weights"
                            ),
                            "resident_at_start": warm.get("fraction"),
                            "prefetched_gib": round(warm.get("prefetched_bytes", 0) / 2**30, 3),
                        }
                        rows[case].append(row)
                        print(case, json.dumps(row), flush=True)
                        await sup.deactivate("new")
                    finally:
                        await sup.close()
                        await sup.seam.close()
        finally:
            for name in ("old", "new"):
                subprocess.run(["systemctl", "--user", "stop", f"{tag}-{name}.service"], check=False)  # fmt: skip
                (unit_dir / f"{tag}-{name}.service").unlink(missing_ok=True)
            subprocess.run(["systemctl", "--user", "daemon-reload"], check=False)
    for case, measured in rows.items():
        results[case] = {
            "rounds": measured,
            "median": {
                key: statistics.median(r[key] for r in measured)
                for key in ("activate_to_ready_s", "weight_phase_s", "resident_at_start")
            },
        }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=4.0)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stop", type=float, default=5.0, help="seconds the old engine takes to exit")  # fmt: skip
    parser.add_argument("--dir", default="/var/tmp", help="where the weight files go (a disk, not tmpfs)")  # fmt: skip
    parser.add_argument("--json", help="also write the figures here")
    args = parser.parse_args()
    results = asyncio.run(bench(args.gib, args.files, args.rounds, args.stop, args.dir))
    print(f"swap to a lane with {args.gib:g} GiB of weights in {args.files} files, the old lane taking {args.stop:g} s to stop; median of {args.rounds}")  # fmt: skip
    for case in ("cold", "prefetched"):
        m = results[case]["median"]
        print(f"  {case:11} activate -> ready {m['activate_to_ready_s']:7.3f} s, weight phase {m['weight_phase_s']:7.3f} s, resident at the start {m['resident_at_start']:.0%}")  # fmt: skip
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
