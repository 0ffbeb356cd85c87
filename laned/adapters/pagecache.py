"""A model's files on this host and the page cache: its weight files and their size, its
generation config, its checkpoint's identity (each weight and config file's stat: no byte
read), how much of the weights is resident (mincore),
reading them in ahead of an engine (a prefetch, bounded in rate and in the memory it may
fill, stopped at a word), and dropping them (POSIX_FADV_DONTNEED, for benches and tests).

Blocking throughout: callers run these off the event loop. The prefetch reads the files in
order, in blocks, as vLLM's own `--safetensors-load-strategy=prefetch` does (vllm/
model_executor/model_loader/weight_utils.py `_prefetch_checkpoint`: plain reads of 16 MiB);
plain reads rather than POSIX_FADV_WILLNEED because a read's progress can be counted, paced
and stopped, where WILLNEED queues the whole range at once.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import json
import mmap
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from laned.core.checkpoint import Files, FileStat
from laned.core.facts import GIB
from laned.core.page_cache import Prefetched, Residency

WEIGHT_FILES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
# What else of a model's directory the engine reads at its start and a weight-cache daemon
# builds its layers from: config.json, generation_config.json, the safetensors index (which
# shards vLLM loads), the tokenizer's files, chat templates, remote code (--trust-remote-code).
CONFIG_SUFFIXES = (".json", ".jinja", ".py", ".tiktoken")
CONFIG_NAMES = frozenset({"tokenizer.model", "merges.txt", "vocab.txt"})
BLOCK = 16 * 2**20  # vLLM's DEFAULT_SAFETENSORS_PREFETCH_BLOCK_SIZE (vllm/config/load.py)
PAGE = mmap.PAGESIZE

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_libc.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
_MAP_FAILED = ctypes.c_void_p(-1).value


def weight_files(model: str | None) -> list[str]:
    """The model directory's weight files, sorted as vLLM loads them; [] where there is no
    local directory (a hub name) or no weight file in it."""
    if not model or not os.path.isdir(model):
        return []
    found = []
    for where, _dirs, files in os.walk(model):
        found += [os.path.join(where, name) for name in files if name.endswith(WEIGHT_FILES)]
    return sorted(found)


def config_files(model: str | None) -> list[str]:
    """The model directory's own config files (its top level: CONFIG_SUFFIXES, CONFIG_NAMES),
    sorted; [] where there is no local directory."""
    if not model or not os.path.isdir(model):
        return []
    try:
        names = os.listdir(model)
    except OSError:
        return []
    return sorted(
        os.path.join(model, n) for n in names if n.endswith(CONFIG_SUFFIXES) or n in CONFIG_NAMES
    )


def read_checkpoint(model: str | None) -> Files:
    """The model's checkpoint as the file system has it now: each weight file's and config
    file's path, size, mtime and inode, by stat alone (no byte of a weight read: hundreds of
    shards take milliseconds); a model that is one file (a GGUF) is that file; () where there
    is no local model. A file that goes while it is read is left out (a change all the same)."""
    if model and os.path.isfile(model):
        paths = [model]
    else:
        paths = sorted({*weight_files(model), *config_files(model)})
    out = []
    for path in paths:
        try:
            info = os.stat(path)
        except OSError:
            continue
        out.append(FileStat(path, info.st_size, info.st_mtime_ns, info.st_ino))
    return tuple(out)


_LOW_BIT = bytes(b & 1 for b in range(256))  # mincore: a page is resident where bit 0 is set
WINDOW = 2**30  # mapped and asked a GiB at a time: a vector of 256 KiB, whatever the file


def resident_bytes(path: str) -> tuple[int, int]:
    """(bytes of `path` in the page cache, its size), by mincore(2) over read-only mappings
    (mapping a file reads none of it). (0, 0) for a file that cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return 0, 0
    try:
        size, pages = os.fstat(fd).st_size, 0
        for offset in range(0, size, WINDOW):
            length = min(WINDOW, size - offset)
            address = _libc.mmap(None, length, mmap.PROT_READ, mmap.MAP_SHARED, fd, offset)
            if address in (None, _MAP_FAILED):
                return 0, size
            try:
                vec = (ctypes.c_ubyte * ((length + PAGE - 1) // PAGE))()
                if _libc.mincore(address, length, vec) != 0:
                    return 0, size
                pages += bytes(vec).translate(_LOW_BIT).count(1)
            finally:
                _libc.munmap(address, length)
        return min(pages * PAGE, size), size
    finally:
        os.close(fd)


def residency(files: Sequence[str]) -> Residency:
    """How much of `files` is in the page cache now."""
    resident = total = 0
    for path in files:
        r, s = resident_bytes(path)
        resident, total = resident + r, total + s
    return Residency(resident, total, len(files))


def evict(files: Sequence[str]) -> None:
    """Drop the files' clean pages from the page cache (POSIX_FADV_DONTNEED)."""
    for path in files:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def prefetch(
    files: Sequence[str],
    budget_bytes: int,
    max_bytes_per_s: float,
    stop: threading.Event,
    memory_left: Callable[[], float] = lambda: float("inf"),
) -> Prefetched:
    """Read `files` in order into the page cache, BLOCK at a time: at most `budget_bytes`
    of what is not resident yet, at most `max_bytes_per_s` (0: the disk's own pace), ended
    at once when `stop` is set or when `memory_left()` (bytes the host can still spare) is
    gone. A file wholly resident already is skipped and not counted."""
    began, read = time.monotonic(), 0
    buffer = bytearray(BLOCK)
    for path in files:
        present, size = resident_bytes(path)
        if size == 0 or present >= size:
            continue
        try:
            handle = open(path, "rb", buffering=0)  # noqa: SIM115  # closed below
        except OSError:
            continue
        with handle:
            while True:
                if stop.is_set():
                    return Prefetched(read, time.monotonic() - began, "stopped")
                if read >= budget_bytes:
                    return Prefetched(read, time.monotonic() - began, "budget")
                if memory_left() <= 0:
                    return Prefetched(read, time.monotonic() - began, "memory")
                got = handle.readinto(memoryview(buffer)[: min(BLOCK, budget_bytes - read)])
                if not got:
                    break
                read += got
                if max_bytes_per_s > 0:  # paced: never ahead of the allowed rate
                    ahead = read / max_bytes_per_s - (time.monotonic() - began)
                    if ahead > 0 and stop.wait(ahead):
                        return Prefetched(read, time.monotonic() - began, "stopped")
    return Prefetched(read, time.monotonic() - began, "done")


def _json_in(directory: str | None, name: str) -> dict[str, Any] | None:
    """DIR/NAME as a JSON object; None when there is none (or it is unreadable)."""
    if directory is None:
        return None
    try:
        with open(os.path.join(directory, name), encoding="utf-8") as handle:
            data = json.load(handle)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_generation_config(directory: str | None) -> dict[str, Any] | None:
    """DIR/generation_config.json as a dict; None when there is none (or it is unreadable)."""
    return _json_in(directory, "generation_config.json")


def read_quantization(directory: str | None) -> str | None:
    """DIR/config.json's quantization_config.quant_method (what vLLM reads the checkpoint's
    quantization from); None without one."""
    data = _json_in(directory, "config.json")
    quant = data.get("quantization_config") if data is not None else None
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    return method if isinstance(method, str) else None


def resident_weights(model: str | None) -> tuple[int, int] | None:
    """(bytes of the model's weight files in the page cache, their bytes); None without any."""
    files = weight_files(model)
    if not files:
        return None
    found = residency(files)
    return found.resident_bytes, found.total_bytes


def weights_gib(model: str | None) -> float | None:
    """The model's weight files on disk, in GiB (what a level-1 sleep pins in host RAM);
    None where there is no local model directory or no weight file in it."""
    files = weight_files(model)
    if not files:
        return None
    total = 0
    for path in files:
        try:
            total += os.stat(path).st_size
        except OSError:
            continue
    return total / GIB
