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

from laned.errors import SecretsFileError

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
# Words that make a name look secret, alone (`API_KEY`, `TOKEN`) or as its last words
# (`MY_API_KEY`), and parts anywhere in it (a name that only looks so takes `secret = false`
# in the config).
SECRET_WORDS = ("TOKEN", "API_KEY", "APIKEY", "SECRET", "SECRET_KEY", "ACCESS_KEY")
SECRET_ENDINGS = tuple("_" + word for word in SECRET_WORDS)
SECRET_PARTS = ("PASSWORD", "PASSWD", "SECRET", "CREDENTIAL")
# Engine flags whose value is a secret, and the variable the engine reads instead.
SECRET_FLAGS = {"--api-key": "VLLM_API_KEY", "--hf-token": "HF_TOKEN"}
# The shortest abbreviation of each that vLLM's parser takes (argparse's allow_abbrev: a
# prefix no other `vllm serve` flag shares; --api-server-count, --hf-overrides, --hf-config-path).
SHORTEST = {"--api-key": "--api-k", "--hf-token": "--hf-t"}
# podman/docker run's short options that take a value, which may be attached (`-eNAME=V`).
VALUED_SHORT = frozenset("epvwumchl")

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def looks_secret(name: str) -> bool:
    """Whether an environment variable of this name holds a secret, as far as its name says."""
    upper = name.upper()
    return (
        upper in SECRET_NAMES
        or upper in SECRET_WORDS
        or upper.endswith(SECRET_ENDINGS)
        or any(part in upper for part in SECRET_PARTS)
    )


def engine_flag(text: str) -> str:
    """An engine argument's flag as vLLM's parser reads it: `--api_key=X` is `--api-key`
    (FlexibleArgumentParser turns underscores into dashes from `--` to the first `.`,
    vllm/utils/argparse_utils.py); anything else as written."""
    if not text.startswith("--"):
        return text
    name = text.split("=", 1)[0]
    head, dot, rest = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


def secret_flag(text: str) -> str | None:
    """The secret engine flag (SECRET_FLAGS) that `text` sets as vLLM reads it: any spelling
    of its name (engine_flag), with or without `=VALUE`, or an abbreviation argparse takes
    for it; None when it sets none."""
    name = engine_flag(text)
    for flag, shortest in SHORTEST.items():
        if flag.startswith(name) and name.startswith(shortest):
            return flag
    return None


def short_option(text: str) -> tuple[str, str] | None:
    """A podman/docker short option with its value attached (`-eHF_TOKEN=x`, `-p8000:8000`)
    as (option, value), the way podman reads it; None for anything else."""
    if len(text) > 2 and text[0] == "-" and text[1] in VALUED_SHORT:
        return text[:2], text[2:]
    return None


def secrets_file_line(name: str) -> str:
    """The line a person writes in the secrets file for `name` (never a value)."""
    return f"{name}=<the value>"


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
