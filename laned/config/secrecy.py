"""What counts as a secret, in one place, and how a lane's secrets file reads. Pure.

A lane's secrets live in one file of `NAME=VALUE` lines, mode 0600 (`secrets_file`, or
`api_key_file`, its older name). systemd reads it into the serve wrapper's environment
(EnvironmentFile=); the engine gets every name in it by name only (inherited by an exec
lane, `-e NAME` for a container), so no value is ever in an argv, a unit, a wrapper or a
config that laned writes. What looks secret: a name (looks_secret), a NAME=VALUE by its name
or its value (holds_secret), and a value by the shape of a well-known token (token_kind),
wherever it stands. `laned validate` refuses each in a lane (laned.validation.secret_rules), and
`laned import` turns each into a line to write in the file.
"""

from __future__ import annotations

import functools
import re

from laned.errors import SecretsFileError

# Names that are secrets wherever they appear.
SECRET_NAMES = frozenset(
    {
        "HF_TOKEN",
        "HUGGING_FACE_HUB_TOKEN",
        "HUGGINGFACE_TOKEN",
        "OPENAI_API_KEY",
        "NGC_API_KEY",
        "WANDB_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "GITHUB_TOKEN",
        # Not a secret by itself, but half of one, and named so by AWS's own tools: a lane
        # has no use for it outside its secrets file.
        "AWS_ACCESS_KEY_ID",
    }
)
# Words that make a name look secret, alone (`API_KEY`, `TOKEN`) or as its last words
# (`MY_API_KEY`), and parts anywhere in it (a name that only looks so takes `secret = false`
# in the config).
SECRET_WORDS = ("TOKEN", "API_KEY", "APIKEY", "SECRET", "SECRET_KEY", "ACCESS_KEY")
SECRET_ENDINGS = tuple("_" + word for word in SECRET_WORDS)
SECRET_PARTS = ("PASSWORD", "PASSWD", "SECRET", "CREDENTIAL")
# A name of these endings holds a key only where its value looks like one (_RANDOM):
# `CUDA_CACHE_KEY = "v2"` is no secret, `PROVIDER_KEY = "q8Zr..."` is.
KEY_ENDINGS = ("_KEY", "_KEY_ID")

# Tokens by their well-known shapes, found wherever they stand in a text: the second net, for a
# value given under a name (or a flag) that says nothing. Each is as strict as its issuer's
# format allows, so that ordinary values (model names, paths, dtypes) never match: a left edge
# that is no letter or digit (`task-...`, `disk-...` start none), the issuer's own prefix,
# and a body of the issuer's alphabet and length. Every pattern runs in time linear in the
# text (no nested repetition): a value may be a megabyte.
TOKEN_SHAPES: tuple[tuple[str, re.Pattern[str]], ...] = (
    # Hugging Face user access tokens: `hf_` and 34 letters and digits (30 or more here, for
    # older and shortened ones); `hf_overrides`, `hf_config_path` break the run at `_`.
    ("a Hugging Face token", re.compile(r"(?<![A-Za-z0-9])hf_[A-Za-z0-9]{30,}")),
    # OpenAI-style keys: `sk-`, an optional kind (`proj-`, `svcacct-`, `admin-`, Anthropic's
    # `ant-api03-`), then 20 or more of [A-Za-z0-9_-]; _random_run must hold for the body.
    (
        "an OpenAI-style API key",
        re.compile(
            r"(?<![A-Za-z0-9])sk-(?:(?:proj|svcacct|admin|ant)-(?:[a-z]+[0-9]+-)?)?"
            r"[A-Za-z0-9_-]{20,}"
        ),
    ),
    # AWS access key ids: AKIA (long-term) or ASIA (temporary) and exactly 16 of [A-Z0-9];
    # the other id prefixes (AIDA, AROA, ...) name users and roles, not keys.
    (
        "an AWS access key id",
        re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])"),
    ),
    # GitHub tokens: ghp_ (classic), gho_ (OAuth), ghu_ (user-to-server), ghs_ (server-to-
    # server), ghr_ (refresh), each with 36 letters and digits; fine-grained `github_pat_`
    # with 82 of letters, digits and `_`.
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9])gh[pousr]_[A-Za-z0-9]{36,}")),
    ("a GitHub token", re.compile(r"(?<![A-Za-z0-9])github_pat_[A-Za-z0-9_]{60,}")),
)
# The name a token of each shape is usually read by, for hints.
TOKEN_NAMES = {
    "a Hugging Face token": "HF_TOKEN",
    "an OpenAI-style API key": "OPENAI_API_KEY",
    "an AWS access key id": "AWS_ACCESS_KEY_ID",
    "a GitHub token": "GITHUB_TOKEN",
}
# An `sk-` body must hold a run of 16 or more letters and digits with a digit in it: what a
# random key has (48 of base62, or base64url's long runs) and what a model or file called
# `sk-...` lacks (`sk-llama-3-8b-instruct-v2`: no run of 16).
_RUN = re.compile(r"[A-Za-z0-9]{16,}")

