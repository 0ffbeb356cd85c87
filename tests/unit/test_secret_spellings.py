"""Secrets in every spelling the programs that read them accept: podman's options as pflag
reads them, each engine's flags as its own parser reads them, an `env NAME=VALUE` head, and
tokens by their shapes anywhere. `laned validate` refuses each at its key path and `laned
import` moves each to the lane's secrets file (or refuses it), never saying its value; the
configs and recipes laned ships still validate and import."""

from __future__ import annotations

import json
import shlex
import textwrap

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from laned import engines
from laned.config.command import env_assignments
from laned.config.podman_options import read_options
from laned.config.secrecy import token_kind
from laned.engines.profile import SecretFlag, secret_words
from laned.errors import BadImport, ConfigError, Severity
from laned.importer.cmdline import split
from laned.importer.toml_out import render_import
from laned.importer.translate import import_run
from laned.validation.load import load_config, parse_config
from tests.helpers import ROOT

ENV = {"HOME": "/home/op"}
HEAD = '[lanes.a]\nport = 8001\nserved_model_name = "m"\n'
EXEC = '[lanes.a.exec]\ncommand = ["vllm", "serve", "/m"]\n'
SECRET_NAMES = ["HF_TOKEN", "VLLM_API_KEY", "MY_SERVICE_TOKEN", "DB_PASSWORD", "AWS_ACCESS_KEY_ID"]
# Values never shaped like a token (the flag or name says it is a secret), and tokens of each
# well-known shape (found by their shape alone).
PLAIN = st.text("0123456789abcdef", min_size=8, max_size=12).map(lambda h: f"S3CRET{h}")
TOKENS = st.one_of(
    st.text("ABCdef0123", min_size=34, max_size=40).map(lambda b: "hf_" + b),
    st.text("ABCdef0123", min_size=20, max_size=30).map(lambda b: f"sk-proj-Q7{b}9zZ8yY7xX6wW5vV"),
    st.text("ABCDEFGHJ0123456789", min_size=16, max_size=16).map(lambda b: "AKIA" + b),
    st.text("ABCdef0123", min_size=36, max_size=40).map(lambda b: "ghp_" + b),
)


def refused(lane: str) -> list[tuple[str, str]]:
    """(key path, rendered problem) of each error `laned validate` gives the lane."""
    with pytest.raises(ConfigError) as info:
        parse_config(HEAD + lane, "t.toml", ENV)
    return [(p.where, p.render()) for p in info.value.problems if p.severity is Severity.ERROR]


def container(podman_args: list[str]) -> str:
    return (
        f'gpus = []\n[lanes.a.container]\nimage = "img"\npodman_args = {json.dumps(podman_args)}\n'
    )


# podman's reader, against what podman 4.3.1 did with each spelling here (`podman create`, then
# `podman inspect` of Config.Env and Config.Labels).
@pytest.mark.parametrize(
    ("words", "read"),
    [
        (["-ieHF_TOKEN=x"], [("--interactive", None), ("--env", "HF_TOKEN=x")]),
        (["-teHF_TOKEN=x"], [("--tty", None), ("--env", "HF_TOKEN=x")]),
        (["-qitPeHF_TOKEN=x"], [("--quiet", None), ("--interactive", None), ("--tty", None),
                                ("--publish-all", None), ("--env", "HF_TOKEN=x")]),
        (["-e=HF_TOKEN=x"], [("--env", "HF_TOKEN=x")]),
        (["-ie=HF_TOKEN=x"], [("--interactive", None), ("--env", "HF_TOKEN=x")]),
        (["-ei=HF_TOKEN=x"], [("--env", "i=HF_TOKEN=x")]),
        (["-lHF_TOKEN=x"], [("--label", "HF_TOKEN=x")]),
        (["-i=true", "-eHF_TOKEN=x"], [("--interactive", "true"), ("--env", "HF_TOKEN=x")]),
        (["--interactive=false", "--env", "HF_TOKEN=x"],
         [("--interactive", "false"), ("--env", "HF_TOKEN=x")]),
        (["--env-merge", "HF_TOKEN=x"], [("--env-merge", "HF_TOKEN=x")]),
        (["-ie", "HF_TOKEN=x"], [("--interactive", None), ("--env", "HF_TOKEN=x")]),
        (["--env", "-x"], [("--env", "-x")]),  # the next word, whatever it is
        (["--net", "host", "--rm"], [("--network", "host"), ("--rm", None)]),
        (["-p8000:8000", "-v", "/a:/b"], [("--publish", "8000:8000"), ("--volume", "/a:/b")]),
    ],
)  # fmt: skip
def test_podman_options_are_read_as_podman_reads_them(
    words: list[str], read: list[tuple[str, str | None]]
) -> None:
    options, end = read_options(words)
    assert [(o.name, o.value) for o in options] == read
    assert end == len(words)


