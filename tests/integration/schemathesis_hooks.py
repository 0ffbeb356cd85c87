"""schemathesis's check for laned (loaded with SCHEMATHESIS_HOOKS by test_api.py): a server
error is one laned did not mean. laned answers 502 when an engine failed (a crash loop, a
start that timed out), 503 when a service it needs (podman, the user manager, another host's
laned) does not answer, and 504 when a `wait` ran out: each in its error envelope. A 500,
or any 5xx without the envelope, is a bug."""

from __future__ import annotations

from typing import Any

import schemathesis

MEANT = (502, 503, 504)


@schemathesis.check
def laned_server_error(ctx: Any, response: Any, case: Any) -> None:
    """Fail on a 5xx that is not one of laned's documented answers."""
    if response.status_code < 500:
        return
    try:
        error = response.json()["error"]
    except (ValueError, KeyError, TypeError):
        raise AssertionError(f"{response.status_code} without laned's error envelope") from None
    if response.status_code not in MEANT:
        raise AssertionError(f"{response.status_code} {error}")
    if not error.get("message") or not ("code" in error or "type" in error):
        raise AssertionError(f"{response.status_code} with an incomplete error: {error}")
