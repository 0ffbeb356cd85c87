"""What laned must know of an engine, as one record (laned.engines.vllm is one).

A profile is data and pure functions: the flags laned adds to the engine's command, the
variable its API key reaches it by, its log lines and /metrics names, how it sleeps and wakes
(HTTP calls described, not made: laned.adapters.engine_api makes them), how its tokenizer
counts a prompt, and the findings a lane of this engine gets. Nothing here does I/O.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from laned.config.model import LaneConfig
from laned.config.sleep import LOOPBACK
from laned.core.facts import LaneFacts
from laned.core.phases import DYING, Seen
from laned.errors import Finding

Line = tuple[str | None, list[str]]  # (why, argv words on one line of the wrapper)


@dataclass(frozen=True)
class MetricNames:
    """The engine's /metrics samples laned reads, by laned's own names: each of `summed`
    adds up across the engine's processes and models (running, waiting, generation_tokens,
    prompt_tokens, steps); each of `fullest` is a usage of which the fullest counts (kv,
    then an older name of the same figure)."""

    summed: Mapping[str, str]
    fullest: Mapping[str, str]

    @property
    def prefixes(self) -> tuple[str, ...]:
        """The start of every line of a /metrics page that carries a sample laned reads."""
        return tuple(f"{name}{end}" for name in (*self.summed, *self.fullest) for end in ("{", " "))


@dataclass(frozen=True)
class Call:
    """One HTTP request to the engine: method, path, query and JSON body."""

    method: str
    path: str
    params: Mapping[str, Any] | None = None
    body: Mapping[str, Any] | None = None

    def __str__(self) -> str:
        return f"{self.method} {self.path}"


def as_asked(
    level: int,
    weights_gib: float | None,
    available_gib: float | None,
    pinned: bool,
    unified: bool = False,
) -> tuple[int, str]:
    """An engine that sleeps at the level asked, whatever the host's memory."""
    return level, ""


@dataclass(frozen=True)
class SleepApi:
    """How an engine sleeps and wakes (its process stays; its GPU memory goes).

    `sleep(level)` is the call that puts it to sleep (requests drained first), `wake` the
    call that wakes it, with `awake(answer)` judging the answer's JSON (None: the status
    alone says); `after_wake[level]`: the calls that make a wake at that level answer rightly;
    `is_sleeping` and `asleep(answer)`: the engine's own word on whether it sleeps (None:
    it has none, and laned's record decides); `level_in_metrics(page)`: the level its
    /metrics say it sleeps at. `missing`: the hint when the sleep routes answer 404;
    `unreleased`: the hint when a sleep released no GPU memory (the switch that gives the
    engine its sleep). `platforms`: where its sleep runs, for a host where laned sees no GPU.
    `level_now(level, weights_gib, available_gib, pinned, unified)`: the level it sleeps at
    on this host now, and why where that is not `level` (vLLM's level 1 pins the weights in
    host RAM: with too little, or on unified memory where host RAM is the GPU's, level 2);
    as asked by default. `across_nodes`: over several hosts, where the engine's own source
    has the head's sleep and wake reach every rank (laned then confirms each host's memory
    fell: docs/multinode.md); "" where it does not, and such a lane cannot sleep."""

    levels: tuple[int, ...]
    sleep: Callable[[int], Call]
    wake: Call
    awake: Callable[[Any], bool] | None
    after_wake: Mapping[int, tuple[Call, ...]]
    is_sleeping: Call | None
    asleep: Callable[[Any], bool]
    level_in_metrics: Callable[[str], int | None]
    missing: str
    unreleased: str = ""
    platforms: str = ""
    level_now: Callable[[int, float | None, float | None, bool, bool], tuple[int, str]] = as_asked
    across_nodes: str = ""  # where its source says a head's sleep reaches every rank ("": no)


@dataclass(frozen=True)
class Wire:
    """How laned asks a weight-cache daemon, over one of its sockets, what its rank holds:
    `ask`, the message as sent (framed); each answer is a `header` (a struct of one field,
    the length of the body, taken up to `largest`), then a body that `read` takes back as
    plain data only (ValueError for one it refuses); `held(answer)`: whether the rank
    answered, and the bytes it says it holds as they came (laned.engines.footprints.held_of
    judges them)."""

    ask: bytes
    header: struct.Struct
    largest: int
    read: Callable[[bytes], Any]
    held: Callable[[Any], tuple[bool, object]]


