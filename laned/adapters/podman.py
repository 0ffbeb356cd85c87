"""The podman API service (podman-py over the user's socket): thin typed calls, off the loop.

podman-py is synchronous, so every call runs in a worker thread. Its errors are
translated here: "no such container/image" is an answer (None), a socket that does not
answer is PodmanUnavailable (with the hint to start it), anything else PodmanError.
Field names differ between podman 4 and 5 (`OOMKilled`/`OomKilled`, `StartedAt` as a
string or a number): the parsing below accepts both.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from podman import PodmanClient
from podman.errors import APIError, ImageNotFound, NotFound
from requests.exceptions import RequestException

from laned.errors import PodmanError, PodmanUnavailable

T = TypeVar("T")
SOCKET_HINT = (
    "start the podman API service: systemctl --user enable --now podman.socket "
    "(or set daemon.podman_socket)"
)


@dataclass(frozen=True)
class ContainerState:
    """What podman says about one container."""

    name: str
    status: str  # podman's own word: created, running, exited, stopping ...
    exit_code: int | None
    oom_killed: bool
    started_at: str
    image_id: str
    pid: int = 0  # its first process, as the host sees it (0: not running)

    def to_json(self) -> dict[str, Any]:
        """As served in a lane's view."""
        return {
            "name": self.name,
            "status": self.status,
            "exit_code": self.exit_code,
            "oom_killed": self.oom_killed,
            "started_at": self.started_at,
            "image_id": self.image_id,
        }


@dataclass(frozen=True)
class ImageInfo:
    """A local image: its content-addressed id changes whenever it is rebuilt."""

    name: str
    id: str


def parse_container(name: str, attrs: dict[str, Any]) -> ContainerState:
    """A container's inspect JSON (podman 4 or 5) as a ContainerState."""
    state = attrs.get("State") or {}
    if isinstance(state, str):  # the list endpoint's shape: State is a word
        state = {"Status": state}
    oom = state.get("OOMKilled", state.get("OomKilled", False))
    code = state.get("ExitCode")
    started = state.get("StartedAt", "")
    return ContainerState(
        name=name,
        status=str(state.get("Status", "unknown")),
        exit_code=int(code) if isinstance(code, int) else None,
        oom_killed=bool(oom),
        started_at=str(started),
        image_id=str(attrs.get("Image", "")),
        pid=int(state.get("Pid") or 0),
    )


class Podman:
    """A client of the podman API service at `socket` (a path)."""

    def __init__(self, socket: str, timeout: float = 5.0) -> None:
        self.socket = socket
        self.timeout = timeout
        self._client: PodmanClient | None = None

    def use(self, socket: str) -> None:
        """Talk to the podman API service at `socket` from the next call on (a reload's)."""
        if socket != self.socket:
            self.close()
            self.socket = socket

    def close(self) -> None:
        """Close the HTTP session."""
        if self._client is not None:
            self._client.close()  # type: ignore[no-untyped-call]
            self._client = None

    def _api(self) -> PodmanClient:
        if self._client is None:
            self._client = PodmanClient(base_url=f"unix://{self.socket}", timeout=self.timeout)
        return self._client

    async def _off_loop(self, what: str, call: Callable[[PodmanClient], T]) -> T:
        def guarded() -> T:
            # Connect once ourselves first: podman-py leaks the socket of a connection that
            # fails (its UDSConnection.connect never closes it), and a dead socket is the
            # usual way this fails.
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
                    probe.settimeout(self.timeout)
                    probe.connect(self.socket)
            except OSError as exc:
                self.close()
                raise PodmanUnavailable(
                    f"the podman API at {self.socket} does not answer ({what}): {exc.strerror}",
                    SOCKET_HINT,
                ) from exc
            try:
                return call(self._api())
            except (NotFound, ImageNotFound):
                raise
            except APIError as exc:
                if exc.response is None:  # nothing answered on the socket
                    self.close()  # drop the pooled connections to the dead socket
                    raise PodmanUnavailable(
                        f"the podman API at {self.socket} does not answer ({what})", SOCKET_HINT
                    ) from exc
                raise PodmanError(f"podman API: {what} failed: {exc}", SOCKET_HINT) from exc
            except (RequestException, OSError) as exc:
                self.close()
                raise PodmanUnavailable(
                    f"the podman API at {self.socket} does not answer ({what}): {exc}", SOCKET_HINT
                ) from exc

        return await asyncio.to_thread(guarded)

    async def container(self, name: str) -> ContainerState | None:
        """The container's state by name; None when there is no such container."""
        try:
            attrs = await self._off_loop(
                f"inspect container {name}", lambda c: c.containers.get(name).attrs
            )
        except NotFound:
            return None
        return parse_container(name, attrs)

    async def image(self, name: str) -> ImageInfo | None:
        """The local image by name; None when it is not present."""
        try:
            attrs = await self._off_loop(
                f"inspect image {name}", lambda c: c.images.get(name).attrs
            )
        except (NotFound, ImageNotFound):
            return None
        return ImageInfo(name, str(attrs.get("Id", "")))

    async def remove(self, name: str) -> bool:
        """Remove the container (killing it if it runs); False when there was none."""

        def remove(c: PodmanClient) -> bool:
            try:
                c.containers.remove(name, force=True)
            except NotFound:
                return False
            return True

        return await self._off_loop(f"remove container {name}", remove)

    async def logs(self, name: str, tail: int) -> list[str]:
        """The container's last `tail` log lines ([] when there is no such container)."""

        def read(c: PodmanClient) -> list[str]:
            try:
                frames = c.containers.get(name).logs(tail=tail)
            except NotFound:
                return []
            data = b"".join(frames) if not isinstance(frames, bytes) else frames
            return data.decode("utf-8", errors="replace").splitlines()

        return await self._off_loop(f"logs of {name}", read)
