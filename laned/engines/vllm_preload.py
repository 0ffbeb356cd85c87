"""vLLM's weight cache (`vllm preload`, vLLM 0.32): what laned knows of it, in one place
(laned.engines.profile.WeightCacheApi, part of vLLM's profile in laned.engines.vllm).

- The daemon's command from the engine's (`serve MODEL` → `preload --model MODEL`), and which
  of the engine's flags it gets: not the API server's (preload's parser refuses them), not
  the weightless ones (a change to those restarts the engine alone).
- What the engine gets (`--load-format ipc_cache`, the sockets) and the daemon's own flags.
- Its rules: what vLLM refuses (sleep mode with zero-copy, no CUDA IPC, a quantization whose
  layers cannot take pre-processed weights), its ports apart from the engine's, its sockets'
  paths within what AF_UNIX takes.
- Its wire (a length, then a pickle), read back as plain data only.
- The notes its log lines give (mapped, or missed and read from disk).
"""

from __future__ import annotations

import io
import pickle
import struct
from collections.abc import Sequence
from typing import Any

from laned.config.model import LaneConfig
from laned.config.names import AF_UNIX_MAX, WEIGHTS_SOCKETS_MOUNT, weights_sockets_dir
from laned.config.ranks import resolve
from laned.config.sleep import LOOPBACK
from laned.core.facts import LaneFacts
from laned.engines.profile import Line, WeightCacheApi, Wire, words
from laned.errors import Finding, Severity

WC_MAPPED = "weights mapped from the weight cache"
WC_MISSED = "weight cache missed: weights read from disk"

# --- the weight cache: `vllm preload` (vLLM 0.32) ---------------------------------------------
#
# Read in vllm/entrypoints/cli/preload.py and vllm/model_executor/model_loader/weight_cache/:
# one daemon per GPU loads the model once (the default loader, from disk) and holds the
# post-quantization, TP-sharded weights; an engine started with --load-format ipc_cache maps
# them through CUDA IPC (ipc_loader.py), or falls back to disk with a warning when no daemon
# answers or its fingerprint (protocol.py WeightCacheKey: checkpoint, architecture, TP/PP/DP
# rank, dtype, quantization, revision, vLLM version) differs.

# Flags of `vllm serve` that `vllm preload` refuses: the API server's (preload's parser is
# EngineArgs' alone, preload.py add_cli_args). Read off vLLM 0.32's two parsers: serve's option
# strings less preload's; tests/vllm/test_weight_cache_flags.py reads them again.
SERVER_ONLY = words(
    """
    --allow-credentials --allowed-headers --allowed-methods --allowed-origins
    --anthropic-disabled-thinking-effort --api-key --api-server-count --chat-template
    --chat-template-content-format --cohere-format --cohere-is-reasoning-model --config
    --data-parallel-supervisor-port --default-chat-template-kwargs
    --disable-access-log-for-endpoints --disable-fastapi-docs --disable-uvicorn-access-log
    --dp-supervisor-probe-failure-threshold --dp-supervisor-probe-interval-s
    --dp-supervisor-probe-timeout-s --enable-auto-tool-choice --enable-flash-late-interaction
    --enable-force-include-usage --enable-log-deltas --enable-log-outputs --enable-log-requests
    --enable-offline-docs --enable-per-request-metrics --enable-prompt-tokens-details
    --enable-request-id-headers --enable-scale-out --enable-server-load-tracking
    --enable-ssl-refresh --enable-tokenizer-info-endpoint --exclude-tools-when-tool-choice-none
    --fingerprint-mode --fingerprint-value --grpc --grpc-port --h11-max-header-count
    --h11-max-incomplete-event-size --headless --host --log-error-stack --lora-modules
    --max-log-len --middleware --port --response-role --return-tokens-as-token-ids --root-path
    --sse-keep-alive-interval --ssl-ca-certs --ssl-cert-reqs --ssl-certfile --ssl-ciphers
    --ssl-keyfile --tokens-only --tool-call-parser --tool-parser-plugin --tool-server
    --tool-strict-level --trust-request-chat-template --trust-request-mm-kwargs --uds
    --uvicorn-log-level
    """
)

