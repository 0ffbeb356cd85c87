"""Startup phases read from vLLM's log lines as journald delivers them (laned.core.phases)."""

from __future__ import annotations

from laned.core.phases import CACHE_HIT, Phase, Seen, add_mark, last_segment
from laned.engines.vllm import read_line
from tests.helpers import ROOT, parse_phase

GRAPHS = "Capturing CUDA graphs (mixed prefill-decode, PIECEWISE)"


def bar(desc: str, done: int, total: int, elapsed: str) -> str:
    return f"\r{desc}: {done * 100 // total:3d}%|██        | {done}/{total} [{elapsed}<00:05,  2.00it/s]"


def test_a_redrawn_bar_is_read_by_its_last_segment_with_tqdms_elapsed_time() -> None:
    closed = "".join(bar(GRAPHS, i, 67, f"01:{i:02d}") for i in range(68)) + "\n"
    assert last_segment(closed).startswith(GRAPHS + ": 100%")
    assert read_line(closed) == Seen(Phase.CUDA_GRAPHS.value, 100.0, 67 + 60.0)
    # A piece of a long bar (past journald's line limit) still says how far it got.
    piece = "".join(bar(GRAPHS, i, 67, f"00:{i:02d}") for i in range(10, 20))
    assert read_line(piece) == Seen(Phase.CUDA_GRAPHS.value, round(100 * 19 / 67, 1), 19.0)
    hours = bar("DeepGemm(fp8_gemm_nt) warmup (W=torch.Size([4096, 7168]))", 8, 8, "1:02:03")
    assert read_line(hours) == Seen(Phase.DEEPGEMM.value, 100.0, 3723.0)


def test_the_shard_bar_ends_each_redraw_with_a_newline_but_starts_it_with_cr() -> None:
    line = "\rLoading safetensors checkpoint shards:  37% Completed | 3/8 [00:01<00:02,  2.0s/it]"
    assert read_line(line) == Seen(Phase.LOADING_WEIGHTS.value, 37.5, 1.0)


def test_both_api_server_lines_and_the_end_of_the_engines_start() -> None:
    for line in (
        "INFO 12-03 [api_server.py:1] Starting vLLM server on http://0.0.0.0:8000",
        "INFO 12-03 [api_server.py:1] Starting vLLM API server 0 on http://0.0.0.0:8000",
        "(EngineCore_DP0 pid=9) INFO [core.py:1] init engine (profile, create kv cache, warmup model) took 812.44 seconds",
        "INFO [api_server.py:1] Supported tasks: ['generate']",
        "INFO [launcher.py:1] Available routes are:",
    ):
        assert parse_phase(line) == (Phase.API_SERVER.value, None), line
    assert parse_phase("INFO:     Application startup complete.") == ("serving", None)


def test_a_cached_or_skipped_autotune_is_a_note_not_a_phase() -> None:
    cached = read_line("INFO [kernel_warmup.py:1] Using FlashInfer autotune cache file: /c/a.json")
    assert cached == Seen(None, note=f"{CACHE_HIT} (FlashInfer autotune)")
    skipped = read_line("INFO [kernel_warmup.py:1] Skipping FlashInfer autotune because it is disabled.")  # fmt: skip
    assert skipped == Seen(None, note="FlashInfer autotune skipped")
    assert parse_phase("flashinfer.jit: [Autotuner]: Autotuning process starts") == (
        Phase.AUTOTUNE.value,
        None,
    )
    graphs = read_line(
        "(EngineCore_DP0 pid=1) INFO [backends.py:292] Directly load the compiled graph(s) for "
        "compile range (1, 8192) from the cache, took 0.648 s"
    )
    assert graphs == Seen(Phase.TORCH_COMPILE.value, note=f"{CACHE_HIT} (torch.compile)")


def test_a_bar_that_arrives_at_its_close_is_marked_where_it_began() -> None:
    marks = [("loading weights", 0.0), ("profiling memory", 100.0)]
    # The DeepGEMM bars arrive one by one at their close; the phase began with the first.
    marks = add_mark(marks, "DeepGEMM JIT", 110.0)
    marks = add_mark(marks, "DeepGEMM JIT", 150.0)
    assert marks[-1] == ("DeepGEMM JIT", 110.0)
    # The CUDA-graph bar arrives at 300 having run for 60 s: it began at 240.
    marks = add_mark(marks, "capturing CUDA graphs", 240.0)
    assert [m[0] for m in marks] == [
        "loading weights",
        "profiling memory",
        "DeepGEMM JIT",
        "capturing CUDA graphs",
    ]
    # A redraw seen before the bar's first mark moves the mark back, never adds one.
    assert add_mark(marks, "capturing CUDA graphs", 230.0)[-1] == ("capturing CUDA graphs", 230.0)


def test_real_vllm_0_32_cpu_startup_reads_as_its_phases_and_no_others() -> None:
    # The whole startup of real vLLM (tests/golden/vllm-0.32-cpu-startup.log): its config
    # dump names enable_flashinfer_autotune=True, which once showed as the autotune phase on
    # a build that has no FlashInfer; the CPU build's KV-cache line says "CPU KV cache size".
    log = (ROOT / "tests" / "golden" / "vllm-0.32-cpu-startup.log").read_text()
    phases = []
    for line in log.splitlines():
        seen = None if line.startswith("#") else read_line(line)
        if seen is not None and seen.phase is not None and seen.phase not in phases[-1:]:
            phases.append(seen.phase)
    assert phases == [
        Phase.LOADING_MODEL.value,
        Phase.LOADING_WEIGHTS.value,
        Phase.WEIGHTS_LOADED.value,
        Phase.PROFILING.value,
        Phase.API_SERVER.value,
        Phase.SERVING.value,
    ]
    assert any("enable_flashinfer_autotune=True" in line for line in log.splitlines())
