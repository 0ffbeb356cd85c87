"""The control API's settings from the config: the listen address, the tokens, the peers'
names for this host and the lanes they share. Checked at `laned serve` and again at each
reload, the same way (safe by default: a listener off loopback needs a token)."""

from __future__ import annotations

from urllib.parse import urlsplit

from laned.adapters.secret_files import read_token
from laned.api.guard import ApiSettings
from laned.config.listener import parse_listen
from laned.config.model import Config
from laned.config.sleep import loopback
from laned.errors import UnsafeApi


def api_settings(config: Config) -> ApiSettings:
    """Check the listen address and token before anything starts (safe by default)."""
    listen = parse_listen(config.daemon.listen)
    assert listen is not None  # the config checks guarantee it
    host, port = listen
    token = read_token(config.daemon.token_file)
    if not loopback(host) and token is None:
        raise UnsafeApi(
            f"daemon.listen {config.daemon.listen} is reachable from other machines and no token is set",
            "set daemon.token_file to a 0600 file holding a random token (`openssl rand -hex 32 > FILE`), "
            'or listen on "127.0.0.1:9000"',
        )
    if config.daemon.token_for_reads and token is None:
        raise UnsafeApi(
            "daemon.token_for_reads is set but daemon.token_file is not", "set daemon.token_file"
        )
    peer_hosts = frozenset(
        (urlsplit(node.laned).hostname or "").lower()
        for spec in config.lanes.values()
        for node in spec.nodes
    )
    return ApiSettings(
        host,
        port,
        token,
        config.daemon.token_for_reads,
        read_token(config.daemon.peer_token_file, "daemon.peer_token_file"),
        peer_hosts - {""},
        frozenset(lane for lane, spec in config.lanes.items() if spec.nodes),
    )
