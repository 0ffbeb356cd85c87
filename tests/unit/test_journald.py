"""journald's liveness as /healthz reads it: a datagram connect to its socket."""

from __future__ import annotations

import socket
from pathlib import Path

from laned.adapters import journal


def test_journald_is_down_when_its_socket_is_left_and_nobody_answers(tmp_path: Path) -> None:
    path = str(tmp_path / "socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as journald:
        journald.bind(path)
        assert journal.journald_down(path) is None  # it answers
    # Closed, its socket file left behind: what a killed journald leaves.
    down = journal.journald_down(path)
    assert down is not None and path in down and "refuses connections" in down
    assert journal.journald_down(str(tmp_path / "none")) is None  # no journal at all: not this
