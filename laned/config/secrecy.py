"""What counts as a secret, in one place, and how a lane's secrets file reads. Pure.

A lane's secrets live in one file of `NAME=VALUE` lines, mode 0600 (`secrets_file`, or
`api_key_file`, its older name). systemd reads it into the serve wrapper's environment
(EnvironmentFile=); the engine gets every name in it by name only (inherited by an exec
lane, `-e NAME` for a container), so no value is ever in an argv, a unit, a wrapper or a
config that laned writes. `laned validate` refuses a secret-looking `env` value in the
config, and `laned import` turns one into a line to write in the file.
"""

from __future__ import annotations

import re

# Names that are secrets wherever they appear.
SECRET_NAMES = frozenset(
    {
        "VLLM_API_KEY",
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_TOKEN",
        "OPENAI_API_KEY",
        "NGC_API_KEY",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "GITHUB_TOKEN",
    }
)
# Endings and parts of a name that make it look secret (a name that only looks so takes
# `secret = false` in the config).
SECRET_ENDINGS = ("_TOKEN", "_API_KEY", "_APIKEY", "_SECRET", "_SECRET_KEY", "_ACCESS_KEY")
SECRET_PARTS = ("PASSWORD", "PASSWD", "SECRET", "CREDENTIAL")
# Engine flags whose value is a secret, and the variable the engine reads instead.
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def looks_secret(name: str) -> bool:
    """Whether an environment variable of this name holds a secret, as far as its name says."""
    upper = name.upper()
    return (
        upper in SECRET_NAMES
        or upper.endswith(SECRET_ENDINGS)
        or any(part in upper for part in SECRET_PARTS)
    )


def secrets_file_line(name: str) -> str:
    """The line a person writes in the secrets file for `name` (never a value)."""
    return f"{name}=<the value>"


class SecretsFileError(ValueError):
    """A line of a secrets file that systemd would not read as NAME=VALUE."""


def names_in(text: str) -> list[str]:
    """The names a secrets file defines, in order, each once. Comments (# or ;) and blank
    lines are skipped, as systemd's EnvironmentFile= does; a line without NAME= raises
    SecretsFileError with its number (never its text: it may hold a value)."""
    names: list[str] = []
    continued = False
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if continued:  # the value of the line before goes on here (a trailing backslash)
            continued = line.endswith("\\")
            continue
        if not line or line.startswith(("#", ";")):
            continue
        name, sep, _ = line.partition("=")
        name = name.strip()
        if not sep or not _NAME.match(name):
            # `export NAME=...` included: systemd's EnvironmentFile= has no `export`.
            raise SecretsFileError(f"line {number} is not NAME=VALUE")
        if name not in names:
            names.append(name)
        continued = line.endswith("\\")
    return names


def value_of(text: str, name: str) -> str | None:
    """The value a secrets file gives `name` (quotes around it removed), None when unset."""
    for raw in text.splitlines():
        key, sep, value = raw.strip().partition("=")
        if sep and key.strip() == name:
            return value.strip().strip('"').strip("'") or None
    return None
