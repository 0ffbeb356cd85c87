"""The state dir failing under a running laned: made unwritable (a file where the directory
was), or its disk full (a small tmpfs). laned says why in /healthz, the lanes run on and
swaps still happen, and once the fault is gone the notice goes and state.json holds the
latest request."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ROOT, wait_until
from tests.reliability.conftest import figures


def notices(url: str) -> list[str]:
    return list(httpx.get(f"{url}/healthz", timeout=10).json()["notices"])


def swap_to(url: str, lane: str) -> None:
    reply = httpx.post(f"{url}/lanes/{lane}/activate", params={"wait": "true"}, timeout=120)
    assert reply.status_code == 200, reply.text


def desired_on_disk(state_dir: Path) -> dict[str, str]:
    return dict(json.loads((state_dir / "state.json").read_text())["desired"])


def test_an_unwritable_state_dir_is_said_the_lanes_run_on_and_it_recovers(swap_pair: Any) -> None:
    serve = swap_pair()
    state_dir = serve.path.parent / "state"
    aside = state_dir.with_name("state.aside")
    state_dir.rename(aside)
    state_dir.write_text("not a directory")  # every write under it now fails
    try:
        swap_to(serve.url, "b")  # laned still swaps
        said = wait_until(lambda: notices(serve.url), 15, "a notice about state.json")
        assert any(str(state_dir) in n and "not kept across a restart" in n for n in said), said
        status = subprocess.run(
            [sys.executable, "-m", "laned", "status", "--url", serve.url],
            cwd=ROOT, env=serve.env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert f"laned: cannot write {state_dir}" in status.stdout, status.stdout
    finally:
        state_dir.unlink()
        aside.rename(state_dir)
    wait_until(lambda: not notices(serve.url), 30, "the notice gone once state.json is written")
    assert desired_on_disk(state_dir)["b"] == "active"
    figures("state-dir-unwritable", swap_during_fault="ok", notice_shown=True, recovered=True)


def test_a_full_disk_under_the_state_dir_is_said_and_recovered_from(swap_pair: Any) -> None:
    serve = swap_pair()
    state_dir = serve.path.parent / "state"
    saved = state_dir.with_name("state.before")
    shutil.copytree(state_dir, saved)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(state_dir)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        for item in saved.iterdir():
            if item.is_file():
                shutil.copy2(item, state_dir / item.name)
        filler = state_dir / "filler"
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={filler}", "bs=4k", "count=1000"],
            capture_output=True,
            check=False,
        )
        swap_to(serve.url, "b")
        said = wait_until(lambda: notices(serve.url), 15, "a notice about state.json")
        assert any("No space left" in n for n in said), said
        filler.unlink()
        wait_until(lambda: not notices(serve.url), 30, "the notice gone once state.json is written")
        assert desired_on_disk(state_dir)["b"] == "active"
    finally:
        subprocess.run(["umount", "-l", str(state_dir)], check=False)
    figures("state-dir-full", swap_during_fault="ok", notice_shown=True, recovered=True)
