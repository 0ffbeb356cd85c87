"""What an engine's argv names, read by each engine's own rules (laned.engines): its model and
the name it serves it by (EngineProfile.model_of, served_names), and the GPUs one host gives
it (EngineProfile.gpus_of). The rows are the projects' own published launch lines where they
publish one (the source beside each), and the corners of their parsers' arithmetic."""

from __future__ import annotations

import shlex

import pytest

from laned import engines

# vLLM 0.32 (vllm/engine/arg_utils.py, vllm/config/parallel.py): argv after `vllm` -> GPUs here.
VLLM_GPUS = [
    ("serve /m", 1),
    ("serve m --tensor-parallel-size 4", 4),  # seed 001
    ("serve m -tp 2 -pp 2", 4),
    ("serve m --tensor_parallel_size=2", 2),  # FlexibleArgumentParser reads _ as -
    ("serve m -tp ${TP}", 1),  # a placeholder is no number: counted as 1
    # docs/serving/data_parallel_deployment.md, in order:
    ("serve m --data-parallel-size 4 --tensor-parallel-size 2", 8),  # "DP=4, TP=2 ... 8-GPU node"
    (
        "serve m --data-parallel-size 4 --data-parallel-size-local 2 "
        "--data-parallel-address 10.99.48.128 --data-parallel-rpc-port 13345",
        2,
    ),  # node 0: ranks 0 and 1
    (
        "serve m --headless --data-parallel-size 4 --data-parallel-size-local 2 "
        "--data-parallel-start-rank 2 --data-parallel-address 10.99.48.128 "
        "--data-parallel-rpc-port 13345",
        2,
    ),  # node 1: ranks 2 and 3
    ("serve m --data-parallel-size 4 --data-parallel-size-local 0", 0),  # the API server alone
    ("serve m --headless --data-parallel-size 4 --data-parallel-size-local 4", 4),
    ("serve m --data-parallel-size 2 --data-parallel-rank 0 --port 8000", 1),  # external LB
    ("serve m -dp=2 -tp=2", 4),  # examples/features/data_parallel: -dp=2 -tp=2
    # several hosts: each its share of the world (seed 002: TP 2 over 2 nodes)
    ("serve m --tensor-parallel-size 2 --nnodes 2 --node-rank 0", 1),
    ("serve m -tp 16 --nnodes 2 --node-rank 1", 8),
    ("serve m -dp 2 -tp 8 --nnodes 2", 8),
    ("serve m -dp 2 -tp 16 --nnodes 4 --data-parallel-size-local 1", 8),
    # expert parallel and decode context parallel add none; prefill context parallel does
    ("serve m -tp 8 -dp 2 --enable-expert-parallel", 16),
    ("serve m -tp 4 --decode-context-parallel-size 2", 4),
    ("serve m -tp 2 --prefill-context-parallel-size 2", 4),
]


@pytest.mark.parametrize(("line", "gpus"), VLLM_GPUS)
def test_vllm_counts_gpus_as_vllm_sizes_its_world(line: str, gpus: int) -> None:
    assert engines.VLLM.gpus_of(shlex.split(line), {}).count == gpus


# SGLang 0.5.23 (srt/arg_groups/fields/parallel.py, srt/managers/data_parallel_controller.py):
# argv after `python -m sglang.launch_server` -> GPUs here.
SGLANG_GPUS = [
    ("--model-path m", 1),
    ("--model-path m --tp-size 4", 4),  # the GLM cookbook
    ("--model-path m --tensor-parallel-size 4 --pp-size 2", 8),
    ("--model-path m --tp=4", 4),
    # docs/basic_usage/deepseek_v32.md, "on 8xH200/B200 GPUs":
    ("--model deepseek-ai/DeepSeek-V3.2-Exp --tp 8 --dp 8 --enable-dp-attention", 8),
    ("--model deepseek-ai/DeepSeek-V3.2-Exp --tp 8 --ep 8 --dp 8 --enable-dp-attention", 8),
    ("--model m --tp 8 --attn-dp-size 8", 8),  # the newer spelling of the same
    ("--model m --tp 8 --dp 8", 64),  # without DP attention: 8 replicas of TP 8
    ("--model-path m --dp 2 --tp 2", 4),  # "uses 4 GPUs in total"
    # several hosts: "--tp 16 and --dp 2 ... on 2 node with 8*H100"; TP 4 over two nodes
    ("--model m --tp 16 --dp 2 --enable-dp-attention --nnodes 2 --node-rank 0", 8),
    ("--model-path m --tp 4 --dist-init-addr sgl-dev-0:50000 --nnodes 2 --node-rank 1", 2),
]


@pytest.mark.parametrize(("line", "gpus"), SGLANG_GPUS)
def test_sglang_counts_gpus_with_dp_attention_inside_tensor_parallel(line: str, gpus: int) -> None:
    assert engines.SGLANG.gpus_of(shlex.split(line), {}).count == gpus


# llama.cpp (common/arg.cpp, docs/multi-gpu.md): argv (and variables) -> GPUs; None: every
# GPU it sees, which laned import reads from the container's devices.
LLAMACPP_GPUS = [
    ("-m model.gguf", {}, None),
    ("-hf ggml-org/gemma-3-1b-it-GGUF -ngl 99", {}, None),  # -ngl: layers, not GPUs
    ("-m model.gguf -sm none", {}, 1),
    ("-m model.gguf --split-mode none -dev CUDA0,CUDA1", {}, 1),
    ("-m model.gguf -dev none", {}, 0),
    ("-m model.gguf -dev CUDA1", {}, 1),  # docs/multi-gpu.md recipe 3
    ("-m model.gguf --device CUDA0,CUDA1", {}, 2),
    ("-m model.gguf -ts 3,1", {}, 2),  # docs/multi-gpu.md recipe 2
    ("-m model.gguf -ts 1,0,1", {}, 2),
    ("-m model.gguf -dev CUDA0,CUDA1 -ts 1,0", {}, 1),
    ("-m model.gguf", {"LLAMA_ARG_DEVICE": "CUDA0"}, 1),
    ("-m model.gguf -dev CUDA0,CUDA1", {"LLAMA_ARG_DEVICE": "none"}, 2),  # argv over env
]


