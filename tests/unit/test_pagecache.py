"""The page-cache adapter (laned.adapters.pagecache) on real files in tmp, and the preflight
note it feeds (pure)."""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from laned.adapters.pagecache import (
    BLOCK,
    evict,
    prefetch,
    residency,
    resident_bytes,
    weight_files,
)
from laned.core.facts import HostFacts, LaneFacts
from laned.errors import Severity
from laned.preflight.rules import evaluate
from laned.validation.load import parse_config

MIB = 2**20


@pytest.fixture
def model(tmp_path: Path) -> list[str]:
    """Two weight files of 48 MiB, on disk and out of the page cache; other files beside."""
    block = os.urandom(MIB)
    for name in ("model-00002-of-00002.safetensors", "model-00001-of-00002.safetensors"):
        with open(tmp_path / name, "wb") as out:
            for _ in range(48):
                out.write(block)
            out.flush()
            os.fsync(out.fileno())  # dirty pages cannot be dropped
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "extra.gguf").write_bytes(b"")
    files = weight_files(str(tmp_path))
    evict(files)
    if residency(files).resident_bytes > 8 * MIB:
        pytest.fail(f"{tmp_path}: the page cache kept the files after POSIX_FADV_DONTNEED (tmpfs?)")
    return files


@contextlib.contextmanager
def pinned(path: str, length: int | None = None) -> Iterator[None]:
    """The first `length` bytes of a file (all of it by default) in the page cache and held
    there (mmap + mlock) for the block: what is resident then is the test's doing, not the
    kernel's mood (it may take back any unlocked page at any time: CI once saw 117 of 128 MiB)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "r+b") as handle:
        size = length or os.path.getsize(path)
        with mmap.mmap(handle.fileno(), size, access=mmap.ACCESS_WRITE) as region:
            address = ctypes.addressof(ctypes.c_char.from_buffer(region))
            if libc.mlock(ctypes.c_void_p(address), ctypes.c_size_t(size)) != 0:
                pytest.fail(f"mlock: {os.strerror(ctypes.get_errno())} (root, CAP_IPC_LOCK?)")
            try:
                yield
            finally:
                libc.munlock(ctypes.c_void_p(address), ctypes.c_size_t(size))


def test_weight_files_are_the_weights_in_loading_order(tmp_path: Path, model: list[str]) -> None:
    assert [Path(f).name for f in model] == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "extra.gguf",
    ]
    assert weight_files(str(tmp_path / "missing")) == [] and weight_files(None) == []


def test_residency_follows_reads_and_evictions(model: list[str]) -> None:
    cold = residency(model)
    assert cold.total_bytes == 96 * MIB and cold.files == 3
    with pinned(model[0], 8 * MIB):
        warm = residency(model)
        assert 8 * MIB <= warm.resident_bytes <= 48 * MIB  # readahead may add a little
    evict(model)
    assert residency(model).resident_bytes < warm.resident_bytes


def test_prefetch_reads_everything_in_then_skips_what_is_resident(model: list[str]) -> None:
    done = prefetch(model, 10**12, 0, threading.Event())
    assert (done.ended, done.read_bytes) == ("done", 96 * MIB)
    # Again, with one file held resident and the other evicted: only what is not wholly
    # resident is read.
    evict(model[1:])
    with pinned(model[0]):
        assert resident_bytes(model[0]) == (48 * MIB, 48 * MIB)
        again = prefetch(model, 10**12, 0, threading.Event())
    assert (again.ended, again.read_bytes) == ("done", 48 * MIB)


def test_prefetch_stops_at_its_budget_at_the_margin_and_when_told(model: list[str]) -> None:
    budget = prefetch(model, 20 * MIB, 0, threading.Event())
    assert (budget.ended, budget.read_bytes) == ("budget", 20 * MIB)
    evict(model)
    memory = prefetch(model, 10**12, 0, threading.Event(), memory_left=lambda: 0)
    assert (memory.ended, memory.read_bytes) == ("memory", 0)
    told = threading.Event()
    told.set()
    assert prefetch(model, 10**12, 0, told).ended == "stopped"


def test_a_paced_prefetch_waits_between_blocks_and_a_stop_ends_the_wait(model: list[str]) -> None:
    # 1 MiB/s: after its first block the read owes 15 s; the stop ends that wait.
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    done = prefetch(model, 10**12, MIB, stop)
    assert (done.ended, done.read_bytes) == ("stopped", BLOCK)
    assert done.seconds < 10


def facts(resident: tuple[int, int] | None) -> LaneFacts:
    return LaneFacts(host=HostFacts(None, "", 64, 32), weights_resident=resident)


def weights_notes(text: str, resident: tuple[int, int] | None) -> list[str]:
    config = parse_config(text, "laned.toml", {"HOME": "/home/u"})
    found = evaluate("a", config.lanes["a"], facts(resident))
    assert all(f.severity is Severity.NOTE for f in found if f.where == "weights")
    return [f"{f.message} | {f.hint}" for f in found if f.where == "weights"]


LANE = '[lanes.a]\nunit = "a.service"\nport = 8000\nserved_model_name = "a"\n{}[lanes.a.exec]\ncommand = ["vllm", "serve", "/m/a"]\n'  # fmt: skip


def test_preflight_notes_how_much_of_the_weights_a_start_would_find_cached() -> None:
    assert weights_notes(LANE.format(""), (3 * 2**30, 12 * 2**30)) == [
        "3.0 GiB of 12.0 GiB of its weight files are in the page cache (25%); a cold start reads "
        "the rest off disk | a swap to it reads them in while the running lane drains "
        "([daemon.prefetch])"
    ]
    assert weights_notes(LANE.format(""), (12 * 2**30, 12 * 2**30)) == [
        "12.0 GiB of 12.0 GiB of its weight files are in the page cache (100%) | "
    ]
    assert weights_notes(LANE.format("prefetch = false\n"), (0, 2**30))[0].endswith("off disk | ")
    assert weights_notes(LANE.format(""), None) == []
