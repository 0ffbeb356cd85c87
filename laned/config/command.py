"""A lane's command read as its engine's argv: where its program starts after a launcher
(`taskset -c 0 llama-server ...`) and where the engine's own flags begin
(`vllm serve /models/x --max-model-len 8192`). Pure."""

from __future__ import annotations

from collections.abc import Sequence

# Programs that run another one: their words, and their options, are skipped.
LAUNCHERS = frozenset({"taskset", "numactl", "nice", "ionice", "chrt", "env", "stdbuf", "nohup"})


def program_start(words: Sequence[str]) -> int:
    """The index of the command's program after any launchers and their options and values
    (`-c 0`, `--cpunodebind=0`, `A=B`)."""
    i = 0
    while i < len(words) and words[i].rsplit("/", 1)[-1] in LAUNCHERS:
        i += 1
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
