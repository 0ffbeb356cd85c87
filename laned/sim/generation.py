"""vLLM's generation-config semantics, as the simulator applies them.

From vLLM's `vllm/config/model.py` (`ModelConfig.try_get_generation_config`,
`get_diff_sampling_param`):

- `--generation-config auto` (the default) reads the model directory's
  generation_config.json; `vllm` reads it too for its fields (stop ids) but takes no sampling
  defaults from it; a DIRECTORY reads DIR/generation_config.json *instead of* the model's.
- What is read is `GenerationConfig.to_diff_dict()`: keys equal to Hugging Face's defaults
  (temperature 1.0, top_p 1.0, top_k 50, repetition_penalty 1.0) are dropped.
- `--override-generation-config JSON` is applied after that (`config.update(override)`), so
  its values are kept even where they equal a default; then only the sampling keys below are
  used, `max_new_tokens` becoming `max_tokens`.
- The stop ids: the tokenizer's eos plus the config's `eos_token_id` (an int or a list), as
  `SamplingParams.update_from_generation_config` adds them. A DIR without them loses the
  model's extra stop ids: a GLM turn then runs past <|user|> (vLLM #45591's symptom).

The simulator's model ends each chat turn with the last id of the model directory's
`eos_token_id` list (GLM ends a turn with <|user|>, listed there but not the tokenizer's eos),
or with the tokenizer's eos when the model lists none.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

from laned.errors import EngineError

SAMPLING_KEYS = ("repetition_penalty", "temperature", "top_k", "top_p", "min_p", "max_new_tokens")
# transformers.GenerationConfig's defaults: to_diff_dict() leaves these out.
HF_DEFAULTS: dict[str, Any] = {
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 50,
    "repetition_penalty": 1.0,
    "min_p": None,
    "max_new_tokens": None,
    "eos_token_id": None,
}
TOKENIZER_EOS = 2  # the simulated tokenizer's own eos id, when config.json names none


@dataclass(frozen=True)
class Effective:
    """What the engine applies: sampling defaults, stop ids, and where they came from."""

    defaults: dict[str, Any] = field(default_factory=dict)
    stop_ids: frozenset[int] = frozenset({TOKENIZER_EOS})
    source: str = "model"
    turn_end: int = TOKENIZER_EOS  # the id the model ends a chat turn with

    @property
    def turn_stops(self) -> bool:
        """Whether a chat turn ends where the model ends it."""
        return self.turn_end in self.stop_ids


def read_config(directory: str, required: bool) -> dict[str, Any] | None:
    """DIR/generation_config.json as a dict; None when absent (an error when `required`)."""
    path = os.path.join(directory, "generation_config.json")
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except FileNotFoundError:
        if required:
            raise EngineError(
                f"--generation-config: {path} does not exist",
                "pass a directory with generation_config.json, or auto / vllm",
            ) from None
        return None
    except (OSError, ValueError) as exc:
        raise EngineError(f"--generation-config: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise EngineError(f"--generation-config: {path} is not a JSON object")
    return data


def diff_dict(config: dict[str, Any]) -> dict[str, Any]:
    """GenerationConfig.to_diff_dict(): the keys that differ from Hugging Face's defaults."""
    return {k: v for k, v in config.items() if k not in HF_DEFAULTS or HF_DEFAULTS[k] != v}


def _ids(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def effective(model: str, flag: str, override: dict[str, Any]) -> Effective:
    """Apply vLLM's rules to the model directory, --generation-config and the override."""
    model_config = read_config(model, required=False) if os.path.isdir(model) else None
    if flag in ("auto", "vllm"):
        fields, source = diff_dict(model_config or {}), "model"
    else:
        fields, source = diff_dict(read_config(flag, required=True) or {}), flag
    sampling = {} if flag == "vllm" else dict(fields)
    sampling.update(override)
    defaults = {k: sampling[k] for k in SAMPLING_KEYS if sampling.get(k) is not None}
    if "max_new_tokens" in defaults:
        defaults["max_tokens"] = defaults.pop("max_new_tokens")
    model_ids = _ids((model_config or {}).get("eos_token_id"))
    stop_ids = frozenset({TOKENIZER_EOS, *_ids(fields.get("eos_token_id"))})
    turn_end = model_ids[-1] if model_ids else TOKENIZER_EOS
    return Effective(defaults, stop_ids, source, turn_end)