def test_podman_run_reads_no_option_after_the_image() -> None:
    options, end = read_options(["-it", "--rm", "img", "-e", "X=1"], interspersed=False)
    assert [o.name for o in options] == ["--interactive", "--tty", "--rm"] and end == 2
    assert read_options(["--", "-img"], interspersed=False)[1] == 1


@pytest.mark.parametrize(
    ("words", "found"),
    [
        (["env", "VLLM_API_KEY=k", "vllm"], [(1, "VLLM_API_KEY", "k")]),
        (["/usr/bin/env", "-i", "-u", "X", "A=1", "B=2", "vllm", "C=3"], [(4, "A", "1"), (5, "B", "2")]),
        (["taskset", "-c", "0", "env", "-uX", "--", "A=1", "vllm"], [(6, "A", "1")]),
        (["env", "-S", "-i A='1 2' vllm serve"], [(2, "A", "1 2")]),
        (["env", "--split-string=A=1 vllm"], [(1, "A", "1")]),
        (["env", "--unset", "Q", "-", "A=1", "nice", "env", "B=2", "vllm"], [(4, "A", "1"), (7, "B", "2")]),
        (["vllm", "serve", "A=1"], []),
    ],
)  # fmt: skip
def test_env_heads_are_read_as_gnu_env_reads_them(
    words: list[str], found: list[tuple[int, str, str]]
) -> None:
    assert env_assignments(words) == found


ENGINE_SPELLINGS = {
    "vllm": (
        ["--api-key k", "--api_key=k", "--api-k k", "--api-ke=k", "--api-key k1 k2",
         "--hf_token k", "--hf-t=k", "--hf-token k"],
        ["--api-server-count 2", "--hf-overrides {}", "--hf-token", "--hf k", "--hf-token --x"],
    ),
    "sglang": (
        ["--api-key k", "--ap k", "--admin-api-key k", "--ad=k", "--ssl-keyfile-password k",
         "--ssl-keyfile-p k"],
        ["--ssl-keyfile /k.pem", "--a k", "--attention-backend fa3"],
    ),
    "llamacpp": (
        ["-hft k", "--hf-token k", "--hf_token k", "--api-key k", "--api_key k"],
        ["--api-key-file /k", "-hf org/repo", "--hf-repo org/repo"],
    ),
}  # fmt: skip


@pytest.mark.parametrize("engine", sorted(ENGINE_SPELLINGS))
def test_each_engine_reads_its_secret_flags_as_its_parser_does(engine: str) -> None:
    profile = engines.ENGINES[engine]
    secret, harmless = ENGINE_SPELLINGS[engine]
    for spelling in secret:
        words = spelling.split()
        found = secret_words(profile.secret_flags, ["serve", *words, "--port", "1"])
        held = [1] if "=" in words[0] else [i + 1 for i, w in enumerate(words) if w[0] == "k"]
        assert [(at, values) for at, _, values in found] == [(1, held)], spelling
    for spelling in harmless:
        assert secret_words(profile.secret_flags, spelling.split()) == [], spelling


@pytest.mark.parametrize(
    "text",
    ["hf_SENTINELnotarealtoken0123456789", "sk-SENTINELnotarealkey0123456789",
     "sk-proj-Ab12Cd34Ef56Gh78Ij90Kl", "sk-ant-api03-AbCdEf0123456789ghIJkl", "AKIAIOSFODNN7EXAMPLE",
     "ghp_aB3dE5gH7jK9mN1pQ3sT5vW7yZ9bC1dE3fG5", "x=hf_abcdefghijklmnopqrstuvwxyz0123456",
     "/secrets/ASIAABCDEFGHIJKLMNOP/x"],
)  # fmt: skip
def test_tokens_are_known_by_their_shape(text: str) -> None:
    assert token_kind(text) is not None


HARMLESS = [
    "sk-llama-3-8b-instruct-v2", "/models/sk-multilingual-instructionfinetune", "fp8_e4m3",
    "meta-llama/Llama-3.1-8B-Instruct", "task-abcdefghijklmnopqrstuvwxyz0123456789",
    "hf_overrides_and_more_than_thirty_chars", "AKIAABCDEFGHIJKLMNOPQ", "ghp_short",
    "sk-SENTINEL-sglang", '{"max_tokens": 4096, "temperature": 0.6}', "disk-0123456789abcdefghij",
    "/home/op/.cache/huggingface/hub/models--org--m/snapshots/0123456789abcdef0123456789abcdef01234567",
]  # fmt: skip


