"""The shape of the package, checked over its import graph (ast, no import runs), by folder:
every module is held to the rules of the folder it sits in.

- the folders are floors (FLOORS, bottom up): a module imports only from the floors below its
  folder's and from its own folder; no import runs back up a floor, TYPE_CHECKING imports
  included;
- pure folders (config, core, engines, preflight, validation, render, importer) reach no I/O
  library, no file and no environment (validation/load.py reads the config file);
- of the owner only its wiring (owner/wiring.py) imports an adapter, and no part of the owner
  imports the wiring: the parts reach the host through the seam's protocols (owner/seam.py),
  each of a dozen members at most, each member with a one-line docstring;
- no import loop;
- the API reaches the host only through the supervisor; the CLI reads no state file and asks
  systemd nothing the daemon answers;
- a lane's record is changed by the lane machine's runner alone;
- every exception laned raises sits in errors.py's tree (a class of its own elsewhere only
  when private to its module), and none raises the bare root `LanedError`;
- no engine's names (its flags, its variables, its program) outside laned/engines/ and the
  simulator: the rest asks the lane's profile;
- `# fmt: skip` on tables of data only, at most FMT_SKIPS of them outside the simulator.

Modules are sized by their one job, not by a line cap.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "laned"

# Bottom up. Each floor's folders import only from the floors below (and within themselves):
# the config model knows no engine; the core decides over the config; the engines' profiles
# over both; preflight and validation judge a lane and a config with the engines' knowledge;
# render and importer write and read what the engines take; the adapters act on the host;
# the gates and the owner use them; api, daemon and cli are where it is all put together.
FLOORS: tuple[set[str], ...] = (
    {"errors"},
    {"config"},
    {"core", "sim"},  # the simulator (its own program, an HTTP server) beside the core
    {"engines"},
    {"preflight", "validation"},
    {"render", "importer"},
    {"adapters"},
    {"gates"},
    {"owner"},
    {"api"},
    {"daemon"},
    {"cli"},
)
FLOOR = {name: level for level, names in enumerate(FLOORS) for name in names}
PURE = {"config", "core", "engines", "preflight", "validation", "render", "importer"}
IO_LIBRARIES = {
    "asyncio", "httpx", "dbus_fast", "podman", "pynvml", "subprocess", "socket",
    "prometheus_client", "fastapi", "uvicorn", "os", "tempfile", "shutil",
}  # fmt: skip
# Reading the config file is validation/load.py's one job: the environment and the host name
# are read there and passed in (the model takes them from its validation context).
READS_THE_CONFIG = "laned.validation.load"
PATH_IO = {"open", "read_text", "read_bytes", "write_text", "write_bytes", "unlink", "mkdir",
           "exists", "is_file", "is_dir", "stat", "iterdir", "glob", "rglob", "touch"}  # fmt: skip
# What the API's modules may take from adapters: the proxy's transport to the engines (the hot
# path) and its reader of large bodies (a worker process, off the event loop), and the API's
# own token file read as laned starts or reloads (its settings).
API_ADAPTERS = {
    "laned.adapters.upstream", "laned.adapters.body_parser", "laned.adapters.secret_files",
}  # fmt: skip


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def folder(module: str) -> str:
    """`laned.core.policy` -> core; `laned.errors` -> errors; `laned` -> laned."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def imports(path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(laned modules, top-level outside packages) that `path` imports, TYPE_CHECKING too.
    `from laned.core import policy` imports laned.core.policy; `from laned import engines`
    imports laned.engines (the package's own module); `from laned.engines import VLLM`, the
    package's module too."""
    internal: set[str] = set()
    external: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] != "laned":
                    external.add(alias.name.split(".")[0])
                elif alias.name in known:
                    internal.add(alias.name)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.split(".")[0] != "laned":
                external.add(node.module.split(".")[0])
                continue
            for alias in node.names:
                named = f"{node.module}.{alias.name}"
                internal.add(named if named in known else node.module)
    return internal & known, external


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    found = modules()
    edges, outside = {}, {}
    for name, path in found.items():
        edges[name], outside[name] = imports(path, set(found))
        edges[name] -= {name, "laned"}  # `from laned import __version__`: the package's face
    return edges, outside


