"""An imported lane (laned.importer.translate) as the TOML text a person pastes into laned.toml: each
translation noted beside its key, the placeholders that need a value on each host, and the
`needs` line to fill in. Deterministic: the same command line gives the same text."""

from __future__ import annotations

from laned.importer import toml_text as t
from laned.importer.run_options import Imported

# The order of the keys in the TOML written.
TOP_KEYS = (
    "description",
    "engine",
    "port",
    "served_model_name",
    "aliases",
    "secrets_file",
    "secrets",
    "needs",
    "weight_cache",
)
CONTAINER_KEYS = (
    "image",
    "name",
    "entrypoint",
    "command",
    "devices",
    "network",
    "ipc",
    "security_opt",
    "volumes",
)


def render_import(lane: Imported, source: str) -> str:
    """The lane tables, with a header that says where they came from and what changed."""
    out = t.comment(f"Imported by `laned import` from {source}.")
    if lane.changes:
        out += t.comment("Changed on the way (docs/import.md says why):")
        out += [line for change in lane.changes for line in t.comment(f"  - {change}")]
    if lane.warnings:
        out += t.comment("Warnings (also on stderr):")
        out += [line for warning in lane.warnings for line in t.comment(f"  - {warning}")]
    if lane.per_node:
        out += t.comment("Needs a value on each host (a lane over several hosts: docs/import.md):")
        for name, uses in lane.per_node.items():
            out += t.comment(f"  ${{{name}}}: {'; '.join(uses)}")
    out += [f"[lanes.{t.key(lane.name)}]"]
    for name in TOP_KEYS:
        if name in lane.lane:
            out += _keyed(name, lane.lane[name], lane.notes.get(name, ""))  # type: ignore[arg-type]
    if lane.nodes:
        out += t.comment("rank = position: rank 0, the head, serves the API (docs/multinode.md)")
        nodes = [(t.value({"host": h, "laned": u}), "") for h, u in lane.nodes]
        out += t.array("nodes", nodes)
    if lane.values:
        out += _keyed("values", lane.values, "the same on every rank; empty ones: fill in")
    if lane.args:
        items = [(_arg(flag, value), why) for flag, value, why in lane.args]
        out += t.array("args", items)
    if lane.env:
        out += ["", f"[lanes.{t.key(lane.name)}.env]"]
        for name, (text, why) in lane.env.items():
            rendered = t.value({"value": text, "why": why}) if why else t.string(text)
            out.append(f"{t.key(name)} = {rendered}")
    out += ["", f"[lanes.{t.key(lane.name)}.container]"]
    for name in CONTAINER_KEYS:
        if lane.container.get(name) not in (None, []):
            out += _keyed(name, lane.container[name], "")  # type: ignore[arg-type]
    if lane.podman_args:
        items = [(", ".join(t.string(w) for w in words), why) for words, why in lane.podman_args]
        out += t.array("podman_args", items)
    for rank, values in lane.ranks.items():
        out += ["", f"[lanes.{t.key(lane.name)}.rank.{rank}]", *t.comment(f"{lane.nodes[rank][0]}")]
        if values:
            out += _keyed("values", values, "this rank's own; empty ones: fill in")
        if lane.rank_args.get(rank):
            items = [(_arg(f, v), why) for f, v, why in lane.rank_args[rank]]
            out += t.array("args", items)
    return "\n".join(out) + "\n"


def _keyed(name: str, item: t.Value, note: str) -> list[str]:
    line = f"{t.key(name)} = {t.value(item)}"
    return [*t.comment(note), line] if note else [line]


def _arg(flag: str, value: str | None) -> str:
    return t.value({"flag": flag} if value is None else {"flag": flag, "value": value})