@pytest.mark.parametrize("text", HARMLESS)
def test_ordinary_values_are_no_token(text: str) -> None:
    assert token_kind(text) is None


@pytest.mark.parametrize(
    "path",
    sorted(
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("config/*.toml"), *ROOT.glob("laned/examples/*.toml")]
    ),
)
def test_the_shipped_configs_have_no_false_positive(path: str) -> None:
    config = load_config(str(ROOT / path), ENV)  # raises on an error
    assert not [w for w in config.warnings if "secret" in w.message], config.warnings


# --- the config, generated spellings ---------------------------------------------------------

BOOLS = "idtPq"


@st.composite
def podman_spellings(draw: st.DrawFn) -> tuple[list[str], str, str]:
    """(podman_args, the secret's name, its value): `-e` in a cluster of bools, with its value attached,
    after `=` or in the next word; `--env`/`--env-merge` with `=` or a word; a token under a
    harmless name."""
    name = draw(st.sampled_from(SECRET_NAMES))
    value = draw(PLAIN)
    if draw(st.booleans()):
        name, value = "MODEL_REVISION", draw(TOKENS)
    pair = f"{name}={value}"
    bools = "".join(draw(st.lists(st.sampled_from(BOOLS), max_size=4)))
    kind = draw(st.sampled_from(["attached", "equals", "word", "long=", "long", "merge"]))
    words = {
        "attached": [f"-{bools}e{pair}"],
        "equals": [f"-{bools}e={pair}"],
        "word": [f"-{bools}e", pair],
        "long=": [f"--env={pair}"],
        "long": ["--env", pair],
        "merge": draw(st.sampled_from([["--env-merge", pair], [f"--env-merge={pair}"]])),
    }[kind]
    before = draw(st.lists(st.sampled_from([["--cap-add", "SYS_NICE"], ["-it"], ["--rm=false"]])))
    return [w for ws in before for w in ws] + words, name, value


@settings(max_examples=60, deadline=None)
@given(podman_spellings())
def test_validate_refuses_every_podman_spelling_of_a_secret(
    case: tuple[list[str], str, str],
) -> None:
    args, _, value = case
    found = refused(container(args))
    assert any(where == "lanes.a.container.podman_args" for where, _ in found), found
    assert not any(value in text for _, text in found)


def engine_spelling(draw: st.DrawFn, flag: SecretFlag) -> list[str]:
    """One spelling of `flag` its engine's parser reads (or, `_` and `=`, that still puts the
    value in argv), with a value."""
    value = draw(PLAIN)
    name = draw(st.sampled_from(flag.names))
    if name.startswith("--"):
        if flag.shortest:
            name = name[: draw(st.integers(len(flag.shortest), len(name)))]
        name = "--" + "".join(
            "_" if c == "-" and draw(st.booleans()) else c for c in name[2:]
        )  # fmt: skip
        if draw(st.booleans()):
            return [f"{name}={value}"]
    return [name, value]


@st.composite
def engine_flag_cases(draw: st.DrawFn) -> tuple[str, list[str], str]:
    """(engine, argv words with one secret flag, the value)."""
    engine = draw(st.sampled_from(sorted(engines.ENGINES)))
    flag = draw(st.sampled_from(engines.ENGINES[engine].secret_flags))
    words = engine_spelling(draw, flag)
    return engine, words, words[-1].split("=", 1)[-1]


@settings(max_examples=80, deadline=None)
@given(engine_flag_cases(), st.booleans())
def test_validate_refuses_every_engine_spelling_of_a_secret_flag(
    case: tuple[str, list[str], str], in_command: bool
) -> None:
    engine, words, value = case
    command = ["/opt/bin/server", "--threads", "4"]
    if in_command:
        lane = f'engine = "{engine}"\n[lanes.a.exec]\ncommand = {json.dumps(command + words)}\n'
        where = f"lanes.a.exec.command[{len(command)}]"
    else:
        lane = (
            f'engine = "{engine}"\nargs = {json.dumps(["--x", *words])}\n[lanes.a.exec]\n'
            f"command = {json.dumps(command)}\n"
        )
        where = "lanes.a.args[1]"
    found = refused(lane)
    assert any(w == where and "puts a secret in the engine's argv" in t for w, t in found), found
    assert not any(value in text for _, text in found)
    profile = engines.ENGINES[engine]
    flag = next(f for f in profile.secret_flags if secret_words([f], words))
    # The hint names what the engine reads instead, or what to do where it reads nothing.
    assert any((flag.env or flag.instead) in text for _, text in found), found