@dataclass(frozen=True)
class WeightCacheApi:
    """How an engine keeps its weights in a daemon of its own across engine restarts (vLLM's
    `vllm preload`; docs/weight-cache.md).

    `command(words)`: the daemon's command from the engine's (None: the engine's command has
    no form the daemon takes); `flags(words)`: for each of the engine's words after its
    command, whether the daemon gets it (those that shape the weights: a change to the others
    restarts the engine alone); `engine_lines(spec,
    base, sockets)`: what the engine gets to map the daemon's weights; `daemon_lines(spec,
    base, sockets)`: the daemon's own flags (its socket directory, ports); `missed`: the
    note its log lines give when the engine fell back to reading the weights from disk (the
    start is then a cold one); `env(name, value)`: the daemon's own value of one of the lane's
    variables and why, where it must differ from the engine's; `socket_glob`: the daemon's sockets in their directory (one per
    GPU); `findings(spec, base)`: what is wrong with a lane that keeps its weights, seen
    without running it; `preflight(lane, spec, facts)`: what is, on this host;
    `sockets(lane, spec, runtime_dir)`: its sockets' paths that AF_UNIX cannot take, with
    the user's runtime directory `runtime_dir`.

    `daemon`: its command in words (messages, its unit's description), its own flags after
    `subcommand`; `since`: the engine's first release that has it; `mark`: the flag and value
    by which an engine's command maps its weights (`laned import` reads a recipe's);
    `engine_flags`: the flags laned gives the engine for it (`engine_lines`'), which the
    daemon never gets and a lane's args must not give; `socket_name`: its longest socket's
    name, `socket_name_max` bytes; `wire`: how laned asks it what it holds."""

    command: Callable[[Sequence[str]], list[str] | None]
    flags: Callable[[Sequence[str]], list[bool]]
    engine_lines: Callable[[LaneConfig, str, str], list[Line]]
    daemon_lines: Callable[[LaneConfig, str, str], list[Line]]
    missed: str
    env: Callable[[str, str], tuple[str, str] | None]
    socket_glob: str
    findings: Callable[[LaneConfig, str], list[Finding]]
    preflight: Callable[[str, LaneConfig, LaneFacts], list[Finding]]
    sockets: Callable[[str, LaneConfig, str], list[Finding]]
    daemon: str
    subcommand: str
    since: str
    mark: tuple[str, str]
    engine_flags: tuple[str, ...]
    socket_name: str
    socket_name_max: int
    wire: Wire


@dataclass(frozen=True)
class FlagProbe:
    """How `laned validate --engine-flags` reads the option strings the engine accepts.

    `script`: Python its interpreter (or image) runs, printing {"version", "flags",
    "abbrev"} as JSON on its last line; else its program runs with `help` and
    `read_help(text)` reads (version, flags) from what it prints. `program`: the command
    word that is the engine (`vllm`, `sglang`, `llama-server`; a Python before `-m` runs a
    script engine). `loose`: the engine reads `--a_b` as `--a-b`, `--a.b` as a key of `--a`
    and `-O3` as `--optimization-level 3` (vLLM's FlexibleArgumentParser). `env`: variables
    that keep the probe quiet, the engine's own (vLLM's usage report)."""

    program: str
    script: str | None = None
    help: tuple[str, ...] = ("--help",)
    read_help: Callable[[str], tuple[str, frozenset[str]]] | None = None
    loose: bool = False
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Tokenizer:
    """How the engine's tokenizer counts a prompt without generating: `call(messages,
    prompt)` is the request (None where it cannot count that kind), `count(answer)` reads
    the number from the answer's JSON. `template(messages)`, where `call` takes no chat
    messages: the request that renders them into the prompt the engine would run (its chat
    template), `templated(answer)` that prompt, which is then counted."""

    call: Callable[[list[dict[str, Any]] | None, str | None], Call | None]
    count: Callable[[Any], int]
    template: Callable[[list[dict[str, Any]]], Call] | None = None
    templated: Callable[[Any], str] = str


