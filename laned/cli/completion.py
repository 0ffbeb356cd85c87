"""Shell completion for bash and zsh, written from the parser itself: the commands, each
command's options, and lane names asked of `laned _lanes` (from the config) when a command
takes a lane. Pure: a parser in, a script out."""

from __future__ import annotations

import argparse

# Commands whose first argument is a lane (or, for `events`, whose --lane takes one).
LANE_COMMANDS = ("activate", "deactivate", "restart", "preflight", "logs", "check", "bench")


def _commands(parser: argparse.ArgumentParser) -> dict[str, list[str]]:
    """Each visible command and its options."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    out = {}
    for name, command in sub.choices.items():
        if name.startswith("_"):
            continue
        out[name] = sorted({flag for action in command._actions for flag in action.option_strings})
    return out


def bash(parser: argparse.ArgumentParser) -> str:
    """The bash completion script (`source <(laned completion bash)`)."""
    commands = _commands(parser)
    cases = "\n".join(
        f"    {name}) options={' '.join(flags)!r} ;;" for name, flags in commands.items()
    )
    lanes = "|".join(LANE_COMMANDS)
    return f"""# laned completion for bash: source <(laned completion bash)
_laned() {{
  local cur=${{COMP_WORDS[COMP_CWORD]}} prev=${{COMP_WORDS[COMP_CWORD-1]}}
  local command="" config=() i=1
  # The command is the first word that is neither an option nor --config's value.
  while (( i < COMP_CWORD )); do
    case ${{COMP_WORDS[i]}} in
      --config) config=(--config "${{COMP_WORDS[i+1]}}"); i=$((i + 2)); continue ;;
      -*) ;;
      *) if [[ -z $command ]]; then command=${{COMP_WORDS[i]}}; fi ;;
    esac
    i=$((i + 1))
  done
  if [[ $prev == --config || $prev == --file || $prev == --token-file || $prev == --out ]]; then
    COMPREPLY=($(compgen -f -- "$cur")); return
  fi
  if [[ -z $command ]]; then
    COMPREPLY=($(compgen -W "{" ".join(commands)} --config" -- "$cur")); return
  fi
  local options=""
  case $command in
{cases}
  esac
  if [[ $cur == -* ]]; then
    COMPREPLY=($(compgen -W "$options" -- "$cur")); return
  fi
  if [[ $command =~ ^({lanes})$ || ( $command == events && $prev == --lane ) ]]; then
    COMPREPLY=($(compgen -W "$(laned "${{config[@]}}" _lanes 2>/dev/null)" -- "$cur"))
  fi
}}
complete -F _laned laned
"""


def zsh(parser: argparse.ArgumentParser) -> str:
    """The zsh completion script: the bash one through zsh's bashcompinit."""
    return (
        "# laned completion for zsh: source <(laned completion zsh)\n"
        "autoload -U +X bashcompinit && bashcompinit\n" + bash(parser)
    )