def closure(start: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def test_every_module_sits_on_a_floor() -> None:
    loose = {m for m in modules() if folder(m) not in {*FLOOR, "laned", "__main__"}}
    assert loose == set(), f"modules in no known folder (add the folder to FLOORS): {loose}"


def test_no_import_runs_back_up_a_floor() -> None:
    """A module imports only from its own folder and the floors below it (`python -m laned`,
    laned/__main__.py, stands above them all)."""
    edges, _ = graph()
    up = sorted(
        f"{module} -> {target}"
        for module, targets in edges.items()
        if folder(module) in FLOOR
        for target in targets
        if folder(target) != folder(module) and FLOOR[folder(target)] >= FLOOR[folder(module)]
    )
    assert up == [], "imports that run back up a floor (or across one):\n" + "\n".join(up)


WIRING = "laned.owner.wiring"  # builds the seam's protocols over the adapters
SEAM = PACKAGE / "owner" / "seam.py"
PROTOCOL_MEMBERS = 12


def test_only_the_wiring_of_the_owner_imports_an_adapter() -> None:
    """The owner's parts act on the host through the seam (laned.owner.seam): no module of the
    owner but its wiring imports laned.adapters (TYPE_CHECKING imports included), and none
    imports the wiring (laned serve, the tests and the benches build the seam with it)."""
    edges, _ = graph()
    found = sorted(
        f"{module} imports {target}"
        for module, targets in edges.items()
        if folder(module) == "owner" and module != WIRING
        for target in targets
        if folder(target) == "adapters" or target == WIRING
    )
    assert found == [], "\n".join(found)


def test_the_seams_protocols_are_small_and_each_member_says_what_it_does() -> None:
    """Every Protocol of owner/seam.py: at most PROTOCOL_MEMBERS members (methods and
    properties), each with a one-line docstring."""
    tree = ast.parse(SEAM.read_text())
    protocols = [
        node
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        and any(ast.unparse(base) in {"Protocol", "typing.Protocol"} for base in node.bases)
    ]
    assert protocols, "owner/seam.py defines no protocol"
    found = []
    for protocol in protocols:
        members = [
            node
            for node in protocol.body
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and not node.name.startswith("_")
        ]
        if len(members) > PROTOCOL_MEMBERS:
            found.append(f"{protocol.name}: {len(members)} members (at most {PROTOCOL_MEMBERS})")
        for member in members:
            doc = ast.get_docstring(member)
            if not doc or "\n" in doc:
                found.append(f"{protocol.name}.{member.name}: no one-line docstring")
    assert found == [], "\n".join(found)


def test_errors_imports_nothing_of_laned() -> None:
    edges, _ = graph()
    assert edges["laned.errors"] == set()


def test_the_pure_folders_reach_no_io_library() -> None:
    """No process, socket, file or environment access in the pure folders (PURE): config/, core/,
    engines/, preflight/, validation/, render/, importer/ (validation/load.py aside), through any
    module they import."""
    edges, outside = graph()
    for module in sorted(m for m in edges if folder(m) in PURE and m != READS_THE_CONFIG):
        reached = (closure(module, edges) | {module}) - {READS_THE_CONFIG}
        libraries = set().union(*(outside[m] for m in reached))
        assert not libraries & IO_LIBRARIES, f"{module} reaches {sorted(libraries & IO_LIBRARIES)}"


def test_the_pure_folders_open_no_file() -> None:
    """No `open()` and no pathlib reading or writing in the pure folders (validation/load.py reads
    the config file): rendering returns contents, laned.adapters.rendered writes them."""
    found = []
    for name, path in modules().items():
        if folder(name) not in PURE or name == READS_THE_CONFIG:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call):
                continue
            called = node.func
            if (isinstance(called, ast.Name) and called.id == "open") or (
                isinstance(called, ast.Attribute) and called.attr in PATH_IO
            ):
                found.append(f"{name}:{node.lineno}: {ast.unparse(called)}")
    assert found == [], "file I/O in a pure folder:\n" + "\n".join(found)


