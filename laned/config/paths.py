"""Where things live: XDG defaults the way systemd computes them, and `~`/`$XDG_*` expansion."""

from __future__ import annotations

import re
from collections.abc import Mapping

# The XDG base directories and their defaults relative to $HOME (XDG Base Directory spec;
# systemd's user manager uses the same fallbacks for its unit search path).
XDG_DEFAULTS = {
    "XDG_CONFIG_HOME": ".config",
    "XDG_STATE_HOME": ".local/state",
    "XDG_DATA_HOME": ".local/share",
    "XDG_CACHE_HOME": ".cache",
}

_VAR = re.compile(r"\$(?:\{(XDG_[A-Z_]+|HOME)\}|(XDG_[A-Z_]+|HOME)\b)")


def home(env: Mapping[str, str]) -> str:
    """The user's home directory from the environment (HOME), `/` when unset."""
    return env.get("HOME") or "/"


def xdg(name: str, env: Mapping[str, str]) -> str:
    """Value of an XDG variable, falling back to the spec's default under $HOME."""
    value = env.get(name)
    if value and value.startswith("/"):
        return value
    if name in XDG_DEFAULTS:
        return f"{home(env).rstrip('/')}/{XDG_DEFAULTS[name]}"
    if name == "XDG_RUNTIME_DIR":
        raise ValueError(
            "$XDG_RUNTIME_DIR is not set; it is set in a user session "
            "(or write the path out in full)"
        )
    raise ValueError(f"${name} is not set")


def expand(path: str, env: Mapping[str, str]) -> str:
    """Expand a leading `~` and any `$XDG_*`/`$HOME` variables; other text is kept as written."""
    if path == "~" or path.startswith("~/"):
        path = home(env).rstrip("/") + path[1:]

    def sub(match: re.Match[str]) -> str:
        name = match.group(1) or match.group(2)
        return home(env).rstrip("/") if name == "HOME" else xdg(name, env)

    return _VAR.sub(sub, path)


def default_config_path(env: Mapping[str, str]) -> str:
    """`$LANED_CONFIG`, else `$XDG_CONFIG_HOME/laned/laned.toml`."""
    return env.get("LANED_CONFIG") or f"{xdg('XDG_CONFIG_HOME', env)}/laned/laned.toml"


def default_unit_dir(env: Mapping[str, str]) -> str:
    """`$XDG_CONFIG_HOME/systemd/user`: the user manager's own search path for admin units."""
    return f"{xdg('XDG_CONFIG_HOME', env)}/systemd/user"


def default_bin_dir(env: Mapping[str, str]) -> str:
    """`~/.local/bin` (systemd-path user-binaries)."""
    return f"{home(env).rstrip('/')}/.local/bin"


def default_cache_dir(env: Mapping[str, str]) -> str:
    """laned's compile caches for the lanes: $XDG_CACHE_HOME/laned (safe to delete)."""
    return f"{xdg('XDG_CACHE_HOME', env)}/laned"


def default_state_dir(env: Mapping[str, str]) -> str:
    """`$XDG_STATE_HOME/laned`."""
    return f"{xdg('XDG_STATE_HOME', env)}/laned"
