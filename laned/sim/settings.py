"""What the simulated engine was started with: its command line and environment, parsed."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Any

from laned.errors import EngineError
from laned.sim.generation import Effective


@dataclass
class Settings:
    """Everything the engine was started with (command line, environment)."""

    model: str
    face: str = "vllm"  # the engine it plays: "vllm", or "sglang" (laned/sim/sglang.py)
    enable_metrics: bool = True  # SGLang serves /metrics only with --enable-metrics
    weights_cpu_backup: bool = False  # SGLang's --enable-weights-cpu-backup: a release keeps them
    host: str = "0.0.0.0"
    port: int = 8000
    served_model_name: str = ""
    api_key: str | None = None
    max_model_len: int = 32768
    max_num_seqs: int = 256
    # vLLM's default for its API server on GPUs of 70 GiB or more (vllm/engine/arg_utils.py):
    # a prefill runs as chunks of this many tokens, one engine step each.
    max_num_batched_tokens: int = 8192
    load_format: str = "auto"  # fastsafetensors and runai_streamer print no shard bar
    # --model-loader-extra-config (ipc_cache: the weight-cache daemon's socket_dir, mode)
    loader_config: dict[str, Any] = field(default_factory=dict)
    weight_flags: dict[str, str] = field(default_factory=dict)  # what the daemon's key compares
    flashinfer_autotune: bool = True  # --no-enable-flashinfer-autotune: skipped, and said so
    old_api_line: bool = (
        False  # "Starting vLLM API server 0 on" (before 0.11) instead of "server on"
    )
    keep_alive_on_engine_death: bool = False  # VLLM_KEEP_ALIVE_ON_ENGINE_DEATH: no exit after death
    # SGLang's /health generates a token (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION, on by
    # default) and gives up after SGLANG_HEALTH_CHECK_TIMEOUT seconds (20) with a 503.
    health_generation: bool = True
    health_timeout: float = 20.0
    legacy_metrics: bool = False  # also export vllm:gpu_cache_usage_perc (vLLM 0.9, 0.10)
    generation_config: str = "auto"  # --generation-config: auto, vllm or a directory
    override_generation_config: dict[str, Any] = field(default_factory=dict)
    generation: Effective = field(default_factory=Effective)  # what the two amount to
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    reasoning_parser: str | None = None
    auto_tool_choice: bool = False
    num_spec_tokens: int = 0
    enforce_eager: bool = False
    startup: float = 3.0
    decode_tps: float = 50.0
    prefill_tps: float = 5000.0
    fail_at_start: int | None = None
    jit: float = 0.0  # seconds of kernel autotune/JIT at a cold start without a cache
    shutdown_timeout: float = 0.0  # --shutdown-timeout: drain in-flight requests this long
    shutdown: float = 0.0  # seconds between closing the port and exiting, after SIGTERM
    hold_gpu_gib: float = 0.0  # LANED_SIM_HOLD_GPU_GIB: GPU memory taken at load (laned/sim/gpu.py)
    gpu_linger: float = 0.0  # LANED_SIM_GPU_LINGER: that memory outlives the engine this long
    sim_gpus: str | None = None  # LANED_SIM_GPUS: a simulated host's GPUs (laned/sim/gpu.py)
    visible: str | None = None  # CUDA_VISIBLE_DEVICES: its GPUs there (None: all)
    gpu_share: float | None = 0.92  # --gpu-memory-utilization (vLLM's default); SGLang: None
    mem_fraction: float = 0.85  # SGLang's --mem-fraction-static, of what is free at its start
    sim_held: dict[int, int] = field(default_factory=dict)  # what it holds there, by GPU
    cache_root: str | None = None  # VLLM_CACHE_ROOT: where the "compiled kernels" are kept
    nnodes: int = 1  # --nnodes: ranks over several nodes (laned/sim/ranks.py)
    node_rank: int = 0  # --node-rank: 0 is the head, which serves the API
    master_addr: str = "127.0.0.1"  # --master-addr: the head's rendezvous address
    master_port: int = 29501  # --master-port
    headless: bool = False  # --headless: a worker rank, no API server
    enable_sleep_mode: bool = False  # --enable-sleep-mode (laned/sim/sleep.py)
    dev_mode: bool = False  # VLLM_SERVER_DEV_MODE: the dev routes (/sleep, /wake_up, ...)
    weights_gib: float = 1.0  # LANED_SIM_WEIGHTS_GIB: what a sleep moves or drops
    reload_gibps: float = 2.0  # LANED_SIM_RELOAD_GIBPS: reload_weights' read rate
    read_weights: bool = False  # LANED_SIM_READ_WEIGHTS: the weight files are read for real
    unknown: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The model name clients use."""
        return self.served_model_name or self.model

    @property
    def kv_capacity(self) -> int:
        """KV cache capacity in tokens."""
        return max(self.max_model_len * 4, 1)


def split_flags(args: Sequence[str], switches: Collection[str], usage: str) -> dict[str, str]:
    """`--flag value`, `--flag=value` and switches (no value) into {flag: value}, as both
    engines' parsers read them: a flag not among `switches` takes the next word unless it is
    a flag itself."""
    values: dict[str, str] = {}
    i = 0
    while i < len(args):
        item = args[i]
        if not item.startswith("--"):
            raise EngineError(f"unexpected argument {item!r}", usage)
        flag, has_eq, value = item.partition("=")
        if not has_eq:
            if flag not in switches and i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 1
            else:
                value = ""
        values[flag] = value
        i += 1
    return values