ENV_OPTIONS = [["-i"], ["-"], ["-u", "X"], ["-uX"], ["--unset=X"], ["-C", "/tmp"], ["-v"]]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["env", "/usr/bin/env"]),
    st.lists(st.sampled_from(ENV_OPTIONS), max_size=3),
    st.lists(st.sampled_from(["A=1", "NCCL_DEBUG=INFO"]), max_size=2),
    st.sampled_from(SECRET_NAMES),
    st.one_of(PLAIN, TOKENS),
    st.sampled_from(["exec", "container", "prepare"]),
)
def test_validate_refuses_a_secret_set_by_an_env_head(
    env: str,
    options: list[list[str]],
    plain: list[str],
    name: str,
    value: str,
    where: str,
) -> None:
    head = [env, *(w for o in options for w in o), *plain]
    command = [*head, f"{name}={value}", "vllm", "serve", "/m"]
    lane = {
        "exec": f"[lanes.a.exec]\ncommand = {json.dumps(command)}\n",
        "container": f'gpus = []\n[lanes.a.container]\nimage = "img"\n'
        f"command = {json.dumps(command)}\n",
        "prepare": f"prepare = [{json.dumps(command)}]\n" + EXEC,
    }[where]
    key = {
        "exec": "exec.command",
        "container": "container.command",
        "prepare": "prepare[0].command",
    }
    found = refused(lane)
    assert any(w == f"lanes.a.{key[where]}[{len(head)}]" for w, _ in found), found
    assert not any(value in text for _, text in found)


# Every place a lane's config can hold a string: a token there is refused at its key path.
PLACES = {
    "env (secret = false)": ('env = {{ NOTE = {{ value = "{v}", secret = false }} }}\n' + EXEC, "lanes.a.env.NOTE"),
    "env of a *_KEY name": ('env = {{ HF_KEY = "{v}" }}\n' + EXEC, "lanes.a.env.HF_KEY"),
    "an arg's value": ('args = [{{ flag = "--model", value = "org/{v}" }}]\n' + EXEC, "lanes.a.args[0]"),
    "an engine flag": ('args = ["--trust-token={v}"]\n' + EXEC, "lanes.a.args[0]"),
    "the description": ('description = "uses {v} here"\n' + EXEC, "lanes.a.description"),
    "a prepare step": ('prepare = [["curl", "-H", "Bearer {v}"]]\n' + EXEC, "lanes.a.prepare[0].command[2]"),
    "the exec command": ('[lanes.a.exec]\ncommand = ["vllm", "serve", "/m/{v}"]\n', "lanes.a.exec.command[2]"),
    "a label": ('gpus = []\n[lanes.a.container]\nimage = "img"\npodman_args = ["-l", "k={v}"]\n',
                "lanes.a.container.podman_args"),
    "a volume": ('gpus = []\n[lanes.a.container]\nimage = "img"\nvolumes = ["/x/{v}:/y"]\n',
                 "lanes.a.container.volumes[0]"),
    "a cache path": ('gpus = []\n[lanes.a.container]\nimage = "img"\ncache_env = {{ X = "/laned/{v}" }}\n',
                     "lanes.a.container.cache_env.X"),
}  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(PLACES)), TOKENS)
def test_validate_refuses_a_token_wherever_it_stands(place: str, token: str) -> None:
    lane, where = PLACES[place]
    found = refused(lane.format(v=token))
    assert any(w == where for w, _ in found), (place, found)
    assert not any(token in text for _, text in found)


# --- laned import, generated spellings -------------------------------------------------------

IMAGES = {
    "vllm": "vllm/vllm-openai:latest --model org/m",
    "sglang": "lmsysorg/sglang python3 -m sglang.launch_server --model-path org/m",
    "llamacpp": "ghcr.io/ggml-org/llama.cpp:server -m /models/m.gguf",
}


def said(line: str) -> tuple[str, list[str], dict[str, str]]:
    """(the TOML, the warnings, the secrets) laned import makes of a line; the TOML valid."""
    lane = import_run(line)
    text = render_import(lane, "test")
    parse_config(text, "imported", ENV)  # raises on an error
    return text, lane.warnings, lane.secrets


