"""The few fields laned reads of an OpenAI request's body, and where they are. Pure.

laned routes a request by its top-level `model` and streams the wait when `stream` is true;
it needs nothing else of the body, which goes to the engine as the client sent it. `peek`
walks the top-level object one member at a time with the standard library's own C scanner
(json.scanner), so it accepts and refuses exactly what `json.loads`
does (the engines parse with it: vLLM's FastAPI app, SGLang's), keeps the last of duplicate
keys as it does, and also says where the `model` value sits in the bytes: an alias is
rewritten by splicing the served name there (`with_model`), never by parsing the body again
and writing it out whole.

It imports nothing of laned but this folder's siblings' rules (none): a worker process of
laned.adapters.body_parser imports this module alone, so that a body of many megabytes is
read there and not on laned's event loop (docs/proxy.md).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from laned.errors import BodyTooDeep

# The standard library's own scanner of one JSON value at an index, in C (json.scanner's
# c_make_scanner): what json.loads runs, member by member.
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]
_SKIP = re.compile(r"[ \t\n\r]*").match  # JSON's whitespace (json.decoder.WHITESPACE)
Body = bytes | bytearray


@dataclass(frozen=True)
class Peek:
    """What laned reads of a request body: its `model` when the body is a JSON object with a
    string `model` (None otherwise), whether it asks to be streamed, and the `model` value's
    place in the body's bytes ([start, end), None without one)."""

    model: str | None
    stream: bool
    span: tuple[int, int] | None = None


NOTHING = Peek(None, False)


def peek(body: Body) -> Peek:
    """The body's top-level `model` and `stream`, as `json.loads(body)` would give them (the
    last of duplicate keys; UTF-8, UTF-16 or UTF-32 as json.detect_encoding tells); NOTHING
    for a body that is not one JSON object (the engine refuses it as well). The span is
    given for UTF-8 bodies only. Raises BodyTooDeep for nesting past the parser."""
    try:
        encoding = json.detect_encoding(body)
        text = body.decode(encoding, "surrogatepass")
        found = _walk(text)
    except (ValueError, StopIteration):  # UnicodeDecodeError and JSONDecodeError among them
        return NOTHING
    except RecursionError:
        raise BodyTooDeep(
            f"the body's JSON nests deeper than laned reads ({sys.getrecursionlimit()} levels)",
            "nest less deeply; the engine's parser has the same limit",
        ) from None
    if found.span is None or encoding not in ("utf-8", "utf-8-sig"):
        return Peek(found.model, found.stream)
    if len(text) == len(body):  # ASCII: a character's index is its byte's
        return found
    start, end = found.span
    return Peek(
        found.model, found.stream, (_byte_at(text, start, encoding), _byte_at(text, end, encoding))
    )


def _walk(text: str) -> Peek:
    """The top-level members of the object in `text`, one at a time (the span in characters)."""
    end = len(text)
    i = _skip(text, 0)
    if i >= end or text[i] != "{":
        return NOTHING
    i = _skip(text, i + 1)
    model: object = None
    stream: object = False
    place: tuple[int, int] | None = None
    if i < end and text[i] == "}":
        i += 1
    else:
        while True:
            if i >= end or text[i] != '"':
                return NOTHING
            key, i = _SCAN(text, i)
            i = _skip(text, i)
            if i >= end or text[i] != ":":
                return NOTHING
            i = _skip(text, i + 1)
            start = i
            value, i = _SCAN(text, i)
            if key == "model":
                model, place = value, (start, i)
            elif key == "stream":
                stream = value
            i = _skip(text, i)
            if i < end and text[i] == ",":
                i = _skip(text, i + 1)
                continue
            if i < end and text[i] == "}":
                i += 1
                break
            return NOTHING
    if _skip(text, i) != end:  # "Extra data", as json.loads says
        return NOTHING
    if not isinstance(model, str):
        return Peek(None, stream is True)
    return Peek(model, stream is True, place)


def _skip(text: str, i: int) -> int:
    """The index of the first character at or after `i` that is not JSON whitespace."""
    match = _SKIP(text, i)
    return match.end() if match else i


def _byte_at(text: str, index: int, encoding: str) -> int:
    """The byte offset of character `index` in `text` encoded as `encoding` (a BOM counted)."""
    return len(text[:index].encode(encoding))


def with_model(body: Body, span: tuple[int, int], name: str) -> bytes:
    """The body with the `model` value at `span` replaced by `name` (a JSON string): the
    rest byte for byte as the client sent it."""
    start, end = span
    return b"".join((body[:start], json.dumps(name).encode(), body[end:]))
