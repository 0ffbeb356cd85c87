"""The canary: one fixed greedy prompt whose answer a lane that sleeps must give again after
every wake (docs/sleep.md). A level-2 wake whose weights did not come back answers, wrongly,
while /health says 200 (vLLM #29341); the canary is what tells.

The answer is kept per lane with the digest of what produced it (the rendered unit and
wrapper: image, model and flags, and the image id): the first good start with a digest
records it; later answers under the same digest are compared on the token ids (vLLM's
`return_token_ids`), or on the text where the engine gives no ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

PROMPT = "The first ten numbers, in words: one, two,"
MAX_TOKENS = 16


class Outcome(str, Enum):
    RECORDED = "recorded"  # nothing kept for this digest yet: this answer is kept
    SAME = "same"
    DIFFERENT = "different"


@dataclass(frozen=True)
class Answer:
    """What the engine answered: the generated token ids (None where it gives none), the text."""

    token_ids: tuple[int, ...] | None
    text: str

    def to_json(self, digest: str) -> dict[str, Any]:
        ids = None if self.token_ids is None else list(self.token_ids)
        return {"digest": digest, "token_ids": ids, "text": self.text}


def judge(kept: dict[str, Any] | None, digest: str, answer: Answer) -> tuple[Outcome, str]:
    """The answer against what is kept, and a line that says how it differs."""
    if kept is None or kept.get("digest") != digest:
        return Outcome.RECORDED, f"{answer.text!r}"
    ids = kept.get("token_ids")
    if ids is not None and answer.token_ids is not None:
        same = tuple(ids) == answer.token_ids
    else:
        same = kept.get("text") == answer.text
    if same:
        return Outcome.SAME, ""
    return (
        Outcome.DIFFERENT,
        f"{answer.text!r} where the first good start answered {kept.get('text')!r}",
    )
