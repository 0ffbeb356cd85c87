"""The commands that set laned up: `laned init` (a starter config), `laned completion` (bash
and zsh), and the hidden `laned _lanes` that completion asks for lane names."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from laned.cli.args import EXIT_OK, EXIT_USAGE, config_path

# The examples in config/, shipped in the package (laned/examples is a link to it).
EXAMPLES = {
    "seed-000": "laned.example.toml",  # the production lanes of two RTX PRO 6000 (seed 000)
    "seed-001": "seed-001-4x-rtx-pro-6000.toml",
    "seed-002": "seed-002-2x-dgx-spark.toml",
    "demo": "demo.toml",  # the simulated engine: no GPU needed
}
NEXT = {
    "seed-000": [
        "the model and recipe paths in each lane's container.volumes and command",
        "each lane's secrets file (api_key_file / secrets_file): mode 0600, NAME=VALUE lines (VLLM_API_KEY=..., HF_TOKEN=...)",
        "the image names: build or pull them (laned preflight says which are missing)",
    ],
    "seed-001": [
        "the weights' path in container.volumes (the recipe downloads them to ~/models)",
        "pull the image: podman pull ghcr.io/sybil-solutions/vllm-moet-dsv41@sha256:...",
    ],
    "seed-002": [
        "the hosts in nodes, and daemon.host on each host if its hostname differs",
        "HEAD_IP and each rank's NODE_IP, CX7_IF, CX7_IB (ip -br addr; ibdev2netdev)",
        "daemon.token_file and daemon.peer_token_file: 0600 files, the peer token the same on both",
    ],
    "demo": ["nothing: it runs the simulated engine (no GPU); start it with `laned serve`"],
}


def examples_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "examples"


def cmd_init(args: argparse.Namespace) -> int:
    """`laned init [--example NAME] [--force]`: write a starter config, say what to edit."""
    from laned.errors import ConfigError
    from laned.validation.load import load_config

    source = examples_dir() / EXAMPLES[args.example]
    target = Path(config_path(args))
    if target.exists() and not args.force:
        print(
            f"laned init: {target} exists; nothing written (--force replaces it, keeping "
            f"{target.name}.bak)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():
        shutil.copy2(target, target.with_name(target.name + ".bak"))
    shutil.copyfile(source, target)
    print(f"wrote {target} from the {args.example} example ({source.name})")
    print("edit next:")
    for item in NEXT[args.example]:
        print(f"  - {item}")
    try:
        config = load_config(str(target))
        lanes = ", ".join(sorted(config.lanes)) or "none on this host"
        print(
            f"it validates now (lanes: {lanes}); then: laned status --fit, laned preflight "
            "LANE, laned install"
        )
    except ConfigError as exc:
        print(f"as written it does not validate yet:\n{exc}")
    return EXIT_OK


def cmd_completion(args: argparse.Namespace) -> int:
    """`laned completion bash|zsh`: print the script to source."""
    from laned.cli import args as cli_args
    from laned.cli import completion

    script = completion.bash if args.shell == "bash" else completion.zsh
    print(script(cli_args.parser()), end="")
    return EXIT_OK


def cmd_lanes(args: argparse.Namespace) -> int:
    """`laned _lanes`: the configured lane names, one a line (nothing when the config does not
    load: completion must stay quiet)."""
    from laned.errors import LanedError
    from laned.validation.load import load_config

    try:
        config = load_config(config_path(args), os.environ)
    except LanedError:
        return EXIT_OK
    print("\n".join(sorted(config.lanes)))
    return EXIT_OK