@pytest.mark.parametrize(("line", "env", "gpus"), LLAMACPP_GPUS)
def test_llama_server_takes_every_gpu_it_sees_unless_told(
    line: str, env: dict[str, str], gpus: int | None
) -> None:
    assert engines.LLAMACPP.gpus_of(shlex.split(line), env).count == gpus


# argv after the image (and the container's variables) -> (model, the name it serves it by)
MODELS = [
    (engines.VLLM, "serve /models --served-model-name x", {}, ("/models", "/models")),
    (engines.VLLM, "Qwen/Qwen3-0.6B -tp 2", {}, ("Qwen/Qwen3-0.6B",) * 2),  # vllm/vllm-openai
    (engines.VLLM, "--model mistralai/Mistral-7B-v0.1", {}, ("mistralai/Mistral-7B-v0.1",) * 2),
    (engines.VLLM, "serve --model m -tp 2", {}, ("m", "m")),
    (engines.VLLM, "serve -tp 2 --model=m", {}, ("m", "m")),
    (engines.VLLM, "vllm serve m", {}, ("m", "m")),
    (engines.VLLM, "python3 -u -m vllm.entrypoints.cli.main serve m", {}, ("m", "m")),
    (engines.VLLM, "/usr/bin/python3 -m laned sim serve /models/a --port 1", {}, ("/models/a",) * 2),
    (engines.VLLM, "python3 -m vllm.entrypoints.openai.api_server --model m", {}, ("m", "m")),
    (engines.VLLM, "python3 -m vllm.entrypoints.openai.api_server", {}, None),
    (engines.VLLM, "serve -tp 2", {}, None),
    (engines.VLLM, "vllm", {}, None),
    (engines.SGLANG, "python3 -m sglang.launch_server --model-path m", {}, ("m", "m")),
    (engines.SGLANG, "python -m sglang.launch_server --model d/V3 --tp 8", {}, ("d/V3",) * 2),
    (engines.SGLANG, "sglang serve zai-org/GLM-4.6 --tp 4", {}, ("zai-org/GLM-4.6",) * 2),
    (engines.SGLANG, "sglang serve --model-path m", {}, ("m", "m")),
    (engines.SGLANG, "python3 -m sglang.launch_server --tp 4", {}, None),
    # llama.cpp: the repository as written (its quant tag too), else the -m path as written
    (engines.LLAMACPP, "-hf ggml-org/gemma-3-1b-it-GGUF", {}, ("ggml-org/gemma-3-1b-it-GGUF",) * 2),
    (engines.LLAMACPP, "-hf ggml-org/GLM-4.7-Flash-GGUF:Q4_K_M", {}, ("ggml-org/GLM-4.7-Flash-GGUF:Q4_K_M",) * 2),
    (engines.LLAMACPP, "--hf_repo o/r-GGUF", {}, ("o/r-GGUF",) * 2),  # _ read as -
    # GGUF-my-repo's model cards: --hf-repo with --model (the file it is saved as)
    (engines.LLAMACPP, "--hf-repo reach-vb/gemma-1.1-2b-it-Q8_0-GGUF --model gemma-1.1-2b-it.Q8_0.gguf -c 2048", {}, ("reach-vb/gemma-1.1-2b-it-Q8_0-GGUF",) * 2),
    (engines.LLAMACPP, "-m models/7B/ggml-model.gguf -c 512", {}, ("models/7B/ggml-model.gguf",) * 2),
    (engines.LLAMACPP, "-dr gemma3", {}, ("gemma3", "gemma3")),
    (engines.LLAMACPP, "-mu https://h/o/r/resolve/main/m-Q4.gguf?download=true", {}, ("https://h/o/r/resolve/main/m-Q4.gguf?download=true", "m-Q4.gguf")),
    (engines.LLAMACPP, "", {"LLAMA_ARG_HF_REPO": "ggml-org/Qwen3-1.7B-GGUF"}, ("ggml-org/Qwen3-1.7B-GGUF",) * 2),
    (engines.LLAMACPP, "-m /m.gguf", {"LLAMA_ARG_HF_REPO": "o/r"}, ("o/r", "o/r")),  # get_name: the repo first
    (engines.LLAMACPP, "--host 0.0.0.0", {}, None),
]  # fmt: skip


@pytest.mark.parametrize(("profile", "line", "env", "named"), MODELS)
def test_each_engine_names_its_model_as_its_parser_reads_it(
    profile: engines.EngineProfile,
    line: str,
    env: dict[str, str],
    named: tuple[str, str] | None,
) -> None:
    model = profile.model_of(shlex.split(line), env)
    assert (model and (model.source, model.served)) == named


def test_llama_servers_aliases_are_one_sorted_set_whose_first_is_the_id() -> None:
    # common/arg.cpp --alias: comma-separated, into a std::set, every time it is given; the
    # real llama-server lists `--alias zeta,alpha` as id "alpha", aliases [alpha, zeta].
    assert engines.LLAMACPP.served_names(["zeta,alpha"]) == ["alpha", "zeta"]
    assert engines.LLAMACPP.served_names(["b", " a , c,"]) == ["a", "b", "c"]
    assert engines.VLLM.served_names(["b", "a"]) == ["b", "a"]  # nargs "+": the first is the id
