"""The simulator applies vLLM's generation-config rules (vllm/config/model.py), untidy as they
are: a --generation-config DIR replaces the model's config, defaults are dropped, and the
override is merged last."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from laned.errors import EngineError
from laned.sim.generation import TOKENIZER_EOS, effective

GLM = {"eos_token_id": [151329, 151336, 151338], "top_k": 40, "temperature": 1.0}


def write(directory: Path, data: dict[str, object]) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "generation_config.json").write_text(json.dumps(data))
    return str(directory)


def test_auto_reads_the_models_config_as_a_diff_and_keeps_its_stop_ids(tmp_path: Path) -> None:
    model = write(tmp_path / "model", GLM)
    got = effective(model, "auto", {})
    assert got.defaults == {"top_k": 40}  # temperature 1.0 is Hugging Face's default: dropped
    assert got.stop_ids == {TOKENIZER_EOS, 151329, 151336, 151338}
    assert got.turn_end == 151338 and got.turn_stops and got.source == "model"


def test_a_directory_replaces_the_models_config_and_loses_its_stop_ids(tmp_path: Path) -> None:
    model = write(tmp_path / "model", GLM)
    laned_dir = write(tmp_path / "laned", {"temperature": 1.0, "top_p": 0.95})
    got = effective(model, laned_dir, {})
    assert got.defaults == {"top_p": 0.95}  # seed 000's temperature 1.0 silently gone
    assert got.stop_ids == {TOKENIZER_EOS}
    assert not got.turn_stops and got.source == laned_dir


def test_the_override_is_merged_last_and_keeps_default_values(tmp_path: Path) -> None:
    model = write(tmp_path / "model", GLM)
    got = effective(model, "auto", {"temperature": 1.0, "top_p": 0.95, "max_new_tokens": 900})
    assert got.defaults == {"temperature": 1.0, "top_k": 40, "top_p": 0.95, "max_tokens": 900}
    assert got.turn_stops


def test_vllm_takes_no_sampling_defaults_but_keeps_the_stop_ids(tmp_path: Path) -> None:
    model = write(tmp_path / "model", GLM)
    got = effective(model, "vllm", {"top_p": 0.9})
    assert got.defaults == {"top_p": 0.9} and got.turn_stops


def test_a_model_without_a_generation_config_stops_on_the_tokenizers_eos(tmp_path: Path) -> None:
    got = effective(str(tmp_path), "auto", {})
    assert got.defaults == {} and got.stop_ids == {TOKENIZER_EOS} and got.turn_stops


def test_a_missing_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="does not exist"):
        effective(str(tmp_path), str(tmp_path / "nowhere"), {})
