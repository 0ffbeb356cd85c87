"""vLLM's weight-cache daemon and an engine, between them (the simulator's): the sockets'
names, the wire and the fingerprint, whose checkpoint is the safetensors headers' hash as
vLLM's (vllm/model_executor/model_loader/weight_cache/protocol.py), and the engine's side of `--load-format ipc_cache` (ipc_loader.py load_model).
laned/sim/preload.py plays the daemon; laned/sim/startup.py asks here at an engine's start.
The simulator's own copy of the wire (laned.engines.vllm_preload has laned's): its image holds a bare
Python and laned/sim alone."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import hashlib
import io
import json
import os
import pickle
import struct
import tempfile
from collections.abc import Mapping
from typing import Any

VLLM_VERSION = "0.32.0"  # the fingerprint's vllm_version: the daemon's and the engine's agree

SOCKET_NAME = "vllm_weight_cache_{gpu}{role}.sock"
# The fingerprint's fields the simulator can tell apart (protocol.py WeightCacheKey).
KEY_FLAGS = {
    "--tensor-parallel-size": "tp_size",
    "-tp": "tp_size",
    "--pipeline-parallel-size": "pp_size",
    "--data-parallel-size": "dp_size",
    "--dtype": "dtype",
    "--quantization": "quantization",
    "-q": "quantization",
    "--revision": "revision",
}


def gpu_uuid(rank: int) -> str:
    """The simulated GPU of a rank."""
    return f"GPU-laned-sim-{rank}"


def socket_path(directory: str, rank: int) -> str:
    """protocol.py get_socket_path: the GPU's uuid hashed (md5) into the name."""
    digest = hashlib.md5(gpu_uuid(rank).encode(), usedforsecurity=False).hexdigest()
    return os.path.join(directory, SOCKET_NAME.format(gpu=digest, role=""))


def default_socket_dir() -> str:
    """protocol.py get_socket_dir: a per-user directory under the temp dir."""
    return os.path.join(tempfile.gettempdir(), f"vllm_weight_cache_{os.getuid()}")


INDEX = "model.safetensors.index.json"  # transformers' SAFE_WEIGHTS_INDEX_NAME


def hash_checkpoint(model: str) -> str | None:
    """protocol.py hash_checkpoint: md5 over each local shard's name and safetensors header
    (its 8-byte length, then the JSON of tensor names, dtypes, shapes and offsets: not one
    byte of the weights), the shards sorted by name, only those the index names where there
    is one (weight_utils.py filter_duplicate_safetensors_files); None where no local shard
    is found (the key then holds the model's path). So, as in vLLM, a checkpoint replaced by
    one of the same shapes keeps its fingerprint. Not played: vLLM's FileNotFoundError for a
    shard the index names and the directory lacks."""
    if not os.path.isdir(model):
        return None
    files = glob.glob(os.path.join(model, "*.safetensors"))
    index = os.path.join(model, INDEX)
    if os.path.isfile(index):
        with open(index, encoding="utf-8") as handle:
            named = {os.path.join(model, f) for f in json.load(handle)["weight_map"].values()}
        files = [f for f in files if f in named]
    if not files:
        return None
    hasher = hashlib.md5(usedforsecurity=False)
    for path in sorted(files, key=os.path.basename):
        hasher.update(os.path.basename(path).encode())
        with open(path, "rb") as handle:
            size = handle.read(8)
            (length,) = struct.unpack("<Q", size)
            hasher.update(size + handle.read(length))
    return hasher.hexdigest()


def fingerprint(
    model: str, flags: Mapping[str, str], checkpoint: str | None = None
) -> dict[str, Any]:
    """WeightCacheKey, as far as the simulator knows the model: its checkpoint (`checkpoint`,
    hash_checkpoint's, else the model's path), the ranks, dtype, quantization, revision and
    vLLM's version."""
    key: dict[str, Any] = {
        "checkpoint": checkpoint or model,
        "tp_size": 1,
        "pp_size": 1,
        "dp_size": 1,
        "dtype": "auto",
        "quantization": None,
        "revision": None,
        "vllm_version": VLLM_VERSION,
    }
    for flag, name in KEY_FLAGS.items():
        if flag in flags:
            value = flags[flag]
            key[name] = int(value) if name.endswith("_size") and value.isdigit() else value
    return key


# --- the wire (protocol.py send_msg / recv_msg) ---------------------------------------------


LENGTH, MAX = struct.Struct("!Q"), 1 << 30


class _Plain(pickle.Unpickler):
    """Plain data only: a class or function named in the stream is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}")


def encode(message: Any) -> bytes:
    """One message: its length, then its pickle."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return LENGTH.pack(len(payload)) + payload


async def read_message(reader: asyncio.StreamReader) -> Any:
    """One message from the stream."""
    (length,) = LENGTH.unpack(await reader.readexactly(LENGTH.size))
    if length > MAX:
        raise ValueError(f"message of {length} bytes")
    return _Plain(io.BytesIO(await reader.readexactly(length))).load()


# --- the engine's side: --load-format ipc_cache --------------------------------------------


async def map_weights(
    model: str, flags: Mapping[str, str], extra: Mapping[str, Any], tp_rank: int = 0
) -> tuple[bool, str]:
    """Ask the daemon of this node's first GPU for the weights of global rank `tp_rank`
    (ipc_loader.py load_model: the socket of the local GPU, the key with the engine's own
    tensor-parallel rank, `node_rank * (tp // nnodes)` on node r): (True, its tensors) when
    mapped, (False, why) when the engine falls back to disk."""
    directory = extra.get("socket_dir") or default_socket_dir()
    path = extra.get("socket_path") or socket_path(directory, 0)
    if not os.path.exists(path):
        return False, (
            f"Weight cache socket {path} is unavailable: [Errno 2] No such file or "
            f"directory: {path!r}"
        )
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_unix_connection(path), 5.0)
    except (OSError, asyncio.TimeoutError) as exc:
        return False, f"Cannot connect to weight cache daemon at {path}: {exc}"
    try:
        # ipc_loader.py: the engine's key is made at its load, from the files as they are now.
        key = {**fingerprint(model, flags, hash_checkpoint(model)), "tp_rank": tp_rank}
        writer.write(encode({"cmd": "get_state", "cache_config": key}))
        await writer.drain()
        answer = await asyncio.wait_for(read_message(reader), 300.0)
    except (OSError, asyncio.IncompleteReadError, asyncio.TimeoutError, ValueError) as exc:
        return False, f"Weight cache daemon error: {exc}"
    finally:
        writer.close()
    if answer.get("status") == "mismatch":
        return False, f"WeightCacheKey mismatch on fields: {answer.get('fields')}"
    if answer.get("status") != "ok":
        return False, f"Weight cache daemon error: {answer.get('message')}"
    if extra.get("mode") == "copy":
        with contextlib.suppress(OSError, asyncio.IncompleteReadError, ValueError):
            reader, writer = await asyncio.open_unix_connection(path)
            writer.write(encode({"cmd": "release"}))
            await writer.drain()
            await read_message(reader)
            writer.close()
    return True, str(answer.get("entries", 0))
