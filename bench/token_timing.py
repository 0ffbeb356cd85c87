#!/usr/bin/env python3
"""Does the time laned takes to refuse a wrong token tell anything of the token? (prints
figures, asserts nothing)

    .venv/bin/python bench/token_timing.py [--rounds 400] [--batch 500] [--json FILE]

It times the API guard's own check (`Guard.refusal`, in-process: the sharpest lens there is;
over a network the same difference drowns in jitter) on wrong tokens that differ from the
right one at its first character, at its last, or by a character more or less (the time of
an answer may grow with the caller's own token, which the caller knows; it must not change
where the caller's length meets the secret's), interleaved
round by round so that the machine's drift hits every case alike. Each figure is the median
over rounds of the mean time per call in a batch, with the spread of the rounds (p25-p75).

A control shows that the method would see a leak: a character-by-character comparison that
stops at the first difference, timed the same way on the same tokens.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laned.api.guard import Access, ApiSettings, Guard, Routes, access


def request(token: str) -> dict[str, Any]:
    """The request as the server hands it to laned's door (an ASGI scope)."""
    headers = [(b"host", b"127.0.0.1:9000"), (b"authorization", f"Bearer {token}".encode())]
    return {
        "type": "http", "method": "POST", "path": "/lanes/a/activate", "query_string": b"",
        "headers": headers, "scheme": "http", "server": ("127.0.0.1", 9000),
    }  # fmt: skip


def activate_route() -> APIRouter:
    """The route the request resolves to: a mutating one, as laned's activate."""
    router = APIRouter()

    @router.post("/lanes/{lane}/activate")
    @access(Access.MUTATE, peers=True)
    async def activate(lane: str) -> None: ...

    return router


def early_exit(given: str, expected: str) -> bool:
    """The control: a comparison that leaks (it stops at the first difference)."""
    if len(given) != len(expected):
        return False
    return all(a == b for a, b in zip(given, expected, strict=True))


def cases(token: str) -> dict[str, str]:
    flip = {"a": "b"}.get
    return {
        "first character wrong": (flip(token[0]) or "a") + token[1:],
        "last character wrong": token[:-1] + (flip(token[-1]) or "a"),
        "one character short": token[:-1],
        "one character long": token + "a",
    }


def timed(check: Callable[[], object], batch: int) -> float:
    started = time.perf_counter_ns()
    for _ in range(batch):
        check()
    return (time.perf_counter_ns() - started) / batch


def measure(
    checks: dict[str, Callable[[], object]], rounds: int, batch: int
) -> dict[str, dict[str, float]]:
    samples: dict[str, list[float]] = {name: [] for name in checks}
    for _ in range(rounds):
        for name, check in checks.items():  # interleaved: drift hits every case alike
            samples[name].append(timed(check, batch))
    out = {}
    for name, values in samples.items():
        q = statistics.quantiles(values, n=4)
        out[name] = {"median_ns": statistics.median(values), "p25_ns": q[0], "p75_ns": q[2]}
    return out


def spread(figures: dict[str, dict[str, float]]) -> float:
    medians = [f["median_ns"] for f in figures.values()]
    return max(medians) - min(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=400)
    parser.add_argument("--batch", type=int, default=500)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    token = secrets.token_urlsafe(32)  # what `laned token` writes: 43 characters
    guard = Guard(ApiSettings("127.0.0.1", 9000, token=token), Routes(activate_route().routes))
    wrong = cases(token)
    requests = {name: request(value) for name, value in wrong.items()}
    for name, req in requests.items():
        answer = guard.refusal(req)
        assert answer is not None and answer.status_code == 403, name  # each one is refused
    laned = measure(
        {name: (lambda r=req: guard.refusal(r)) for name, req in requests.items()},
        args.rounds,
        args.batch,
    )
    control = measure(
        {name: (lambda v=value: early_exit(v, token)) for name, value in wrong.items()},
        args.rounds,
        args.batch,
    )
    print(
        f"laned's guard, a wrong {len(token)}-character token ({args.rounds} rounds × {args.batch} calls)"
    )
    for name, f in laned.items():
        print(
            f"  {name:24s} {f['median_ns'] / 1000:8.3f} µs  (p25-p75 {f['p25_ns'] / 1000:.3f}-{f['p75_ns'] / 1000:.3f})"
        )
    print(f"  largest difference between cases: {spread(laned):.0f} ns")
    print("control: a comparison that stops at the first difference, on the same tokens")
    for name, f in control.items():
        print(
            f"  {name:24s} {f['median_ns'] / 1000:8.3f} µs  (p25-p75 {f['p25_ns'] / 1000:.3f}-{f['p75_ns'] / 1000:.3f})"
        )
    print(f"  largest difference between cases: {spread(control):.0f} ns")
    if args.json:
        result = {
            "token_chars": len(token), "rounds": args.rounds, "batch": args.batch,
            "guard": laned, "guard_spread_ns": spread(laned),
            "control": control, "control_spread_ns": spread(control),
        }  # fmt: skip
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
