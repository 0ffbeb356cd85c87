"""Each engine's knowledge in one module (an engine profile, laned.engines.profile): vLLM,
SGLang, llama.cpp's llama-server. Pure: data and pure functions.

A lane names its engine (`engine = "vllm" | "sglang" | "llamacpp"`), or laned reads it from
the lane's command or image where it is obvious, vLLM by default: `for_lane(spec)`.
Adding an engine is one module here, its entry in ENGINES, its simulator face and its tests
(docs/architecture.md, "Add an engine"). `footprints`: each lane's share of its GPUs, by its
engine's rule, for laned.core.placement.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from laned.config.command import program_start
from laned.config.model import LaneConfig
from laned.engines.llamacpp import LLAMACPP
from laned.engines.profile import EngineProfile, Gpus, Model
from laned.engines.sglang import SGLANG
from laned.engines.vllm import VLLM

# By name; the order is the order `inferred` asks them in (vLLM, the default, last).
ENGINES: dict[str, EngineProfile] = {p.name: p for p in (SGLANG, LLAMACPP, VLLM)}


# The engine of a lane that names none and whose command names none: every config written
# before laned knew other engines keeps its meaning.
DEFAULT: EngineProfile = VLLM

# As messages list them: the default first.
LISTED: tuple[EngineProfile, ...] = (DEFAULT, *(p for p in ENGINES.values() if p is not DEFAULT))


def program_words(spec: LaneConfig) -> list[str]:
    """The words of a lane's command that name its program: an exec command's first three
    after any launcher and its options (`python -m sglang.launch_server`,
    `/opt/llama/llama-server -m ...`, `vllm serve`), a container's image, entrypoint and
    first two command words."""
    if spec.exec is not None:
        words = list(spec.exec.command)
        i = program_start(words)
        return words[i : i + 3]
    if spec.container is not None:
        c = spec.container
        return [c.image, c.entrypoint or "", *c.command[:2]]
    return []


def inferred(words: Sequence[str]) -> EngineProfile | None:
    """The engine that the words name, where one does (the first word that names one
    decides: `vllm serve /models/llama.cpp-q4` is vLLM); None where none does."""
    for word in words:
        for profile in ENGINES.values():
            if profile.recognises([word]):
                return profile
    return None


def for_lane(spec: LaneConfig) -> EngineProfile:
    """The profile of the lane's engine: its `engine`, else the one its command names, else
    vLLM. (An unknown `engine` is refused by laned.validation.rules before anything asks.)"""
    if spec.engine is not None:
        return ENGINES.get(spec.engine, DEFAULT)
    return inferred(program_words(spec)) or DEFAULT


def headless(spec: LaneConfig) -> bool:
    """A worker rank of a lane over several hosts: its engine serves no API, only its share
    of the model (its engine's worker switch, vLLM's --headless; docs/multinode.md)."""
    nodes = for_lane(spec).nodes
    return nodes is not None and bool(nodes.worker) and nodes.worker in spec.engine_args()


def workers(lanes: Mapping[str, LaneConfig]) -> frozenset[str]:
    """The lanes that are worker ranks here (`headless`)."""
    return frozenset(name for name, spec in lanes.items() if headless(spec))


def required_secrets(spec: LaneConfig) -> tuple[str, ...]:
    """The names the lane's secrets file must define: `secrets`, and its engine's key
    variable for a file named by `api_key_file` (the older name of secrets_file, from when
    every lane ran the default engine, whose file held its key alone)."""
    legacy = (for_lane(spec).api_key_env,) if spec.api_key_file and not spec.secrets_file else ()
    return tuple(dict.fromkeys((*legacy, *spec.secrets)))


__all__ = [
    "DEFAULT",
    "ENGINES",
    "LISTED",
    "LLAMACPP",
    "SGLANG",
    "VLLM",
    "EngineProfile",
    "Gpus",
    "Model",
    "for_lane",
    "headless",
    "inferred",
    "required_secrets",
    "workers",
]
