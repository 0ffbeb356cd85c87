"""podman run's options, read as podman reads them (cobra over spf13/pflag). Pure.

The one reader of podman options in laned: the config's rules over a container lane's
`podman_args` (laned.validation.engine_rules, laned.validation.secret_rules) and `laned import` of a
recipe's `docker run` line (laned.importer.run_options; Docker's CLI is cobra and pflag too).

pflag's grammar (github.com/spf13/pflag, flag.go: `parseArgs`, `parseLongArg`,
`parseShortArg`, `parseSingleShortArg`):

- `--name=VALUE`; `--name VALUE`, the next word whatever it is (`--env -x` sets `-x`); `--name`
  alone for a flag with a NoOptDefVal, which every bool has (`--rm`; `--rm=false` too). A long
  name is exact (no abbreviation) after podman's own aliases (`--net` is `--network`:
  cmd/podman/utils/alias.go `AliasFlags`, which `podman run` sets).
- `-abc`: shorthands read in turn. One with a NoOptDefVal (a bool) takes no value and the next
  letter is the next shorthand; the first one that takes a value takes the rest of the word
  after an `=` that follows it (`-e=NAME=V`, `-ie=NAME=V`), else the rest of the word
  (`-ieNAME=V` is `-i -e NAME=V`, `-teNAME=V`, `-qitPeNAME=V`), else the next word (`-ie
  NAME=V`). A bool takes `=VALUE` too (`-i=false`), which ends the word.
- `--` ends the options; `podman run` reads none after its first positional word, the image
  (cmd/podman/containers/run.go: `SetInterspersed(false)`).

Checked against podman 4.3.1 here: `podman create` with `-ieHF_TOKEN=x`, `-teHF_TOKEN=x`,
`-qitPeHF_TOKEN=x`, `-e=HF_TOKEN=x`, `-ie=HF_TOKEN=x` and `-i=true -eHF_TOKEN=x` each sets
HF_TOKEN; `-ei=HF_TOKEN=x` sets `i` to `HF_TOKEN=x`; `-lHF_TOKEN=x` sets a label.

The flags, their shorthands and which take no value come from podman's own definitions
(cmd/podman/common/create.go `DefineCreateFlags`, common/netflags.go `DefineNetFlags`,
containers/run.go `runFlags`; `--tls-verify` is an OptionalBoolFlag). An option podman does not
know (a Docker-only one, a newer podman's) is read by laned's guess, not podman's rule (podman
refuses it): `--x=V`, `--x V` where V starts with no `-`, else `--x` alone.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# Shorthand letter -> long name (create.go, netflags.go, run.go: the `...P` definitions).
SHORTHANDS = {
    "a": "--attach", "c": "--cpu-shares", "d": "--detach", "e": "--env", "h": "--hostname",
    "i": "--interactive", "l": "--label", "m": "--memory", "p": "--publish", "P": "--publish-all",
    "q": "--quiet", "t": "--tty", "u": "--user", "v": "--volume", "w": "--workdir",
}  # fmt: skip
# Flags with a NoOptDefVal: every bool, and --tls-verify (an OptionalBoolFlag).
BOOLEAN = frozenset({
    "--detach", "--disable-content-trust", "--env-host", "--help", "--http-proxy", "--init",
    "--interactive", "--no-healthcheck", "--no-hostname", "--no-hosts", "--oom-kill-disable",
    "--passwd", "--privileged", "--publish-all", "--quiet", "--read-only", "--read-only-tmpfs",
    "--replace", "--rm", "--rmi", "--rootfs", "--sig-proxy", "--tls-verify", "--tty",
    "--unsetenv-all",
})  # fmt: skip
# Flags that take a value.
VALUED = frozenset({
    "--add-host", "--annotation", "--arch", "--attach", "--authfile", "--blkio-weight",
    "--blkio-weight-device", "--cap-add", "--cap-drop", "--cert-dir", "--cgroup-conf",
    "--cgroup-parent", "--cgroupns", "--cgroups", "--chrootdirs", "--cidfile",
    "--conmon-pidfile", "--cpu-period", "--cpu-quota", "--cpu-rt-period", "--cpu-rt-runtime",
    "--cpu-shares", "--cpus", "--cpuset-cpus", "--cpuset-mems", "--creds", "--decryption-key",
    "--detach-keys", "--device", "--device-cgroup-rule", "--device-read-bps",
    "--device-read-iops", "--device-write-bps", "--device-write-iops", "--dns", "--dns-option",
    "--dns-search", "--env", "--env-file", "--env-merge", "--expose", "--gidmap", "--gpus",
    "--group-add", "--group-entry", "--health-cmd", "--health-interval",
    "--health-log-destination", "--health-max-log-count", "--health-max-log-size",
    "--health-on-failure", "--health-retries", "--health-start-period", "--health-startup-cmd",
    "--health-startup-interval", "--health-startup-retries", "--health-startup-success",
    "--health-startup-timeout", "--health-timeout", "--hostname", "--hosts-file", "--hostuser",
    "--image-volume", "--init-ctr", "--init-path", "--ip", "--ip6", "--ipc", "--kernel-memory",
    "--label", "--label-file", "--log-driver", "--log-opt", "--mac-address", "--memory",
    "--memory-reservation", "--memory-swap", "--memory-swappiness", "--mount", "--name",
    "--network", "--network-alias", "--oom-score-adj", "--os", "--passwd-entry",
    "--personality", "--pid", "--pidfile", "--pids-limit", "--platform", "--pod",
    "--pod-id-file", "--preserve-fd", "--preserve-fds", "--publish", "--pull", "--rdt-class",
    "--requires", "--restart", "--retry", "--retry-delay", "--sdnotify", "--seccomp-policy",
    "--secret", "--security-opt", "--shm-size", "--shm-size-systemd", "--signature-policy",
    "--stop-signal", "--stop-timeout", "--subgidname", "--subuidname", "--sysctl", "--systemd",
    "--timeout", "--tmpfs", "--tz", "--uidmap", "--ulimit", "--umask", "--unsetenv", "--user",
    "--userns", "--uts", "--variant", "--volume", "--volumes-from", "--workdir",
})  # fmt: skip
# podman's AliasFlags: older names read as the newer.
ALIASES = {
    "--dns-opt": "--dns-option", "--healthcheck-command": "--health-cmd",
    "--healthcheck-interval": "--health-interval", "--healthcheck-retries": "--health-retries",
    "--healthcheck-start-period": "--health-start-period",
    "--healthcheck-timeout": "--health-timeout", "--net": "--network", "--namespace": "--ns",
    "--storage": "--external", "--notruncate": "--no-trunc", "--override-arch": "--arch",
    "--override-os": "--os", "--override-variant": "--variant",
}  # fmt: skip
# The options that set a variable in the container from their value (NAME=VALUE; `-e NAME`
# alone passes the host's NAME by name), and those that carry KEY=VALUE pairs podman records
# (in `podman inspect`, beside the argv they came from).
ENV_OPTIONS = frozenset({"--env", "--env-merge"})
PAIR_OPTIONS = frozenset({"--label", "--annotation", "--log-opt"})


@dataclass(frozen=True)
class PodmanOption:
    """One option as podman reads it: `name`, its long name (`--env` for `-e`, `--network` for
    `--net`; as written where podman does not know it), `value` (None: a bool given alone),
    `at`: the word it is in, `spelled`: how that word names it (`-e`, `--net`, `-ie`)."""

    name: str
    value: str | None
    at: int
    spelled: str


def long_name(name: str) -> str:
    """A long option's name as podman reads it (its aliases applied)."""
    return ALIASES.get(name, name)