# Engine flags that shape the scheduler, the KV cache's size, the memory budget, compilation
# or what requests get, never the weights the daemon holds (none is in its fingerprint or
# builds a layer differently): the daemon does not get them, so changing one restarts the
# engine alone. Anything not named here reaches the daemon too (a change restarts both).
WEIGHTLESS = words(
    """
    --max-num-seqs --max-num-batched-tokens --max-model-len --gpu-memory-utilization
    --kv-cache-memory --kv-cache-memory-bytes --num-gpu-blocks-override --block-size
    --enable-prefix-caching --no-enable-prefix-caching --prefix-caching-hash-algo
    --enable-chunked-prefill --no-enable-chunked-prefill --max-num-partial-prefills
    --max-long-partial-prefills --long-prefill-token-threshold --scheduling-policy
    --enforce-eager --compilation-config --cudagraph-capture-sizes --max-cudagraph-capture-size
    --served-model-name --override-generation-config --generation-config --reasoning-parser
    --disable-log-stats --enable-sleep-mode --shutdown-timeout --seed
    --structured-outputs-config --async-scheduling --no-async-scheduling --swap-space
    --kv-events-config --kv-transfer-config --otlp-traces-endpoint --collect-detailed-traces
    """
)

# Which of the flags above take no value (store_true or its --no- twin): the rest take one.
SWITCHES = words(
    """
    --enable-auto-tool-choice --enable-prefix-caching --no-enable-prefix-caching
    --enable-chunked-prefill --no-enable-chunked-prefill --enforce-eager --disable-log-stats
    --enable-sleep-mode --async-scheduling --no-async-scheduling --headless
    --disable-uvicorn-access-log --disable-fastapi-docs --enable-log-requests
    --enable-log-outputs --enable-log-deltas --enable-prompt-tokens-details
    --enable-force-include-usage --enable-request-id-headers --enable-server-load-tracking
    --enable-tokenizer-info-endpoint --return-tokens-as-token-ids --tokens-only
    --trust-request-chat-template --allow-credentials --grpc --enable-ssl-refresh
    --enable-offline-docs --exclude-tools-when-tool-choice-none --log-error-stack
    --language-model-only --trust-remote-code --enable-expert-parallel
    --disable-custom-all-reduce --skip-tokenizer-init
    """
)

# Quantization methods whose every layer method takes pre-processed weights
# (`supports_pre_processed_weights`, checked by protocol.py check_ipc_quant_support): fp8.py
# (linear and MoE), mxfp4.py (MoE; its linear layers are unquantized), modelopt.py's FP4. The
# others below keep the base class's False (quantization/base_config.py), or are online
# quantization, which the daemon always refuses (daemon.py get_model); any other name (a
# plugin's, such as exl3) is the daemon's to judge at load.
QUANT_HELD = frozenset({"fp8", "mxfp4", "gpt_oss_mxfp4", "modelopt_fp4"})
QUANT_REFUSED = words(
    """
    awq auto_awq awq_marlin gptq auto_gptq gptq_marlin compressed-tensors bitsandbytes gguf
    experts_int8 moe_wna16 torchao inc fbgemm_fp8 fp_quant quark humming modelopt online
    fp8_per_tensor fp8_per_block fp8_per_channel int8_per_channel_weight_only nvfp4_per_token
    mxfp8
    """
)

WEIGHT_CACHE_DOC = "docs/weight-cache.md"

# The daemon's longest socket name (protocol.py get_socket_path: the GPU's uuid hashed by
# safe_hash, md5's 32 hex digits, and `_draft` for a speculative draft's group): 61 bytes.
SOCKET_NAME = "vllm_weight_cache_<md5 of the GPU's uuid>_draft.sock"
SOCKET_NAME_MAX = len("vllm_weight_cache_") + 32 + len("_draft.sock")

# The daemon's wire (protocol.py send_msg / recv_msg): an 8-byte big-endian length, then a
# pickle. laned writes plain dicts and reads the answers back as plain data only.
WC_LENGTH = struct.Struct("!Q")
WC_MAX = 1 << 30


def wc_message(message: Any) -> bytes:
    """One message to a daemon: its length, then its pickle (of plain data)."""
    payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    return WC_LENGTH.pack(len(payload)) + payload


class _PlainOnly(pickle.Unpickler):
    """Unpickles plain data only (dicts, lists, strings, numbers): a class or function
    named in the stream is refused, so a reply can build nothing."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: plain data only")


def wc_read(payload: bytes) -> Any:
    """A message's pickle, read back as plain data (pickle.UnpicklingError otherwise)."""
    return _PlainOnly(io.BytesIO(payload)).load()


def wc_answer(payload: bytes) -> Any:
    """An answer's pickle as plain data; ValueError for one refused or cut short."""
    try:
        return wc_read(payload)
    except (pickle.UnpicklingError, EOFError) as exc:
        raise ValueError(f"not an answer of plain data: {exc}") from exc


def wc_held(answer: Any) -> tuple[bool, object]:
    """get_memory's answer (daemon.py): `{"status": "ok", "memory_bytes": N}`."""
    if isinstance(answer, dict) and answer.get("status") == "ok":
        return True, answer.get("memory_bytes")
    return False, None


