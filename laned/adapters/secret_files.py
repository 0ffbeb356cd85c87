"""The one place laned reads secret files: the API and peer tokens (daemon.token_file,
daemon.peer_token_file: 0600 or refused), a lane's secrets file (one value, the engine's
API key by its profile's name (VLLM_API_KEY, SGLANG_API_KEY, LLAMA_API_KEY), for laned's
own requests to the engine; or its names and mode only, for preflight). What
counts as a secret and how a secrets file reads is laned.config.secrecy."""

from __future__ import annotations

import os
import pwd
import stat

from laned.config import secrecy
from laned.core.facts import KeyFile
from laned.errors import SecretFileRefused, SecretsFileError


def read_token(path: str | None, key: str = "daemon.token_file") -> str | None:
    """The API token from daemon.token_file (or `key`); the file must be 0600 (or stricter)."""
    if path is None:
        return None
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
        with open(path, encoding="utf-8") as handle:
            token = handle.read().strip()
    except OSError as exc:
        raise SecretFileRefused(
            f"{key} {path}: {exc.strerror}", "create it with a random token, mode 0600"
        ) from exc
    if mode & 0o077:
        raise SecretFileRefused(
            f"{key} {path} is mode {mode:04o}: others can read the token",
            f"chmod 600 {path}",
        )
    if not token:
        raise SecretFileRefused(
            f"{key} {path} is empty",
            "put a random token in it, e.g. `openssl rand -hex 32`",
        )
    return token


def read_api_key(path: str | None, name: str) -> str | None:
    """The engine's API key, `name` (its profile's api_key_env), from a lane's secrets file
    (systemd's EnvironmentFile= format); None when unset or unreadable."""
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            return secrecy.value_of(handle.read(), name)
    except (OSError, UnicodeDecodeError):
        return None


def key_file(path: str) -> KeyFile:
    """The lane's secrets file as found (names only: its values stay in it). A symbolic link
    is not followed (systemd would read what it leads to as the engine's environment, and a
    `chmod` of it would change that file): where it leads is all that is read of it."""
    try:
        info = os.lstat(path)
    except OSError:
        return KeyFile(exists=False)
    if stat.S_ISLNK(info.st_mode):
        return KeyFile(exists=True, link=os.path.realpath(path))
    mode = stat.S_IMODE(info.st_mode)
    if info.st_uid != os.getuid():
        return KeyFile(exists=True, mode=mode, foreign_owner=_user(info.st_uid))
    if not stat.S_ISREG(info.st_mode):
        return KeyFile(exists=True, mode=mode, unreadable="not a regular file")
    try:
        # O_NOFOLLOW: a link put in its place since the lstat is refused, not read.
        with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW), encoding="utf-8") as handle:
            names = tuple(secrecy.names_in(handle.read()))
    except (OSError, UnicodeDecodeError, SecretsFileError) as exc:
        why = exc.message if isinstance(exc, SecretsFileError) else type(exc).__name__
        return KeyFile(exists=True, mode=mode, unreadable=why)
    return KeyFile(exists=True, mode=mode, names=names)


def _user(uid: int) -> str:
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