# A value that looks like a random key, for a name of KEY_ENDINGS: 16 or more of base64's or
# hex's alphabet, no space, with a digit and a letter in it (`v2`, `/path/to/key`, `fp8` and
# a word are not).
_RANDOM = re.compile(r"^(?=.*[0-9])(?=.*[A-Za-z])[A-Za-z0-9+/=_.-]{16,}$")
# NAME=VALUE inside any word (`HF_TOKEN=x`, `-ei=HF_TOKEN=x`, a shell's `sh -c "..."`): the
# name starts after anything that is no part of a name.
_ASSIGNED = re.compile(r"(?<![A-Za-z0-9_])([A-Za-z_][A-Za-z0-9_]*)=(?=\S)")

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


def token_kind(text: str) -> str | None:
    """What well-known token `text` holds somewhere (TOKEN_SHAPES: "a Hugging Face token"),
    None when it holds none. Never the token itself."""
    if len(text) < 20:
        return None  # shorter than any shape: most values, at no cost
    for kind, shape in TOKEN_SHAPES:
        for match in shape.finditer(text):
            if not match.group().startswith("sk-") or _random_run(match.group()):
                return kind
    return None


def redacted(text: str) -> str:
    """`text` with each well-known token in it replaced by its kind (`<a Hugging Face
    token>`): for anything laned says of a config, whichever rule says it."""
    if len(text) < 20:
        return text
    for kind, shape in TOKEN_SHAPES:
        text = shape.sub(functools.partial(_named, f"<{kind}>"), text)
    return text


def _named(name: str, match: re.Match[str]) -> str:
    token = match.group()
    return name if not token.startswith("sk-") or _random_run(token) else token


def _random_run(body: str) -> bool:
    return any(any(c.isdigit() for c in run) for run in _RUN.findall(body))


def holds_secret(name: str, value: str) -> bool:
    """Whether `name=value` holds a secret: by its name (looks_secret), by a token in its
    value (token_kind), or for a name of KEY_ENDINGS (`HF_KEY`) by a value that looks random."""
    if looks_secret(name) or token_kind(value) is not None:
        return True
    return name.upper().endswith(KEY_ENDINGS) and _RANDOM.match(value) is not None


def assigned_secret(text: str) -> str | None:
    """The secret-looking name that `text` sets as NAME=VALUE anywhere in it (`-ei=HF_TOKEN=x`
    as podman reads it sets `i` to `HF_TOKEN=x`, which is still the token in argv), None when
    it sets none. A name with an empty value sets nothing."""
    if "=" not in text:
        return None
    for match in _ASSIGNED.finditer(text):
        if looks_secret(match.group(1)):
            return match.group(1)
    return None


def engine_flag(text: str) -> str:
    """An engine argument's flag as vLLM's parser reads it: `--api_key=X` is `--api-key`
    (FlexibleArgumentParser turns underscores into dashes from `--` to the first `.`,
    vllm/utils/argparse_utils.py); anything else as written."""
    if not text.startswith("--"):
        return text
    name = text.split("=", 1)[0]
    head, dot, rest = name[2:].partition(".")
    return "--" + head.replace("_", "-") + dot + rest


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
