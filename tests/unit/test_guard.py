"""The API guard's token comparison: its time must not tell the token (bench/token_timing.py
measures it); here, that every comparison is of two values of one length, whatever was sent."""

from __future__ import annotations

import hmac

import pytest

from laned.api import guard


def test_tokens_are_compared_as_digests_of_one_length(monkeypatch: pytest.MonkeyPatch) -> None:
    lengths: list[tuple[int, int]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        lengths.append((len(a), len(b)))
        return compare(a, b)

    monkeypatch.setattr(guard.hmac, "compare_digest", spy)
    secret = "Bearer s3cret-token-of-43-characters-xxxxxxxxxx"
    assert guard.same_secret(secret, secret)
    for given in ("", "Bearer", secret[:-1], secret + "x", "x" + secret[1:], secret * 3):
        assert not guard.same_secret(given, secret), given
    assert lengths and all(pair == (32, 32) for pair in lengths), lengths
