"""A lane's command read as its engine's argv: where its program starts after a launcher
(`taskset -c 0 llama-server ...`) and where the engine's own flags begin
(`vllm serve /models/x --max-model-len 8192`). Pure."""

from __future__ import annotations

import re
from collections.abc import Sequence

# Programs that run another one: their words, and their options, are skipped.
LAUNCHERS = frozenset({"taskset", "numactl", "nice", "ionice", "chrt", "env", "stdbuf", "nohup"})


def program_start(words: Sequence[str]) -> int:
    """The index of the command's program after any launchers and their options and values
    (`-c 0`, `--cpunodebind=0`, `A=B`; env's as env reads them: env_assignments)."""
    i = 0
    while i < len(words) and words[i].rsplit("/", 1)[-1] in LAUNCHERS:
        launcher = words[i].rsplit("/", 1)[-1]
        i += 1
        i = _env_words(words, i, None, []) if launcher == "env" else _options_of(words, i)
    return i


def _options_of(words: Sequence[str], i: int) -> int:
    """The index after a launcher's options and their values (`-c 0`, `--cpunodebind=0`)."""
    while i < len(words) and (
        words[i].startswith("-") or "=" in words[i] or words[i][:1].isdigit()
    ):
        i += 1
    return i


def command_flags(words: Sequence[str]) -> list[str]:
    """The engine's flags that a command carries after its program and its positional
    words: `vllm serve /m --max-model-len 8192` and a container's `serve /m --max-model-len
    8192` → `--max-model-len 8192`; `python3 -m sglang.launch_server --model-path /m` →
    `--model-path /m` (Python's own options and `-m MODULE` are not the engine's);
    `taskset -c 0 llama-server -m x.gguf` → `-m x.gguf`."""
    i = program_start(words)
    if i < len(words) and words[i].rsplit("/", 1)[-1].startswith("python"):
        i += 1
        while i < len(words) and words[i].startswith("-") and words[i] != "-m":
            i += 1  # -u, -O, -B ...
        i += 2 if i < len(words) and words[i] == "-m" else 1  # the module, or the script
    while i < len(words) and not words[i].startswith("-"):
        i += 1  # the program, a subcommand (`serve`), the model
    return list(words[i:])


# GNU env's options (coreutils 9.1, `env --help`; its getopt_long string "+C:iS:u:v0", with
# -a/--argv0 from 9.5): those that take a value, short and long; a long one may be given as
# any unique prefix (getopt_long), and `-` alone is `-i`.
_ENV_VALUED_SHORT = frozenset("uCSa")
_ENV_VALUED_LONG = ("--unset", "--chdir", "--split-string", "--argv0")


def env_assignments(words: Sequence[str]) -> list[tuple[int, str, str]]:
    """(index, NAME, VALUE) of each NAME=VALUE that an `env` at the head of a command sets
    (`env A=1 vllm ...`, `/usr/bin/env -i -u X A=1 ...`, `taskset -c 0 env A=1 ...`), as GNU
    env reads its words: its options first (a value of -u, -C, -S, -a, attached or the next
    word), then the NAME=VALUE words up to the first that is none, which is the command. The
    words of `-S STRING` are read the same way, each found at the index of the word that holds
    the string."""
    found: list[tuple[int, str, str]] = []
    i = 0
    while i < len(words) and words[i].rsplit("/", 1)[-1] in LAUNCHERS:
        launcher = words[i].rsplit("/", 1)[-1]
        i += 1
        i = _env_words(words, i, None, found) if launcher == "env" else _options_of(words, i)
    return found


def _env_words(
    words: Sequence[str], i: int, at: int | None, found: list[tuple[int, str, str]]
) -> int:
    """Read env's options and NAME=VALUE words from `words[i]` on; `at`: the index every
    assignment is found at (that of a -S string), None for each word's own. Returns the
    index of the command."""
    options = True  # getopt's "+": the options end at `--` or at the first word that is none
    while i < len(words):
        if options and words[i].startswith("-"):
            i, options = _env_option(words, i, at, found)
            continue
        options = False
        name, eq, value = words[i].partition("=")
        if not eq or not name:
            break
        found.append((i if at is None else at, name, value))
        i += 1
    return i


def _env_option(
    words: Sequence[str], i: int, at: int | None, found: list[tuple[int, str, str]]
) -> tuple[int, bool]:
    """One of env's options at `words[i]`, a -S string's words read too: (the index after it
    and its value, whether options may follow)."""
    word = words[i]
    if word == "--":
        return i + 1, False
    if word == "-":  # -i
        return i + 1, True
    if word.startswith("--"):
        name, eq, inline = word.partition("=")
        long = next((o for o in _ENV_VALUED_LONG if o.startswith(name) and len(name) > 2), None)
        if long is None or eq:
            if long == "--split-string":
                _env_words(_split(inline), 0, i if at is None else at, found)
            return i + 1, True
        if long == "--split-string" and i + 1 < len(words):
            _env_words(_split(words[i + 1]), 0, i + 1 if at is None else at, found)
        return i + 2, True
    letters = word[1:]
    j = next((k for k, c in enumerate(letters) if c in _ENV_VALUED_SHORT), None)
    if j is None:  # -i, -0, -v and their clusters
        return i + 1, True
    attached = letters[j + 1 :]
    if letters[j] == "S":
        held = i if attached else i + 1
        value = attached or (words[i + 1] if i + 1 < len(words) else "")
        _env_words(_split(value), 0, held if at is None else at, found)
    return (i + 1 if attached else i + 2), True


# A word of env's -S string: blanks end it, quotes hold blanks in it.
_S_WORD = re.compile(r"""(?:[^\s'"]+|'[^']*'|"[^"]*")+""")


def _split(text: str) -> list[str]:
    """The words of env's -S string, their quotes removed (env's own rules also expand ${NAME}
    and read escapes: whatever they make, its NAME=VALUE words stand where they do here)."""
    return [re.sub(r"""['"]""", "", word) for word in _S_WORD.findall(text)]