@dataclass(frozen=True)
class SecretFlag:
    """An engine flag whose value is a secret, as the engine's own parser reads it.

    `names`: its option strings, long first. `env`: the name its value goes by in the lane's
    secrets file instead: the variable the engine reads (llama.cpp's HF_TOKEN for -hft), or
    laned's own where laned hands it over another way (SGLang's SGLANG_API_KEY, in a key file);
    None where laned has no way to hand it over, and `instead` says what to do. `shortest`:
    the shortest abbreviation its parser takes for it (argparse's allow_abbrev: a prefix no
    other flag shares), None where it takes none. `nargs`: the words it takes: "1"; "+" each
    word up to the next flag (vLLM's --api-key takes several keys); "?" one or none (vLLM's
    --hf-token alone reads the token `hf auth login` stored: no secret in argv). Each engine's
    module cites its parser's source beside each."""

    names: tuple[str, ...]
    env: str | None
    shortest: str | None = None
    nargs: str = "1"
    instead: str = ""

    @property
    def flag(self) -> str:
        """Its name in messages: its long option string."""
        return self.names[0]


def words(text: str) -> frozenset[str]:
    """A set of names (flags, methods) written as a block of words, a table as people read
    one: the formatter keeps a string as it is written."""
    return frozenset(text.split())


def secret_flag(flags: Sequence[SecretFlag], word: str) -> SecretFlag | None:
    """The flag of `flags` that the argv word `word` gives, in any spelling its engine's parser
    takes: its option strings, an abbreviation where the parser takes one (`--api-k`), `_` for
    `-` (`--api_key`: vLLM's FlexibleArgumentParser, llama.cpp's parser), `--flag=VALUE`. The
    last two are taken for every engine: a spelling the engine refuses still puts the value in
    argv until it exits. None when it gives none."""
    name = word
    if word.startswith("--"):
        name = "--" + word[2:].split("=", 1)[0].replace("_", "-")
    for flag in flags:
        if name in flag.names:
            return flag
        if flag.shortest and name.startswith(flag.shortest) and flag.flag.startswith(name):
            return flag
    return None


def secret_words(
    flags: Sequence[SecretFlag], words: Sequence[str]
) -> list[tuple[int, SecretFlag, list[int]]]:
    """Each secret flag in an engine's argv `words`: (its index, the flag, the indices of the
    words that hold its value: its own for `--flag=VALUE`, else the next word (one that starts
    with `--` is a flag, not a value), or for nargs "+" each next word up to one that starts
    with `-`). A flag that takes no value there (vLLM's --hf-token alone) is left out."""
    out: list[tuple[int, SecretFlag, list[int]]] = []
    i = 0
    while i < len(words):
        flag = secret_flag(flags, words[i])
        if flag is None:
            i += 1
            continue
        if words[i].startswith("--") and "=" in words[i]:
            out.append((i, flag, [i]))
            i += 1
            continue
        end = i + 1
        if flag.nargs == "1":
            if end < len(words) and not words[end].startswith("--"):
                end += 1
        else:
            while end < len(words) and not words[end].startswith("-"):
                end += 1
                if flag.nargs == "?":
                    break
        if end > i + 1:
            out.append((i, flag, list(range(i + 1, end))))
        i = end
    return out


@dataclass(frozen=True)
class Model:
    """The model an engine's command names, as the engine's own parser reads it: `source`,
    the path, hub repository or URL it loads; `served`, the name its /v1/models lists when
    the command gives no served-name flag; `how`, where that name comes from (for
    `laned import`'s note)."""

    source: str
    served: str
    how: str


@dataclass(frozen=True)
class Gpus:
    """The GPUs one host gives an engine, by the engine's own arithmetic over its flags:
    `count`, None where it takes every GPU it sees (llama-server's default); `how`, that
    arithmetic in words (for `laned import`'s note)."""

    count: int | None
    how: str


PYTHON = re.compile(r"^(?:.*/)?python[0-9.]*$")


def program_words(words: Sequence[str]) -> list[str]:
    """The words of a command before its first option: the program and its subcommands and
    positionals, a Python interpreter's own options and `-m MODULE` counted as the program
    (`python3 -u -m vllm.entrypoints.cli.main serve M` -> all but nothing after M)."""
    words = list(words)
    start = 0
    if words and PYTHON.match(words[0]):
        start = 1
        while start < len(words) and words[start].startswith("-"):
            if words[start] == "-m":
                start += 2
                break
            start += 1
    rest = words[start:]
    end = next((i for i, w in enumerate(rest) if w.startswith("-")), len(rest))
    return words[: start + end]