def test_the_front_and_the_api_reach_the_host_through_the_owner() -> None:
    """api/ reads the host through the supervisor's read methods (its seam), never an adapter
    of its own (API_ADAPTERS aside) nor the supervisor's seam or records."""
    edges, _ = graph()
    found = [
        f"{module} imports {target}"
        for module, targets in edges.items()
        if folder(module) == "api"
        for target in targets
        if folder(target) == "adapters" and target not in API_ADAPTERS
    ]
    for name, path in modules().items():
        if folder(name) == "api":
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in {"seam", "records"}:
                    found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    assert found == [], "\n".join(found)


def test_the_cli_asks_the_daemon_not_its_state_file_nor_systemd() -> None:
    """cli/ reads no state file; it talks to systemd only to install laned (cli/install.py)
    and to learn the manager's version for rendering (`installed_version`)."""
    found = []
    for name, path in modules().items():
        if folder(name) != "cli":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names = {alias.name for alias in node.names}
                if node.module == "laned.adapters.state" or (
                    node.module == "laned.adapters" and "state" in names
                ):
                    found.append(f"{name}:{node.lineno}: the state file")
                systemd = node.module == "laned.adapters.systemd" and name != "laned.cli.install"
                if systemd and names - {"installed_version"}:
                    found.append(f"{name}:{node.lineno}: systemd ({sorted(names)})")
    assert found == [], "\n".join(found)


def test_the_import_graph_has_no_loops_type_checking_included() -> None:
    edges, _ = graph()
    loops = sorted(m for m in edges if m in closure(m, edges))
    assert loops == [], f"modules that import themselves through others: {loops}"


def test_every_exception_is_in_the_error_tree_and_none_raises_the_bare_root() -> None:
    outside, bare = [], []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and name != "laned.errors":
                bases = {b.id for b in node.bases if isinstance(b, ast.Name)}
                if bases & EXCEPTION_BASES and not node.name.startswith("_"):
                    outside.append(f"{name}.{node.name}")
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                called = node.exc.func
                if isinstance(called, ast.Name) and called.id == "LanedError":
                    bare.append(f"{name}:{node.lineno}")
    assert outside == [], f"exceptions outside laned/errors.py: {outside}"
    assert bare == [], f"a bare LanedError raised (raise a class of the tree): {bare}"


EXCEPTION_BASES = {
    "Exception", "BaseException", "ValueError", "RuntimeError", "OSError", "ConnectionError",
    "TypeError", "KeyError", "LookupError", "LanedError",
}  # fmt: skip


def test_the_public_surface_listed_in_laned_resolves() -> None:
    import laned

    assert {name: getattr(laned, name) is not None for name in laned.__all__} == dict.fromkeys(
        laned.__all__, True
    )


def test_every_laned_error_is_in_the_drawn_tree_of_errors_py() -> None:
    tree = ast.parse((PACKAGE / "errors.py").read_text())
    drawn = ast.get_docstring(tree) or ""
    ours = {
        node.name
        for node in tree.body
        if isinstance(node, ast.ClassDef) and node.name not in {"Severity", "Finding"}
    }
    assert {name for name in ours if f" {name} " not in drawn} == set(), "classes not drawn"
    elsewhere = {
        f"{name}.{node.name}"
        for name, path in modules().items()
        if name != "laned.errors"
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        and any(isinstance(b, ast.Name) and b.id in ours for b in node.bases)
    }
    assert elsewhere == set(), f"LanedErrors defined outside errors.py: {elsewhere}"


