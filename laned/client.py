"""The CLI's side of the control API: requests, the error envelope, the status table."""

from __future__ import annotations

import sys
import time
from typing import Any

import httpx

from laned.errors import LanedError


class ApiUnavailable(LanedError):
    """laned's API does not answer."""


class ApiRefused(LanedError):
    """laned answered with an error envelope."""

    def __init__(self, status: int, code: str, message: str, hint: str) -> None:
        super().__init__(message, hint)
        self.status, self.code = status, code


class Client:
    """A synchronous client of laned's control API."""

    def __init__(self, url: str, token: str | None = None, timeout: float = 30) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.url = url.rstrip("/")
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connection pool."""
        self.http.close()

    def call(self, method: str, path: str, **params: Any) -> dict[str, Any]:
        """One request; the envelope becomes ApiRefused, no answer ApiUnavailable."""
        try:
            response = self.http.request(
                method, path, params={k: v for k, v in params.items() if v is not None}
            )
        except httpx.TransportError as exc:
            raise ApiUnavailable(
                f"laned does not answer at {self.url} ({exc})",
                "is it running? (systemctl --user status laned; or pass --url)",
            ) from exc
        try:
            body: dict[str, Any] = response.json()
        except ValueError:
            raise ApiUnavailable(
                f"{self.url}{path} did not answer JSON (status {response.status_code})"
            ) from None
        if response.status_code >= 400:
            error = body.get("error", {})
            raise ApiRefused(
                response.status_code,
                error.get("code", "?"),
                error.get("message", ""),
                error.get("hint", ""),
            )
        return body


def table(lanes: list[dict[str, Any]]) -> str:
    """The `laned status` table."""
    rows = [("LANE", "STATE", "DESIRED", "PORT", "MODEL", "RESTARTS", "REASON")]
    for lane in lanes:
        state = lane["state"]
        if lane.get("phase"):
            state += (
                f" ({lane['phase']}"
                + (f" {lane['progress']:.0f}%" if lane.get("progress") is not None else "")
                + ")"
            )
        rows.append((lane["name"], state, lane["desired"], str(lane["port"]), lane["served_model_name"],
                     str(lane["restarts"]), lane.get("reason") or ""))  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1]
        for row in rows
    )


def follow_start(client: Client, lane: str, timeout: float | None) -> dict[str, Any]:
    """Poll the lane while it starts, showing a live progress line; return its final view."""
    started = time.monotonic()
    tty = sys.stderr.isatty()
    last_line = ""
    while True:
        view = client.call("GET", f"/lanes/{lane}")
        elapsed = time.monotonic() - started
        # An inactive lane that is still desired is waiting for its peer to stop (a swap).
        if view["state"] in ("ready", "failed") or (
            view["state"] == "inactive" and view["desired"] == "inactive"
        ):
            if tty:
                sys.stderr.write("\r\x1b[K")
            return view
        phase = view.get("phase") or view["state"]
        percent = f" {view['progress']:.0f}%" if view.get("progress") is not None else ""
        expected = (
            f" (last cold start {view['last_cold_start']:.0f}s)"
            if view.get("last_cold_start")
            else ""
        )
        line = f"{lane}: {phase}{percent}, {elapsed:.0f}s{expected}"
        if tty:
            sys.stderr.write("\r\x1b[K" + line)
        elif line.split(",")[0] != last_line.split(",")[0]:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()
        last_line = line
        if timeout is not None and elapsed > timeout:
            raise ApiRefused(
                504,
                "timeout",
                f"lane {lane} is not ready after {timeout:g}s",
                "it goes on; see laned status",
            )
        time.sleep(0.5)