@settings(max_examples=60, deadline=None)
@given(podman_spellings(), st.booleans())
def test_import_moves_every_podman_spelling_to_the_secrets_file(
    case: tuple[list[str], str, str], twice: bool
) -> None:
    args, name, value = case
    args = args * 2 if twice else args  # noted as "kept once", its value not said
    line = f"docker run {shlex.join(args)} -p 8000:8000 {IMAGES['vllm']}"
    text, warnings, secrets = said(line)
    assert name in secrets and f"{name}=<the value>" in text
    assert value not in text + " ".join(warnings + list(secrets.values()))


@settings(max_examples=60, deadline=None)
@given(engine_flag_cases())
def test_import_moves_every_engine_spelling_to_the_secrets_file(
    case: tuple[str, list[str], str],
) -> None:
    engine, words, value = case
    line = f"docker run {IMAGES[engine]} {shlex.join(words)} --port 9100"
    text, warnings, secrets = said(line)
    assert value not in text + " ".join(warnings + list(secrets.values()))
    (flag,) = [f for f in engines.ENGINES[engine].secret_flags if secret_words([f], words)]
    if flag.env is not None:
        assert flag.env in secrets and f"{flag.env}=<the value>" in text
    else:  # laned cannot hand it to the engine: dropped, and said why
        assert any(flag.instead in w for w in warnings), warnings


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(SECRET_NAMES), st.one_of(PLAIN, TOKENS))
def test_import_moves_a_secret_an_env_head_sets(name: str, value: str) -> None:
    line = f"docker run img env -u X {name}={value} vllm serve /m"
    text, warnings, secrets = said(line)
    assert name in secrets and value not in text + " ".join(warnings)


@settings(max_examples=40, deadline=None)
@given(TOKENS, st.sampled_from(["--foo {v}", "--foo=org/{v}"]))
def test_import_refuses_a_token_where_it_knows_no_name_for_it(token: str, form: str) -> None:
    with pytest.raises(BadImport) as caught:
        import_run(f"docker run img vllm serve /m {form.format(v=token)}")
    assert "--foo" in caught.value.message and token not in str(caught.value)


@settings(max_examples=30, deadline=None)
@given(TOKENS, st.sampled_from(["--gpus {v} img serve /m", "img serve /m --port {v}",
                                "--ipc host --shm-size {v} img serve /m"]))  # fmt: skip
def test_import_quotes_no_token_in_a_refusal_or_a_note(token: str, form: str) -> None:
    try:
        lane = import_run("docker run " + form.format(v=token))
    except BadImport as caught:
        assert token not in str(caught) and "<a" in caught.message
    else:  # --shm-size beside --ipc host is dropped, with a note
        assert token not in " ".join(lane.changes + lane.warnings) and lane.changes


# --- the importer's word splitting is shlex's, in linear time --------------------------------


@settings(max_examples=300, deadline=None)
@given(st.text(st.sampled_from(list("ab c\\'\"\t\n=-$é\u00a0\x0b")), max_size=30))
def test_words_split_as_shlex_splits_them(code: str) -> None:
    try:
        want: list[str] | str = shlex.split(code)
    except ValueError:
        want = "error"
    try:
        got: list[str] | str = split(code)
    except ValueError:
        got = "error"
    assert got == want


def test_a_long_value_is_one_word_and_options_given_often_are_kept_once() -> None:
    # What made import quadratic, read structurally (bench/import_scaling.py times it).
    big = "x" * 200_000
    lane = import_run(f"docker run {'-e A=1 ' * 2000}-e B='{big}' img serve /m")
    assert lane.env == {"A": ("1", ""), "B": (big, "")}
    assert sum("kept once" in c for c in lane.changes) == 1999


@settings(max_examples=30, deadline=None)
@given(TOKENS)
def test_no_rule_quotes_a_token(token: str) -> None:
    # Rules that quote a bad value (a volume that is no SRC:DST, pydantic's "got ..."): the
    # token is named by its kind.
    typed = refused(f'priority = "{token}"\n' + EXEC)
    assert [(w, "(got '<a" in text) for w, text in typed] == [("lanes.a.priority", True)]
    found = refused(container([]).replace("podman_args", f'volumes = ["{token}"]\npodman_args'))
    said = [w for w, text in found if "is not SRC:DST" in text and "<a" in text]
    assert said == ["lanes.a.container.volumes[0]"], found
    assert not any(token in text for _, text in typed + found)


def test_a_secret_set_in_a_shell_string_is_refused() -> None:
    found = refused(
        textwrap.dedent(
            """
            [lanes.a.exec]
            command = ["sh", "-c", "HF_TOKEN=abc exec vllm serve /m"]
            """
        )
    )
    assert [w for w, _ in found] == ["lanes.a.exec.command[2]"]
    assert "abc" not in found[0][1]