def test_a_lanes_record_is_changed_by_the_machines_step_alone() -> None:
    """One writer (issue 55): a lane's record (LaneStatus) is frozen; a changed one is made
    by the lane machine's step alone (`dataclasses.replace` of a record in laned.core.machine
    only), and put in the owner's book by its interpreter alone (`Book.replace` is called
    from laned.owner.interpreter only); everyone else posts inputs and reads."""
    from laned.core.lanes import LaneStatus

    assert LaneStatus.__dataclass_params__.frozen  # type: ignore[attr-defined]
    made, put = [], []
    for name, path in modules().items():
        if folder(name) == "sim":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            called = ast.unparse(node.func)
            if called == "dataclasses.replace" and name != "laned.core.machine":
                first = ast.unparse(node.args[0]) if node.args else ""
                if any(word in first for word in ("lane", "status", "record")):
                    made.append(f"{name}:{node.lineno}: {first}")
            if called.endswith("book.replace") and name != "laned.owner.interpreter":
                put.append(f"{name}:{node.lineno}")
    assert made == [], f"a record made outside the step: {made}"
    assert put == [], f"a record put in the book outside the interpreter: {put}"


# --- engines behind their profiles ---------------------------------------------------------

# An engine's names, in a string of code: its program and module names (`vllm serve`,
# `sglang.launch_server`, `llama-server`, `llamacpp`) and its variables (VLLM_*, SGLANG_*,
# LLAMA_*). Case counts: "vLLM" and "SGLang" in a sentence are the engines' names for people,
# not a name the engine reads.
ENGINE_WORDS = re.compile(r"vllm|sglang|llama|\b(?:VLLM|SGLANG|LLAMA)_")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_.-]*[a-z0-9]")
# Flags that the engines' modules name but that are no one engine's: laned's own (`--config`,
# `laned status --fit`), other programs' (`systemctl --user`, podman's `--device`), and those
# every program takes (`--help`).
NOT_ENGINE_FLAGS = {"--config", "--fit", "--user", "--device", "--help", "--model"}
# Where an engine's name is data about a file, not knowledge the code acts on: `laned init`
# says what to edit in each of laned's example configs in the examples' own words (seed 000's
# lanes run vLLM, keyed by VLLM_API_KEY; seed 001's image is named for vLLM).
NAMES_ALLOWED = {"laned.cli.setup": {"VLLM_", "vllm"}}


def code_strings(path: Path) -> list[tuple[int, str]]:
    """The string constants of a module's code (docstrings left out), with their lines."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
    ]


def engine_flags() -> set[str]:
    """The flags laned/engines/ names in its code: each engine's own vocabulary."""
    return {
        flag
        for name, path in modules().items()
        if folder(name) == "engines"
        for _line, text in code_strings(path)
        for flag in FLAG.findall(text)
    } - NOT_ENGINE_FLAGS


def test_no_engine_is_named_outside_its_profile() -> None:
    """No engine's flag, variable or program name in a string of code outside laned/engines/
    (and the simulator, which plays the engines): config, validation, render, preflight,
    importer, adapters, the owner and the edges ask the lane's profile (laned.engines)."""
    flags = engine_flags()
    found = []
    for name, path in sorted(modules().items()):
        if folder(name) in {"engines", "sim"}:
            continue
        for line, text in code_strings(path):
            named = set(ENGINE_WORDS.findall(text)) | (set(FLAG.findall(text)) & flags)
            named = sorted(named - NAMES_ALLOWED.get(name, set()))
            if named:
                found.append(f"{name}:{line}: {', '.join(named)}: {text[:60]!r}")
    assert found == [], "engines named outside laned/engines/:\n" + "\n".join(found)


# `# fmt: skip` keeps the formatter off a table of data (one row a line, aligned); anywhere
# else the formatter's output is the code's form.
FMT_SKIPS = 10


def test_fmt_skip_only_on_tables_at_most_ten_outside_the_simulator() -> None:
    skips = [
        f"{name}:{number}"
        for name, path in sorted(modules().items())
        if folder(name) != "sim"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if "# fmt: skip" in line
    ]
    assert len(skips) <= FMT_SKIPS, f"{len(skips)} `# fmt: skip` (at most {FMT_SKIPS}): {skips}"