# What laned asks a rank (daemon.py `get_memory`), and how it reads the answer.
WIRE = Wire(wc_message({"cmd": "get_memory"}), WC_LENGTH, WC_MAX, wc_answer, wc_held)


def preload_command(words: Sequence[str]) -> list[str] | None:
    """The daemon's command from the engine's: `... serve MODEL REST` becomes `... preload
    --model MODEL REST` (preload takes the model as --model only); None without `serve MODEL`."""
    words = list(words)
    if "serve" not in words:
        return None
    at = words.index("serve")
    if at + 1 >= len(words) or words[at + 1].startswith("-"):
        return None
    return [*words[:at], "preload", "--model", words[at + 1], *daemon_flags(words[at + 2 :])]


def daemon_flags(words: Sequence[str]) -> list[str]:
    """The engine's flags the daemon gets: all but the API server's and the weightless ones."""
    return [word for word, kept in zip(words, daemon_mask(words), strict=True) if kept]


def daemon_mask(words: Sequence[str]) -> list[bool]:
    """For each of the engine's words, whether the daemon gets it: the API server's flags
    and the weightless ones are dropped with their values (`--flag=V`, or `--flag V` unless
    a switch)."""
    mask = [True] * len(words)
    i = 0
    while i < len(words):
        word = words[i]
        flag = word.split("=", 1)[0].replace("_", "-") if word.startswith("--") else ""
        takes = bool(flag) and "=" not in word and flag not in SWITCHES
        value = takes and i + 1 < len(words) and not words[i + 1].startswith("--")
        step = 2 if value else 1
        if flag in SERVER_ONLY or flag in WEIGHTLESS:
            mask[i : i + step] = [False] * step
        i += step if flag else 1
    return mask


def weight_cache_engine_lines(spec: LaneConfig, base: str, sockets: str) -> list[Line]:
    """What the engine gets to map the daemon's weights (ipc_loader.py: zero-copy, the
    fallback to disk on)."""
    config = '{"socket_dir":"' + sockets + '"}'
    return [
        (
            f"set by laned from {base}.weight_cache: the weights are mapped from the lane's "
            "weight-cache daemon (CUDA IPC, zero-copy), read from disk only if it does not answer",
            ["--load-format", "ipc_cache"],
        ),
        ("the daemon's sockets, one per GPU", ["--model-loader-extra-config", config]),
    ]


def weight_cache_daemon_lines(spec: LaneConfig, base: str, sockets: str) -> list[Line]:
    """The daemon's own flags: its sockets, its rendezvous apart from the engine's, its /health."""
    health, master, draft = spec.weight_cache_ports()
    return [
        ("where the engine finds it: one socket per GPU", ["--weight-cache-socket-dir", sockets]),
        (
            f"from {base}.weight_cache: its own rendezvous, apart from the engine's "
            "--master-port (the daemon holds its group open while it serves)",
            ["--weight-cache-master-port", str(master)],
        ),
        ("its speculative draft's group, if any", ["--weight-cache-draft-master-port", str(draft)]),
        (
            f"from {base}.weight_cache: laned waits for 200 here before it starts the engine",
            ["--weight-cache-health-port", str(health), "--weight-cache-health-host", LOOPBACK],
        ),
    ]


def _quantization(spec: LaneConfig) -> str | None:
    return spec.engine_arg("--quantization") or spec.engine_arg("-q")


def quant_finding(where: str, method: str | None, source: str) -> Finding | None:
    """Whether the daemon can hold weights quantized with `method`: an error where vLLM
    refuses it, a warning where laned cannot tell, None where it can."""
    if method is None or method in QUANT_HELD:
        return None
    if method in QUANT_REFUSED:
        return Finding(
            where,
            f"quantization {method!r} ({source}): vLLM's weight cache cannot hold it (its "
            "layers do not take pre-processed weights: protocol.py check_ipc_quant_support)",
            "remove weight_cache from this lane (it restarts from disk), or serve a "
            f"checkpoint in {', '.join(sorted(QUANT_HELD))} or unquantized",
        )
    return Finding(
        where,
        f"quantization {method!r} ({source}) is not one laned knows the weight cache to hold "
        f"({', '.join(sorted(QUANT_HELD))}, or none): the daemon checks it as it loads and exits "
        "at once if its layers cannot be shared",
        f"watch the daemon's first start: journalctl --user -u UNIT-weights.service (the lane's unit, -weights); see {WEIGHT_CACHE_DOC}",
        Severity.WARNING,
    )


