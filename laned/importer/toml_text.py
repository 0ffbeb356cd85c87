"""Writing TOML text by hand, for output a person reads and keeps: comments beside the keys
they explain, one array item per line. (Only what laned writes: strings, integers, floats,
booleans, arrays and inline tables of them.)"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
_LITERAL_OK = re.compile(r"^[^'\x00-\x08\x0a-\x1f\x7f]*$")
Value = str | int | float | bool | Sequence["Value"] | Mapping[str, "Value"]


def key(name: str) -> str:
    """A key, bare when TOML allows it."""
    return name if _BARE_KEY.match(name) else string(name)


def string(text: str) -> str:
    """A string: literal ('...') when it holds a double quote or a backslash and can be one
    (JSON stays readable), else basic ("...")."""
    if ('"' in text or "\\" in text) and _LITERAL_OK.match(text):
        return f"'{text}'"
    # JSON's escapes are TOML's, except that TOML wants DEL escaped as well.
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def value(item: Value) -> str:
    """Any value on one line."""
    if isinstance(item, bool):
        return "true" if item else "false"
    if isinstance(item, (int, float)):
        return repr(item)
    if isinstance(item, str):
        return string(item)
    if isinstance(item, Mapping):
        inner = ", ".join(f"{key(k)} = {value(v)}" for k, v in item.items())
        return "{ " + inner + " }" if inner else "{}"
    return "[" + ", ".join(value(v) for v in item) + "]"


def comment(text: str, indent: str = "") -> list[str]:
    """`# text`, one line per line of text."""
    return [f"{indent}# {line}".rstrip() for line in text.splitlines() or [""]]


def array(name: str, items: Sequence[tuple[str, str]]) -> list[str]:
    """`name = [` then one item a line (already rendered) with its comment, then `]`."""
    lines = [f"{key(name)} = ["]
    for rendered, note in items:
        lines.append(f"  {rendered}," + (f"  # {note}" if note else ""))
    return [*lines, "]"]