def last_given(
    words: Sequence[str], names: Sequence[str], *, equals: bool = True, underscores: bool = False
) -> tuple[str, str] | None:
    """(the option string as given, its value) of the last of `names` in `words` (argparse
    and llama.cpp's parser both keep the last): `NAME VALUE`, and with `equals` `NAME=VALUE`
    (argparse's; llama.cpp's parser takes none); with `underscores`, a word that starts with
    `--` is read with `_` as `-` (vLLM's FlexibleArgumentParser, llama.cpp's parser)."""
    found = None
    for i, word in enumerate(words):
        name, eq, value = word.partition("=") if equals else (word, "", "")
        if underscores and name.startswith("--"):
            name = name.replace("_", "-")
        if name not in names:
            continue
        if eq:
            found = (name, value)
        elif i + 1 < len(words):
            found = (name, words[i + 1])
    return found


def last_value(
    words: Sequence[str], names: Sequence[str], *, equals: bool = True, underscores: bool = False
) -> str | None:
    """The value of the last of `names` in `words`, read as `last_given` reads it."""
    given = last_given(words, names, equals=equals, underscores=underscores)
    return None if given is None else given[1]


def given(words: Sequence[str], names: Sequence[str], *, underscores: bool = False) -> bool:
    """Whether a switch (a flag that takes no value) among `names` is in `words`."""
    if underscores:
        words = [w.replace("_", "-") if w.startswith("--") else w for w in words]
    return any(word in names for word in words)


def size(text: str | None, default: int = 1) -> int:
    """A parallel size as its parser reads it (an int); `default` where none is given or it
    is no positive number (a placeholder laned import leaves as written, or a size the
    engine refuses)."""
    return int(text) if text is not None and text.isdigit() and int(text) > 0 else default


def port_line(spec: LaneConfig, base: str) -> Line:
    """`--port N`, which every engine laned knows takes as its port flag."""
    return (
        f"set by laned from {base}.port: laned probes the same port",
        ["--port", str(spec.port)],
    )


def served_line(spec: LaneConfig, base: str, flag: str, more: str = "") -> Line:
    """The engine's flag for the name /v1/models lists (`--served-model-name`, `--alias`)."""
    why = f"set by laned from {base}.served_model_name: readiness checks /v1/models for it"
    return (why + more, [flag, spec.served_model_name])


def json_sampling_line(spec: LaneConfig, why: str, flag: str) -> list[Line]:
    """The lane's sampling defaults as one flag with a JSON value (vLLM's
    --override-generation-config, SGLang's --preferred-sampling-params); none without them."""
    if spec.sampling is None:
        return []
    sampling = json.dumps(spec.sampling.as_json_dict(), separators=(",", ":"))
    return [(why, [flag, sampling])]


def openai_tokenize(messages: list[dict[str, Any]] | None, prompt: str | None) -> Call:
    """POST /tokenize of vLLM's shape (a prompt, or chat messages with the template), which
    SGLang serves too; it answers `count`."""
    body = {"messages": messages} if messages is not None else {"prompt": prompt}
    return Call("POST", "/tokenize", body=body)


def max_model_len(entry: Mapping[str, Any]) -> int | None:
    """The window /v1/models lists for a model as vLLM and SGLang do: `max_model_len`."""
    value = entry.get("max_model_len")
    return int(value) if isinstance(value, (int, float)) and value > 0 else None


def no_findings(spec: LaneConfig, base: str) -> list[Finding]:
    """A profile with no rules of its own for a lane."""
    return []


def no_env(spec: LaneConfig) -> list[tuple[str, str, str]]:
    """A profile that sets no variable of laned's."""
    return []


def no_preflight(lane: str, spec: LaneConfig, facts: LaneFacts) -> list[Finding]:
    """A profile with no preflight rules of its own."""
    return []


def as_given(values: Sequence[str]) -> list[str]:
    """Served names as the flag's values give them, in order (vLLM's, SGLang's)."""
    return list(values)


Share = tuple[float | None, str]  # (the part of each GPU's memory it takes, where that is said)


