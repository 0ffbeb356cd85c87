"""The other hosts' laned, for lanes over several hosts: their control API, called with the
peer token (`daemon.peer_token_file`), which never leaves the Authorization header.

An adapter: HTTP in, plain dicts out, `PeerUnreachable` (naming the host and what failed)
for anything that is not an answer."""

from __future__ import annotations

from typing import Any

import httpx

from laned.config.model import Node
from laned.errors import PeerUnreachable

TIMEOUT = httpx.Timeout(10.0, connect=3.0)


class Peers:
    """Calls to the peers' laned (one pooled client)."""

    def __init__(self, token: str | None) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.AsyncClient(timeout=TIMEOUT, headers=headers)

    def use_token(self, token: str | None) -> None:
        """Send this peer token from the next call on (a reload's)."""
        self.client.headers.pop("Authorization", None)
        if token:
            self.client.headers["Authorization"] = f"Bearer {token}"

    async def close(self) -> None:
        await self.client.aclose()

    async def view(self, node: Node, lane: str) -> dict[str, Any]:
        """The peer's view of its rank of the lane."""
        return await self._call(node, "GET", f"/lanes/{lane}")

    async def ask(self, node: Node, lane: str, action: str, force: bool = False) -> dict[str, Any]:
        """Ask the peer to act on its own rank only (activate, deactivate, restart); it answers
        once its own checks let the request through (202), not when the rank is ready."""
        params = {"rank_only": "true", **({"force": "true"} if force else {})}
        return await self._call(node, "POST", f"/lanes/{lane}/{action}", params)

    async def sleep(self, node: Node, lane: str, step: str, level: int) -> dict[str, Any]:
        """A worker's rank around its head's sleep (`before`, then `after` at `level`)."""
        params = {"rank_only": "true", "step": step, "level": str(level)}
        return await self._call(node, "POST", f"/lanes/{lane}/rank-sleep", params)

    async def forward(self, node: Node, lane: str, action: str, force: bool = False) -> None:
        """Hand a request for the whole lane to its head, which coordinates every rank."""
        await self._call(
            node, "POST", f"/lanes/{lane}/{action}", {"force": "true"} if force else {}
        )

    async def _call(
        self, node: Node, method: str, path: str, params: dict[str, str] | None = None
    ) -> dict[str, Any]:
        where = f"{node.host}'s laned ({node.laned}{path})"
        try:
            answer = await self.client.request(method, node.laned + path, params=params)
        except httpx.HTTPError as exc:
            raise PeerUnreachable(
                f"{where} does not answer: {type(exc).__name__}",
                f"is laned running on {node.host}, and {node.laned} reachable from here?",
            ) from None
        try:
            body = answer.json()
        except ValueError:
            body = {}
        if answer.status_code >= 400:
            error = body.get("error", {}) if isinstance(body, dict) else {}
            raise PeerUnreachable(
                f"{where} refused: {answer.status_code} {error.get('message', answer.reason_phrase)}",
                error.get("hint") or f"see `laned events` on {node.host}",
            )
        return body if isinstance(body, dict) else {}
