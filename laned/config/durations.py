"""Durations as people write them in the config ("90s", "15m", "1h30m", 600) and as systemd
reads them; token counts as vLLM's flags take them ("8k", "32K", "1M")."""

from __future__ import annotations

import re

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")


def parse_duration(value: object) -> float:
    """Parse "90s", "15m", "1h30m", "500ms" or a number of seconds into seconds (float)."""
    if isinstance(value, bool):
        raise ValueError("expected a duration such as 90s, 15m, 1h or a number of seconds")
    if isinstance(value, (int, float)):
        if value < 0:
            raise ValueError(f"a duration cannot be negative (got {value})")
        return float(value)
    if not isinstance(value, str):
        raise ValueError("expected a duration such as 90s, 15m, 1h or a number of seconds")
    text = value.strip().replace(" ", "")
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        return float(text)
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or not text:
        raise ValueError(
            f"{value!r} is not a duration; write it like 90s, 15m, 1h, 1h30m, 500ms or 600"
        )
    return total


def systemd_seconds(seconds: float) -> str:
    """Render seconds the way a unit file states them: `15` for whole seconds, `1500ms` otherwise."""
    if float(seconds).is_integer():
        return str(int(seconds))
    return f"{round(seconds * 1000)}ms"


_COUNT = re.compile(r"(\d+(?:\.\d+)?)([kmgKMG]?)")
# vLLM's human_readable_int (vllm/engine/arg_utils.py): lowercase is decimal (8k = 8000),
# uppercase binary (32K = 32768), and only a decimal multiplier takes a fraction (25.6k).
_MULTIPLIERS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def parse_count(text: str) -> int:
    """A token count: 8192, 8k (8000), 32K (32768), 1M (1048576), 25.6k (25600)."""
    match = _COUNT.fullmatch(text.strip())
    if match is None:
        raise ValueError(f"{text!r} is not a count; write it like 8192, 8k, 32K or 1M")
    number, suffix = match.groups()
    if "." in number and suffix not in ("k", "m", "g"):
        raise ValueError(f"{text!r}: only k, m and g take a fraction (25.6k); K, M and G do not")
    return int(float(number) * _MULTIPLIERS[suffix])
