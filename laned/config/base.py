"""The config model's base: strict, immutable pydantic models, and the value types that
parse as people write them (durations, engine argument text)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, model_validator

from laned.config.durations import parse_duration


def scalar_to_str(value: object) -> object:
    """TOML numbers become the string the engine will see (2 -> "2"); booleans stay invalid."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return str(value)
    return value


Duration = Annotated[float, BeforeValidator(parse_duration)]
ArgText = Annotated[str, BeforeValidator(scalar_to_str)]


class StrictModel(BaseModel):
    # Strict: no silent coercion of "8004" into a port or 1 into true. TOML arrays
    # arrive as lists; the models hold tuples so that they stay immutable.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _lists_to_tuples(cls, data: Any) -> Any:
        if isinstance(data, dict):
            return {k: tuple(v) if isinstance(v, list) else v for k, v in data.items()}
        return data