EXPANDABLE = "expandable_segments:True"
EXPANDABLE_WHY = (
    "set by laned for the daemon alone: with expandable segments, torch hands its CUDA IPC "
    "handles over as file descriptors (pidfd_getfd), which an engine in another container or "
    "without ptrace rights cannot take (pytorch/pytorch#165685, #179220), and the engine "
    "would read its weights from disk"
)


def daemon_env(name: str, value: str) -> tuple[str, str] | None:
    """The daemon's own value of one of the lane's variables, and why, where it must differ
    from the engine's: PYTORCH_CUDA_ALLOC_CONF without expandable segments."""
    if name not in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF") or EXPANDABLE not in value:
        return None
    kept = [part for part in value.split(",") if part.strip() and part.strip() != EXPANDABLE]
    return ",".join(kept) or "expandable_segments:False", EXPANDABLE_WHY


def weight_cache_findings(spec: LaneConfig, base: str) -> list[Finding]:
    """What vLLM refuses of a lane that keeps its weights, seen in the config."""
    if spec.weight_cache is None:
        return []
    where = f"{base}.weight_cache"
    out: list[Finding] = []
    if preload_command(spec.command_words()) is None:
        out.append(
            Finding(
                where,
                "the daemon is the engine's own program with `preload --model MODEL` for "
                "`serve MODEL`, and this lane's command has no `serve MODEL`",
                "write the command as `vllm serve MODEL` (exec.command or container.command)",
            )
        )
    if spec.sleep_level:
        out.append(
            Finding(
                where,
                f"cannot go with sleep_level = {spec.sleep_level}: the engine maps the daemon's "
                "memory zero-copy, which vLLM's sleep mode cannot offload (ipc_loader.py)",
                "choose one: sleep_level = 0, or remove weight_cache",
            )
        )
    if spec.gpus == ():
        out.append(
            Finding(
                where,
                "needs the lane's GPUs: vLLM shares the weights through CUDA IPC, on CUDA and "
                "ROCm only (protocol.py check_ipc_platform_support), and gpus = []",
                "remove weight_cache from this lane, or give it its GPUs",
            )
        )
    if spec.container is not None and spec.container.ipc != "host":
        out.append(
            Finding(
                where,
                "the engine's container maps the daemon's GPU memory from another container: "
                f"both need the host's IPC namespace, and container.ipc is {spec.container.ipc!r}",
                'set container.ipc = "host"',
            )
        )
    for flag in ("--load-format", "--model-loader-extra-config"):
        if spec.engine_arg(flag) is not None:
            out.append(
                Finding(
                    f"{base}.args",
                    f"{flag} is laned's to set on a lane with weight_cache "
                    "(--load-format ipc_cache and the daemon's sockets)",
                    f"remove {flag} from the args",
                )
            )
    method = _quantization(spec)
    found = quant_finding(where, method, "--quantization")
    if found is not None:
        out.append(found)
    health, master, draft = spec.weight_cache_ports()
    if max(health, master, draft) > 65535:
        out.append(
            Finding(
                where,
                f"its ports run past 65535 ({health}, {master}, {draft})",
                "set weight_cache.health_port and master_port below 65535",
            )
        )
    ranks = [(where, spec)]
    if spec.nodes:  # every rank as its host runs it (its values and args filled in)
        ranks = [(f"{where} (rank {n}, {node.host})", resolve(spec, n)) for n, node in enumerate(spec.nodes)]  # fmt: skip
    for at, rank in ranks:
        master_port = rank.engine_arg("--master-port")
        if master_port is not None and master_port in (str(health), str(master), str(draft)):
            out.append(
                Finding(
                    at,
                    f"the daemon's port {master_port} is the engine's --master-port: "
                    "the daemon holds it while it serves, and the engine could not start",
                    "set weight_cache.master_port to another port",
                )
            )
    if spec.nodes:
        out += _over_nodes(spec, where, [rank for _, rank in ranks])
    return out