def read_options(words: Sequence[str], interspersed: bool = True) -> tuple[list[PodmanOption], int]:
    """The options in `words`, and the index of the first word after them: the image for
    `podman run`'s words (`interspersed=False`: the first positional word, or the word after
    `--`, ends them); with `interspersed`, positional words are passed over (podman_args holds
    options only) and the index is len(words)."""
    options: list[PodmanOption] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--":
            return options, i + 1
        if len(word) < 2 or word[0] != "-":
            if not interspersed:
                return options, i
            i += 1
            continue
        nxt = words[i + 1] if i + 1 < len(words) else None
        if word.startswith("--"):
            taken = _long(options, word, i, nxt)
        else:
            taken = _cluster(options, word, i, nxt)
        i += 1 + taken
    return options, len(words)


def _long(options: list[PodmanOption], word: str, at: int, nxt: str | None) -> int:
    """`--name[=VALUE]` (parseLongArg); the number of later words it took (0 or 1)."""
    given, eq, inline = word.partition("=")
    name = long_name(given)
    if eq:
        options.append(PodmanOption(name, inline, at, given))
        return 0
    if name in BOOLEAN or nxt is None:
        options.append(PodmanOption(name, None, at, given))
        return 0
    if name in VALUED or not nxt.startswith("-"):  # an unknown flag: laned's guess
        options.append(PodmanOption(name, nxt, at, given))
        return 1
    options.append(PodmanOption(name, None, at, given))
    return 0


def _cluster(options: list[PodmanOption], word: str, at: int, nxt: str | None) -> int:
    """`-abc` (parseShortArg, parseSingleShortArg); the number of later words it took."""
    rest = word[1:]
    while rest:
        letter, rest = rest[0], rest[1:]
        name = SHORTHANDS.get(letter)
        spelled = word[: len(word) - len(rest)]
        if rest.startswith("="):  # `-e=VALUE`, `-i=false`: the rest of the word
            options.append(PodmanOption(name or "-" + letter, rest[1:], at, spelled))
            return 0
        if name in BOOLEAN:
            options.append(PodmanOption(name, None, at, spelled))
            continue
        if rest:  # `-eNAME=V`: the value is the rest of the word
            options.append(PodmanOption(name or "-" + letter, rest, at, spelled))
            return 0
        if nxt is not None and (name is not None or not nxt.startswith("-")):
            options.append(PodmanOption(name or "-" + letter, nxt, at, spelled))
            return 1
        options.append(PodmanOption(name or "-" + letter, None, at, spelled))
    return 0