def no_share(spec: LaneConfig) -> Share:
    """An engine whose share of a GPU laned cannot read from its flags."""
    return None, "its engine's share of a GPU is not read from its flags"


@dataclass(frozen=True)
class HealthRule:
    """What the engine's health answer says of it once it serves. laned judges liveness only
    then — never while the engine starts, wakes or sleeps, when engines answer 503 while they
    load — so a status in `dead` means the engine will serve no more, whatever follows: laned
    restarts it at once instead of counting probe failures. `why`: what the engine means by
    it (for the reason); `dying`: its log lines that say so, on which laned probes at once
    rather than at the next probe.interval. An engine whose health never says it is dead
    (llama-server's answers 503 only while it loads) has `dead` empty: its death is its exit."""

    dead: frozenset[int] = frozenset()
    why: str = ""
    dying: re.Pattern[str] | None = None

    def says_dead(self, status: int | None) -> bool:
        """Whether the health answer `status` (None: no answer) means the engine is dead."""
        return status is not None and status in self.dead


@dataclass(frozen=True)
class Caches:
    """What the engine compiles (or fetches) at a cold start and keeps across `--rm`
    containers once pointed into the lane's cache directory: each variable with its path
    inside the container (under laned.config.names.CACHE_MOUNT), and why, for the wrapper's
    comment."""

    env: Mapping[str, str]
    why: str


@dataclass(frozen=True)
class Nodes:
    """How the engine runs one model over several hosts: `count`, its flag for how many
    (--nnodes); `worker`, its switch for a rank that serves no API, only its share of the
    model (vLLM's --headless; "" where it has none), and why, for that rank's args."""

    count: str
    worker: str = ""
    why: str = ""


def bound_host(spec: LaneConfig) -> str:
    """The address the engine binds, for preflight's look at its port: its --host (every
    engine laned knows takes it), else loopback for a lane that sleeps (laned renders it so:
    laned.config.sleep), else the wildcard, where a listener on any address is found."""
    host = spec.engine_arg("--host")
    if host is None:
        return LOOPBACK if spec.sleep_level else "0.0.0.0"
    return host


def no_generation_config(spec: LaneConfig) -> str | None:
    """An engine that takes its sampling defaults from no flag of its own."""
    return None


def no_shutdown(spec: LaneConfig) -> float | None:
    """An engine whose flags set no graceful shutdown."""
    return None


def may_pin(spec: LaneConfig) -> tuple[str, str] | None:
    """An engine that may pin host memory (--cap-add IPC_LOCK may serve it)."""
    return None