def _over_nodes(spec: LaneConfig, where: str, ranks: list[LaneConfig]) -> list[Finding]:
    """A lane over several hosts: one daemon per host, all in one group (weight_cache/daemon.py
    module docstring; preload.py PreloadSubcommand.cmd). Each reuses its engine's --nnodes,
    --node-rank and --master-addr, and they meet at the head's --master-addr on
    weight_cache.master_port (the draft group's on the next): the same on every rank, which
    one config gives them. What vLLM refuses of it, and what would leave a daemon waiting."""
    out: list[Finding] = []
    addresses = {rank.engine_arg("--master-addr") for rank in ranks}
    if None in addresses:
        out.append(
            Finding(
                where,
                "the daemons of a lane over several hosts meet at the engine's --master-addr "
                "(preload.py PreloadSubcommand.cmd: parallel_config.master_addr), and a rank "
                "has none",
                "give every rank --master-addr, the head's address (docs/multinode.md)",
            )
        )
    elif len(addresses) > 1:
        out.append(
            Finding(
                where,
                f"the ranks' --master-addr differ ({', '.join(sorted(str(a) for a in addresses))}): "
                "every host's daemon must reach the head's, where rank 0's daemon hosts the group",
                "set --master-addr to the head's address on every rank",
            )
        )
    sizes = [spec.engine_arg(flag) or "1" for flag in ("--tensor-parallel-size", "--pipeline-parallel-size", "--data-parallel-size")]  # fmt: skip
    world = 1
    for size in sizes:
        world *= int(size) if size.isdigit() else 1
    if world % len(spec.nodes):
        out.append(
            Finding(
                where,
                f"{len(spec.nodes)} nodes do not evenly divide the daemons' world of {world} "
                "ranks (tensor x pipeline x data parallel): vLLM's daemon refuses it "
                "(daemon.py _reject_unsupported_parallelism)",
                "give each host the same number of the lane's GPUs",
            )
        )
    return out


def socket_findings(lane: str, spec: LaneConfig, runtime_dir: str) -> list[Finding]:
    """The daemon's sockets against the longest AF_UNIX path: in the user's runtime directory
    (where the daemon of an exec lane binds them, its engine connects, and laned asks each
    rank what it holds) and, for a container lane, where both containers see them."""
    if spec.weight_cache is None:
        return []
    runtime = runtime_dir.rstrip("/")
    places = [(f"{runtime}/{weights_sockets_dir(lane)}", "the runtime directory")]
    if spec.container is not None:
        places.append((WEIGHTS_SOCKETS_MOUNT, "its containers"))
    out = []
    for directory, where in places:
        length = len(directory.encode()) + 1 + SOCKET_NAME_MAX
        if length <= AF_UNIX_MAX:
            continue
        room = AF_UNIX_MAX - (length - len(runtime.encode()))
        out.append(
            Finding(
                f"lanes.{lane}.weight_cache",
                f"its daemon's sockets in {directory} ({where}) would be {length} bytes long "
                f"with their names ({SOCKET_NAME_MAX} bytes: {SOCKET_NAME}), more than the "
                f"{AF_UNIX_MAX} an AF_UNIX path may be: the daemon could not bind them",
                f"run laned and the user manager with an XDG_RUNTIME_DIR of {room} bytes or "
                f"fewer (it is {runtime}, {len(runtime.encode())} bytes; systemd's own is "
                "/run/user/UID)",
            )
        )
    return out


def weight_cache_preflight(lane: str, spec: LaneConfig, facts: LaneFacts) -> list[Finding]:
    """What vLLM refuses of a lane that keeps its weights, on this host: a quantization the
    daemon cannot hold (the model's own config.json), a host without CUDA IPC."""
    if spec.weight_cache is None:
        return []
    where = f"lanes.{lane}.weight_cache"
    out: list[Finding] = []
    if _quantization(spec) is None:
        found = quant_finding(where, facts.model_quantization, "the model's config.json")
        if found is not None:
            out.append(found)
    if facts.runtime_dir is not None:
        out += socket_findings(lane, spec, facts.runtime_dir)
    if facts.host.gpus is None:
        out.append(
            Finding(
                where,
                "laned cannot see a CUDA GPU here (" + (facts.host.gpu_note or "no NVML") + "); "
                "vLLM shares the weights through CUDA IPC only and refuses the weight cache "
                "elsewhere (protocol.py check_ipc_platform_support)",
                "fine for the simulator; on a GPU host, check `nvidia-smi`",
                Severity.WARNING,
            )
        )
    return out


WEIGHT_CACHE = WeightCacheApi(
    command=preload_command,
    flags=daemon_mask,
    engine_lines=weight_cache_engine_lines,
    daemon_lines=weight_cache_daemon_lines,
    missed=WC_MISSED,
    env=daemon_env,
    socket_glob="vllm_weight_cache_*[!t].sock",  # the targets' (a draft's ends _draft.sock)
    findings=weight_cache_findings,
    preflight=weight_cache_preflight,
    sockets=socket_findings,
    daemon="vllm preload",
    subcommand="preload",
    since="vLLM 0.32",
    mark=("--load-format", "ipc_cache"),
    engine_flags=("--load-format", "--model-loader-extra-config"),
    socket_name=SOCKET_NAME,
    socket_name_max=SOCKET_NAME_MAX,
    wire=WIRE,
)
