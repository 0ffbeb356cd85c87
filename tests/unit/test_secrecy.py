"""What counts as a secret and how a lane's secrets file reads (laned.config.secrecy)."""

from __future__ import annotations

import pytest

from laned.config.secrecy import SecretsFileError, looks_secret, names_in, value_of


@pytest.mark.parametrize(
    "name",
    ["VLLM_API_KEY", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "OPENAI_API_KEY", "WANDB_API_KEY",
     "AWS_SECRET_ACCESS_KEY", "DB_PASSWORD", "MY_CLIENT_SECRET", "S3_ACCESS_KEY", "hf_token",
     "NGC_API_KEY", "GITHUB_TOKEN", "REGISTRY_CREDENTIALS"],
)  # fmt: skip
def test_secret_names(name: str) -> None:
    assert looks_secret(name)


@pytest.mark.parametrize(
    "name",
    ["CUDA_VISIBLE_DEVICES", "VLLM_ENGINE_READY_TIMEOUT_S", "TOKENIZERS_PARALLELISM",
     "HF_HOME", "MAX_TOKENS", "NCCL_CUMEM_ENABLE", "VLLM_USE_V1", "HF_HUB_OFFLINE"],
)  # fmt: skip
def test_names_that_are_no_secret(name: str) -> None:
    assert not looks_secret(name)


def test_a_secrets_file_reads_as_systemds_environment_file() -> None:
    text = (
        "# the lane's secrets\n"
        "\n"
        "VLLM_API_KEY=sk-1\n"
        '  HF_TOKEN = "hf_2"\n'
        "; another comment\n"
        "LONG=part one \\\n"
        "BOGUS=this line continues LONG's value\n"
        "VLLM_API_KEY=again\n"
    )
    assert names_in(text) == ["VLLM_API_KEY", "HF_TOKEN", "LONG"]
    assert value_of(text, "HF_TOKEN") == "hf_2"
    assert value_of(text, "NOPE") is None


@pytest.mark.parametrize("line", ["export HF_TOKEN=hf_secret", "hf_secret", "1BAD=hf_secret"])
def test_a_line_that_is_not_name_value_is_refused_without_its_text(line: str) -> None:
    with pytest.raises(SecretsFileError) as info:
        names_in(f"GOOD=1\n{line}\n")
    assert str(info.value) == "line 2 is not NAME=VALUE"
    assert "hf_secret" not in str(info.value)