@dataclass(frozen=True)
class EngineProfile:
    """One engine.

    - `name` (the config's `engine`), `title` (its name in messages);
    - `recognises(words)`: whether a lane's command or image words name this engine;
    - `api_key_env`: the name laned reads the lane's API key by in its secrets file, and
      that reaches the engine by name (never argv). `key_file`: (flag, key) where the engine
      reads no variable for its key: the wrapper writes it into a 0600 YAML file of the
      engine's own config format (`key: "..."`), named by `flag`;
    - `serve_lines(spec, base)`: the flags laned adds (the port, the served model name, the
      sampling defaults, what sleep and /metrics need), each with its reason; `env(spec)`:
      the variables laned sets for it, (name, value, why);
    - `metrics`, `read_line`: its /metrics names and what its log lines say of a start;
    - `sleep`: how it sleeps (None: it cannot, and a swap stops it); `sleep_note`: why it
      sleeps at those levels only, or not at all;
    - `tokenizer`: how the gates count a prompt in its tokens (None: estimated);
    - `model_of(words, env)`: the model its command and args (and, where the engine reads
      them, the container's variables) name, and the name it serves it by, as its parser
      reads them (None: none named);
    - `served_names(values)`: the names its served-name flags' values give, the one
      /v1/models lists as the id first;
    - `gpus_of(words, env)`: the GPUs one host gives it, by its own arithmetic;
    - `preflight(lane, spec, facts)`: its own findings before a start, over the host's facts;
    - `default_port`: the port it listens on without --port;
    - `flag_probe`: how its own parser's flags are read (`laned validate --engine-flags`);
    - `window(entry)`: the context window a request may fill, from its /v1/models entry;
    - `owned`: the engine's flags that laned sets from a config key (flag: key), which a
      lane's args must not give;
    - `findings(spec, base)`: what is wrong with a lane of this engine that laned can see
      without running it;
    - `weight_cache`: how its weights outlive its restarts in a daemon (None: they cannot);
    - `gpu_share(spec)`: the part of each of its GPUs' memory the engine takes by its own
      rule, and the flag or source that says so (None: not known from its flags; laned's
      placement then counts `needs.gpu_memory_gib`, else the whole GPU: docs/placement.md);
      a part is of each GPU's whole memory, and the engine refuses to start unless that much
      is free (vLLM's rule);
    - `share_flag`: the flag that sets that part, named in hints;
    - `caches`: where a container lane's engine keeps what it compiles at a cold start, in
      the lane's persistent cache directory (None: nothing);
    - `secret_flags`: its flags whose value is a secret (SecretFlag), each with the name it
      goes by in the lane's secrets file instead;
    - `health`: which of its health answers mean it is dead once it serves, and its log lines
      that announce it (HealthRule);
    - `nodes`: how it runs over several hosts (None: on one only, as laned knows it);
    - `host(spec)`: the address it binds;
    - `generation_config(spec)`: where the lane's own flags take its sampling defaults from
      (vLLM's --generation-config: `auto`, `vllm` or a directory), None where they say nothing;
    - `shutdown(spec)`: the seconds its graceful shutdown takes by its flags (None: not set);
    - `pins_nothing(spec)`: (what, why) where the lane's engine pins no host memory, so that
      --cap-add IPC_LOCK serves nothing (vLLM's engram-disk mode without KV offloading);
    - `gate_hints`: what to check where an acceptance gate fails (`reasoning`, `tools`): the
      flags that make its answers carry reasoning apart and tool calls;
    - `launch`: its launch line as `laned import` reads it, for a hint.
    """

    name: str
    title: str
    recognises: Callable[[Sequence[str]], bool]
    api_key_env: str
    metrics: MetricNames
    read_line: Callable[[str], Seen | None]
    serve_lines: Callable[[LaneConfig, str], list[Line]]
    sleep: SleepApi | None
    sleep_note: str
    tokenizer: Tokenizer | None
    model_of: Callable[[Sequence[str], Mapping[str, str]], Model | None]
    gpus_of: Callable[[Sequence[str], Mapping[str, str]], Gpus]
    owned: Mapping[str, str]
    default_port: int
    flag_probe: FlagProbe
    served_names: Callable[[Sequence[str]], list[str]] = as_given
    preflight: Callable[[str, LaneConfig, LaneFacts], list[Finding]] = no_preflight
    window: Callable[[Mapping[str, Any]], int | None] = max_model_len

    def read_log(self, line: str) -> Seen | None:
        """What one line of the engine's log says: that it is dying (`health.dying`), or a
        start's phase or note (`read_line`)."""
        dying = self.health.dying
        if dying is not None and dying.search(line):
            return Seen(None, note=DYING)
        return self.read_line(line)

    def flags_for(self, key: str) -> tuple[str, ...]:
        """The engine's flags that laned sets from config key `key` (port, served_model_name)."""
        return tuple(flag for flag, owner in self.owned.items() if owner == key)

    env: Callable[[LaneConfig], list[tuple[str, str, str]]] = no_env
    findings: Callable[[LaneConfig, str], list[Finding]] = no_findings
    key_file: tuple[str, str] | None = None
    weight_cache: WeightCacheApi | None = None
    gpu_share: Callable[[LaneConfig], Share] = no_share
    share_flag: str = ""
    caches: Caches | None = None
    secret_flags: tuple[SecretFlag, ...] = ()
    health: HealthRule = HealthRule()
    nodes: Nodes | None = None
    host: Callable[[LaneConfig], str] = bound_host
    generation_config: Callable[[LaneConfig], str | None] = no_generation_config
    shutdown: Callable[[LaneConfig], float | None] = no_shutdown
    pins_nothing: Callable[[LaneConfig], tuple[str, str] | None] = may_pin
    gate_hints: Mapping[str, str] = field(default_factory=dict)
    launch: str = ""

    @property
    def unreleased(self) -> str:
        """The hint where its sleep released no GPU memory (SleepApi.unreleased)."""
        return "" if self.sleep is None else self.sleep.unreleased
