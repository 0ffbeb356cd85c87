"""What laned reads of a request body (laned.core.request_body), held to `json.loads`: the same
`model` and `stream` for any body it accepts, nothing for one it refuses, and an alias spliced
in place of the model with the rest of the body byte for byte."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laned.core.request_body import NOTHING, peek, with_model
from laned.errors import BodyTooDeep

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
members = st.lists(
    st.tuples(st.sampled_from(["model", "stream", "messages", "x", "Model"]) | st.text(), values),
    max_size=6,
)
spacing = st.sampled_from(["", " ", "\n", "\t ", "\r\n  "])


def written(pairs: list[tuple[str, Any]], space: str, ensure_ascii: bool) -> bytes:
    """A JSON object of these members in this order (duplicates kept), as a client writes it."""
    parts = [
        f"{space}{json.dumps(k, ensure_ascii=ensure_ascii)}{space}:{space}{json.dumps(v, ensure_ascii=ensure_ascii)}"
        for k, v in pairs
    ]
    return (space + "{" + ",".join(parts) + space + "}" + space).encode()


@settings(max_examples=300, deadline=None)
@given(pairs=members, space=spacing, ascii_only=st.booleans(), served=st.text())
def test_the_model_and_stream_are_what_json_loads_reads_and_an_alias_is_spliced(
    pairs: list[tuple[str, Any]], space: str, ascii_only: bool, served: str
) -> None:
    body = written(pairs, space, ascii_only)
    parsed = json.loads(body)
    found = peek(body)
    model = parsed.get("model")
    assert found.model == (model if isinstance(model, str) else None)
    assert found.stream is (parsed.get("stream") is True)
    if found.model is None:
        assert found.span is None
        return
    assert found.span is not None
    renamed = with_model(body, found.span, served)
    assert json.loads(renamed) == {**parsed, "model": served}
    start, end = found.span
    assert renamed[:start] == body[:start]  # the rest as the client sent it
    assert renamed[len(renamed) - (len(body) - end) :] == body[end:]


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=64) | st.text(max_size=64).map(str.encode))
def test_a_body_json_loads_refuses_or_that_is_no_object_reads_as_nothing(body: bytes) -> None:
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        assert peek(body) == NOTHING
        return
    if not isinstance(parsed, dict):
        assert peek(body) == NOTHING


@pytest.mark.parametrize(
    "body",
    [
        b'{"model": "a"} x',  # extra data
        b'{"model": "a",}',  # a trailing comma
        b'{"model" "a"}',
        b'{model: "a"}',
        b'{"model": "a"',
        b'["model", "a"]',
        b'"model"',
        b"\xff{}",
    ],
)
def test_what_is_not_one_json_object_names_no_model(body: bytes) -> None:
    assert peek(body) == NOTHING


def test_the_last_of_duplicate_keys_wins_as_in_json_loads() -> None:
    body = b'{"model": "a", "stream": true, "model": "b", "stream": false}'
    found = peek(body)
    assert (found.model, found.stream) == ("b", False)
    assert found.span is not None
    assert json.loads(with_model(body, found.span, "c"))["model"] == "c"


def test_other_encodings_are_read_but_only_utf8_is_spliced() -> None:
    text = '{"x": "é", "model": "ü"}'
    for encoding in ("utf-16", "utf-32-le"):
        found = peek(text.encode(encoding))
        assert (found.model, found.span) == ("ü", None)
    bom = b"\xef\xbb\xbf" + text.encode()
    found = peek(bom)
    assert found.model == "ü" and found.span is not None
    assert json.loads(with_model(bom, found.span, "v").decode("utf-8-sig"))["model"] == "v"


def test_nesting_past_the_parser_is_its_own_error() -> None:
    with pytest.raises(BodyTooDeep) as caught:
        peek(b'{"model": "a", "prompt": ' + b"[" * 200_000 + b"}")
    assert "nests deeper" in caught.value.message
    assert peek(b"[" * 200_000) == NOTHING  # no object: nothing to read, nothing parsed
