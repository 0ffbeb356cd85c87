#!/usr/bin/env python3
"""How `laned import`'s time grows with its input (prints figures; asserts nothing):

    PYTHONPATH=. .venv/bin/python bench/import_scaling.py [--repeat 3]

Each case is one `docker run` line read, translated and written as TOML
(laned.importer.translate.import_run, then laned.importer.toml_out.render_import), the best
of `--repeat` runs:

- `-e A=1` repeated 10,000 and 50,000 times (the same flag: each is "given twice, kept once");
- 10,000 and 50,000 distinct `-e Vn=1` flags (each kept);
- 10,000 and 50,000 engine flags `--fN 1` after the image;
- one engine flag whose value is 900 KB (a long JSON a recipe might carry), and one
  `-e` value of 900 KB.

A linear importer takes about five times as long for 50,000 as for 10,000.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from laned.importer.toml_out import render_import
from laned.importer.translate import import_run

HEAD = "docker run --gpus all -p 8000:8000 "
TAIL = "vllm/vllm-openai:v0.11 --model org/m --served-model-name m"


def cases() -> dict[str, Callable[[], str]]:
    big = "x" * 900_000
    return {
        "10k repeated -e A=1": lambda: HEAD + "-e A=1 " * 10_000 + TAIL,
        "50k repeated -e A=1": lambda: HEAD + "-e A=1 " * 50_000 + TAIL,
        "10k distinct -e Vn=1": lambda: HEAD + "".join(f"-e V{i}=1 " for i in range(10_000)) + TAIL,
        "50k distinct -e Vn=1": lambda: HEAD + "".join(f"-e V{i}=1 " for i in range(50_000)) + TAIL,
        "10k engine flags": lambda: HEAD + TAIL + "".join(f" --f{i} 1" for i in range(10_000)),
        "50k engine flags": lambda: HEAD + TAIL + "".join(f" --f{i} 1" for i in range(50_000)),
        "900 KB engine value": lambda: HEAD + TAIL + f" --hf-overrides '{big}'",
        "900 KB -e value": lambda: HEAD + f"-e BIG={big} " + TAIL,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run the cases whose name holds this text")
    options = parser.parse_args()
    for name, make in cases().items():
        if options.only not in name:
            continue
        text = make()
        best = float("inf")
        for _ in range(options.repeat):
            started = time.perf_counter()
            render_import(import_run(text, "bench"), "bench")
            best = min(best, time.perf_counter() - started)
        print(f"{name:24} {len(text) / 1e6:6.2f} MB  {best:8.3f} s", flush=True)


if __name__ == "__main__":
    main()
