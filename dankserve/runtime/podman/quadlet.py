"""A workload spec as a Podman Quadlet `.container` unit, and as the `podman run` that unit stands for (pure).

Both are read off the one create request the runtime sends (`spec.container_create_kwargs`): the
same entrypoint, argv, environment, mounts, devices, secrets, ports, labels, IPC and capabilities.
Each request field becomes `Entry`s (a Quadlet key and its words); the unit text quotes every
entry the way Quadlet reads that key (podman-systemd.unit(5), pkg/systemd/parser and
pkg/systemd/quadlet of Podman 5.0 to 5.8) and uses only keys every Podman 5 knows;
`podman_run_args` turns the entries into the arguments Quadlet's generator gives `podman run`
for them. `%` and `$` are doubled everywhere: Quadlet copies the values into the service's
ExecStart, where systemd expands specifiers and variables.
"""

from __future__ import annotations

import csv
import io
import json
import math
import shlex
import string
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

from dankserve.runtime.base import LABEL_MANAGED, WorkloadSpec, workload_name
from dankserve.runtime.podman.cdi import GpuPassthrough
from dankserve.runtime.podman.spec import container_create_kwargs

QUADLET_CONTAINER_KEYS: frozenset[str] = frozenset(
    {
        "AddCapability",
        "AddDevice",
        "Annotation",
        "AutoUpdate",
        "ContainerName",
        "ContainersConfModule",
        "DNS",
        "DNSOption",
        "DNSSearch",
        "DropCapability",
        "Entrypoint",
        "Environment",
        "EnvironmentFile",
        "EnvironmentHost",
        "Exec",
        "ExposeHostPort",
        "GIDMap",
        "GlobalArgs",
        "Group",
        "HealthCmd",
        "HealthInterval",
        "HealthOnFailure",
        "HealthRetries",
        "HealthStartPeriod",
        "HealthStartupCmd",
        "HealthStartupInterval",
        "HealthStartupRetries",
        "HealthStartupSuccess",
        "HealthStartupTimeout",
        "HealthTimeout",
        "HostName",
        "IP",
        "IP6",
        "Image",
        "Label",
        "LogDriver",
        "Mask",
        "Mount",
        "Network",
        "NoNewPrivileges",
        "Notify",
        "PidsLimit",
        "Pod",
        "PodmanArgs",
        "PublishPort",
        "Pull",
        "ReadOnly",
        "ReadOnlyTmpfs",
        "RemapGid",
        "RemapUid",
        "RemapUidSize",
        "RemapUsers",
        "Rootfs",
        "RunInit",
        "SeccompProfile",
        "Secret",
        "SecurityLabelDisable",
        "SecurityLabelFileType",
        "SecurityLabelLevel",
        "SecurityLabelNested",
        "SecurityLabelType",
        "ShmSize",
        "StopTimeout",
        "SubGIDMap",
        "SubUIDMap",
        "Sysctl",
        "Timezone",
        "Tmpfs",
        "UIDMap",
        "Ulimit",
        "Unmask",
        "User",
        "UserNS",
        "VolatileTmp",
        "Volume",
        "WorkingDir",
    }
)
"""The keys of a `[Container]` section that every Podman 5 accepts: Podman 5.0.0's
pkg/systemd/quadlet/quadlet.go (supportedContainerKeys), each of them still in 5.8.2's
(groupsInfo[ContainerGroup].SupportedKeys). Quadlet refuses a unit with any other key; later keys
(AppArmor= of 5.8, Memory=, ...) would shut out 5.0 to 5.7."""

SYSTEMD_KEYS: Mapping[str, frozenset[str]] = {
    "Unit": frozenset({"Description"}),
    "Service": frozenset({"Restart", "RestartSec", "TimeoutStartSec"}),
    "Install": frozenset({"WantedBy"}),
}
"""The systemd keys the unit sets in the sections Quadlet copies to the service unchanged."""

MINIMUM_PODMAN = "5.0"
"""Quadlet's `Entrypoint=` key and `Notify=healthy` came with Podman 5.0 (4.4 to 4.9 refuse the unit)."""
QUADLET_SINCE = (4, 4)
"""Podman's first release with Quadlet (Debian 12's 4.3 has none)."""

PULL_SECONDS = 900
"""What the unit's start allows for pulling the image before the boot's own time (a first pull is large)."""
HEALTH_INTERVAL = "30s"
HEALTH_TIMEOUT = "10s"
HEALTH_RETRIES = "3"
"""A server whose /health fails this many times in a row (at HEALTH_INTERVAL, each within HEALTH_TIMEOUT) is
unhealthy: HealthOnFailure=kill ends it and the service's Restart= starts it again, as dankserve would."""

Syntax = Literal["raw", "args", "words", "keyval"]

KEY_SYNTAX: Mapping[str, Syntax] = {
    # raw: the value as written, one per line (Lookup / LookupAll)
    "ContainerName": "raw",
    "Image": "raw",
    "Pull": "raw",
    "Entrypoint": "raw",
    "Network": "raw",
    "PublishPort": "raw",
    "ShmSize": "raw",
    "LogDriver": "raw",
    "StopTimeout": "raw",
    "HealthCmd": "raw",
    "HealthInterval": "raw",
    "HealthTimeout": "raw",
    "HealthRetries": "raw",
    "HealthStartPeriod": "raw",
    "HealthOnFailure": "raw",
    "Notify": "raw",
    "AutoUpdate": "raw",
    # args: split like a systemd command line, quotes and C escapes (LookupLastArgs / LookupAllArgs)
    "Exec": "args",
    "Mount": "args",
    "Secret": "args",
    "PodmanArgs": "args",
    # words: split at blanks, quotes removed, backslashes kept (LookupAllStrv)
    "AddDevice": "words",
    "AddCapability": "words",
    # keyval: NAME=VALUE words, split like `args` (LookupAllKeyVal)
    "Environment": "keyval",
    "Label": "keyval",
}
"""How Quadlet reads each key this module writes."""

PODMAN_OPTION: Mapping[str, str] = {
    "ContainerName": "--name",
    "Pull": "--pull",
    "Environment": "--env",
    "Label": "--label",
    "Mount": "--mount",
    "Secret": "--secret",
    "AddDevice": "--device",
    "Network": "--network",
    "PublishPort": "--publish",
    "ShmSize": "--shm-size",
    "AddCapability": "--cap-add",
    "LogDriver": "--log-driver",
    "StopTimeout": "--stop-timeout",
    "HealthCmd": "--health-cmd",
    "HealthInterval": "--health-interval",
    "HealthTimeout": "--health-timeout",
    "HealthRetries": "--health-retries",
    "HealthStartPeriod": "--health-start-period",
    "HealthOnFailure": "--health-on-failure",
}
"""The `podman run` option Quadlet's generator writes for a key that maps to one option and its value."""


class Unrepresentable(ValueError):
    """A value no Quadlet unit can carry as it is (it names the value and why)."""


@dataclass(frozen=True)
class Entry:
    """One key of the `[Container]` section and its words (one word for every key but `Exec`)."""

    key: str
    words: tuple[str, ...]
    comment: str = ""


@dataclass(frozen=True)
class ContainerUnit:
    """The unit of a deployment: its `[Container]` entries and the secrets it expects to exist."""

    deployment: str
    entries: tuple[Entry, ...]
    secrets: Mapping[str, Path]
    """Podman secret name -> the host file dankserve reads it from (to `podman secret create` by hand)."""
    start_timeout_seconds: int = 900
    """The service's TimeoutStartSec: with Notify=healthy the start lasts until the server serves (PULL_SECONDS
    for the image, then the boot)."""


def exported_secret_name(deployment: str, secret: str) -> str:
    """The Podman secret a unit uses: `dankserve-NAME-SECRET`, not the runtime's `dankserve-NAME.SECRET`
    (dankserve replaces and removes those with its container), so dankserve never deletes the unit's."""
    return f"{workload_name(deployment)}-{secret}"


def container_unit(
    spec: WorkloadSpec, gpu: GpuPassthrough, *, stop_timeout: float, boot_timeout: float = 900.0
) -> ContainerUnit:
    """The unit running `spec` as dankserve's Podman runtime creates its container, with a health check of
    vLLM's /health that `systemctl start` waits for (Notify=healthy: started means serving; `boot_timeout`
    is the start period), and AutoUpdate=registry for an image named by a registry and a tag.

    A launcher workload (issue 15) is exported as the plain `vllm serve` container: nothing would ask
    that launcher for a server without dankserve.
    """
    plain = replace(spec, launcher=None)
    ids = {s.name: exported_secret_name(spec.deployment, s.name) for s in plain.secrets}
    kwargs = container_create_kwargs(plain, gpu=gpu, journald=False, secret_ids=ids)
    entries = [Entry("Image", (spec.image,)), Entry("Pull", (spec.pull,))]
    entries += request_entries(kwargs)
    entries.append(
        Entry(
            "StopTimeout",
            (str(max(0, math.ceil(stop_timeout))),),
            "stop_timeout_seconds: SIGTERM, then SIGKILL after this long, as dankserve stops it",
        )
    )
    entries += health_entries(spec, boot_timeout)
    if auto_updatable(spec.image):
        why = "`podman auto-update` (its timer) pulls a newer image of this tag and restarts the service with it"
        entries.append(Entry("AutoUpdate", ("registry",), why))
    secrets = {ids[s.name]: s.source for s in plain.secrets}
    return ContainerUnit(spec.deployment, tuple(entries), secrets, PULL_SECONDS + math.ceil(boot_timeout))


def health_url(spec: WorkloadSpec) -> str:
    """vLLM's /health as the container itself reaches it: the host's port on the host's network, else the
    container's own port."""
    if spec.host_network:
        host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(spec.bind_host, spec.bind_host)
        address = f"[{host}]" if ":" in host else host
        return f"http://{address}:{spec.port}/health"
    return f"http://127.0.0.1:{spec.container_port}/health"


def health_entries(spec: WorkloadSpec, boot_timeout: float) -> list[Entry]:
    """The health check (vLLM's /health, by the image's python3: the image has no curl) and Notify=healthy."""
    probe = f"import urllib.request as r; r.urlopen({health_url(spec)!r}, timeout=5)"
    command = json.dumps(["python3", "-c", probe])
    return [
        Entry("HealthCmd", (command,), "vLLM's /health: 200 once the engine serves, 503 when it died"),
        Entry("HealthInterval", (HEALTH_INTERVAL,)),
        Entry("HealthTimeout", (HEALTH_TIMEOUT,)),
        Entry("HealthRetries", (HEALTH_RETRIES,)),
        Entry("HealthStartPeriod", (f"{max(1, math.ceil(boot_timeout))}s",), "boot_timeout_seconds: loading"),
        Entry("HealthOnFailure", ("kill",), "an engine that stopped answering is killed: Restart= starts it again"),
        Entry("Notify", ("healthy",), "`systemctl start` returns once /health answers: started means serving"),
    ]


def auto_updatable(image: str) -> bool:
    """The image is a registry reference `podman auto-update --policy registry` can follow: a registry host
    (a dot or a port in the first component, not localhost) and a tag, not a digest (a digest never moves)."""
    first, slash, rest = image.partition("/")
    if not slash or "@" in image:
        return False
    registry = ("." in first or ":" in first) and first.split(":")[0] != "localhost"
    return registry and ":" in rest.rsplit("/", 1)[-1]


def podman_version_problem(version: tuple[int, ...] | None) -> str | None:
    """Why this host's Podman cannot use an exported unit (None: it can): no Podman, no Quadlet before 4.4,
    no Entrypoint=/Notify=healthy before MINIMUM_PODMAN."""
    if version is None:
        return f"Podman is not installed here: the unit runs where Podman {MINIMUM_PODMAN} or later is"
    shown = ".".join(map(str, version))
    minimum = tuple(int(p) for p in MINIMUM_PODMAN.split("."))
    if version < QUADLET_SINCE:
        return (
            f"this host's Podman {shown} has no Quadlet (it came with Podman 4.4; Debian 12 ships 4.3), and the unit "
            f"needs Podman {MINIMUM_PODMAN} or later: install it on a host with Podman {MINIMUM_PODMAN}+ (Debian 13, "
            "Ubuntu 24.10, Fedora 40 and later), or keep this deployment under dankserve"
        )
    if version < minimum:
        return (
            f"this host's Podman {shown} has Quadlet but not the unit's Entrypoint= and Notify=healthy (Podman "
            f"{MINIMUM_PODMAN}): install it on a host with Podman {MINIMUM_PODMAN} or later"
        )
    return None


def request_entries(kwargs: Mapping[str, Any]) -> list[Entry]:
    """The entries of a `containers.create` request; a field this module does not know is an error, so a
    new option of the runtime cannot go missing from the unit unnoticed."""
    handled = {
        "name",
        "entrypoint",
        "command",
        "environment",
        "labels",
        "mounts",
        "devices",
        "secrets",
        "network_mode",
        "ports",
        "ipc_mode",
        "shm_size",
        "cap_add",
        "apparmor_profile",
        "log_config",
        "annotations",  # CRIU's options for dankserve's own checkpoints (snapshots): nothing to a unit
    }
    unknown = sorted(set(kwargs) - handled)
    if unknown:
        raise ValueError(f"create request fields without a Quadlet rendering: {unknown}")
    mine = "without dankserve's io.dankserve.managed label: a running dankserve leaves this container alone"
    out = [Entry("ContainerName", (str(kwargs["name"]),), mine)]
    why = "`vllm serve`, or `sh -c` reading a key from its secret file first (so it is not in `podman inspect`)"
    out.append(Entry("Entrypoint", (json.dumps(list(kwargs["entrypoint"])),), why))
    if kwargs["command"]:
        out.append(Entry("Exec", tuple(str(a) for a in kwargs["command"]), "the arguments after `vllm serve`"))
    out += [Entry("Environment", (f"{k}={v}",)) for k, v in kwargs["environment"].items()]
    labels = {k: v for k, v in kwargs["labels"].items() if k != LABEL_MANAGED}
    out += [Entry("Label", (f"{k}={v}",)) for k, v in labels.items()]
    out += [Entry("Mount", (mount_option(m),)) for m in kwargs["mounts"]]
    out += [Entry("AddDevice", (str(d),)) for d in kwargs["devices"]]
    out += [Entry("Secret", (f"{s['source']},type=mount,target={s['target']}",)) for s in kwargs["secrets"]]
    if kwargs.get("network_mode") is not None:
        out.append(Entry("Network", (str(kwargs["network_mode"]),)))
    for container_port, (host, port) in (kwargs.get("ports") or {}).items():
        address = f"[{host}]" if ":" in host else host
        out.append(Entry("PublishPort", (f"{address}:{port}:{container_port}",)))
    if kwargs.get("ipc_mode") is not None:
        why = "Quadlet has no key for the IPC namespace (podman-systemd.unit(5)): vLLM's workers share memory"
        out.append(Entry("PodmanArgs", (f"--ipc={kwargs['ipc_mode']}",), why))
    if kwargs.get("shm_size") is not None:
        out.append(Entry("ShmSize", (str(kwargs["shm_size"]),)))
    out += [Entry("AddCapability", (str(c),)) for c in kwargs.get("cap_add") or ()]
    if kwargs.get("apparmor_profile") is not None:
        why = "AppArmor= came with Podman 5.8; this unit runs on 5.0 and later"
        out.append(Entry("PodmanArgs", (f"--security-opt=apparmor={kwargs['apparmor_profile']}",), why))
    if kwargs.get("log_config") is not None:
        out.append(Entry("LogDriver", (str(kwargs["log_config"]["Type"]).lower(),)))
    return out


def mount_option(mount: Mapping[str, Any]) -> str:
    """A bind mount of the request as `podman run --mount` reads it (CSV: a comma in a path is quoted)."""
    fields = [f"type={mount['type']}", f"source={mount['source']}", f"destination={mount['target']}"]
    if mount.get("read_only"):
        fields.append("ro=true")
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="").writerow(fields)
    return buffer.getvalue()


def podman_run_args(unit: ContainerUnit) -> list[str]:
    """The arguments after `podman run` that Quadlet's generator writes for the unit's entries, less what
    it adds for systemd's sake (`--replace --rm --cgroups=split --sdnotify=conmon -d`)."""
    options: list[str] = []
    image: list[str] = []
    argv: list[str] = []
    for entry in unit.entries:
        key, words = entry.key, entry.words
        if key == "Image":
            image = list(words)
        elif key == "Exec":
            argv = list(words)
        elif key == "Entrypoint":
            options.append(f"--entrypoint={words[0]}")
        elif key == "Notify":
            continue  # the generator's own --sdnotify (healthy instead of conmon)
        elif key == "AutoUpdate":
            options += ["--label", f"io.containers.autoupdate={words[0]}"]
        elif key == "PodmanArgs":
            options += words
        elif key == "AddCapability":
            options += [PODMAN_OPTION[key], words[0].lower()]
        else:
            options += [PODMAN_OPTION[key], words[0]]
    return [*options, *image, *argv]


# ---------------------------------------------------------------------------------------------
# The unit's text
# ---------------------------------------------------------------------------------------------

_PLAIN = frozenset(string.ascii_letters + string.digits + "-_./:=,+@%$[]{}")
_CONTROL = frozenset(chr(c) for c in [*range(32), 127])
_C1 = frozenset(chr(c) for c in range(128, 160))


def systemd_literal(text: str) -> str:
    """`text` as systemd reads it back in ExecStart: `%%` for a `%` (specifiers), `$$` for a `$` (variables)."""
    return text.replace("%", "%%").replace("$", "$$")


def quote_arg(word: str) -> str:
    """One word of a systemd command line (Quadlet's LookupAllArgs): double quotes and C escapes when needed."""
    if word == "":
        raise Unrepresentable("an empty argument (Quadlet ends a command line at an empty word)")
    if word == ";":
        raise Unrepresentable("an argument `;` (systemd reads a lone `;` in ExecStart as the next command)")
    if set(word) & _C1:
        raise Unrepresentable(f"{word!r}: a C1 control character (Quadlet rewrites it as a byte, not UTF-8)")
    word = systemd_literal(word)
    if all(c in _PLAIN for c in word):
        return word
    out = ['"']
    for c in word:
        if c in ('"', "\\"):
            out.append("\\" + c)
        elif c in _CONTROL:
            out.append(f"\\x{ord(c):02x}")
        else:
            out.append(c)
    out.append('"')
    return "".join(out)


def quote_word(word: str) -> str:
    """One word Quadlet splits at blanks and unquotes without C escapes (LookupAllStrv)."""
    bad = set(word) & (_CONTROL | _C1 | {'"', "'", "\\"})
    if not word or bad:
        raise Unrepresentable(f"{word!r}: a quote, backslash or control character (or nothing) in this key")
    word = systemd_literal(word)
    return f'"{word}"' if " " in word else word


def raw_value(value: str) -> str:
    """A value Quadlet takes as written: no control character, nothing its trimming of blanks and quotes
    or a line continuation would change."""
    if (
        not value
        or set(value) & (_CONTROL | _C1)
        or value != value.strip()
        or value.startswith('"')
        or value.endswith(('"', "\\"))
    ):
        raise Unrepresentable(f"{value!r}: empty, a control character, or blanks, quotes or `\\` at an end")
    return systemd_literal(value)


def entry_value(entry: Entry) -> str:
    """The text after `KEY=` for an entry."""
    syntax = KEY_SYNTAX[entry.key]
    if syntax == "raw":
        return raw_value(entry.words[0])
    if syntax == "words":
        return " ".join(quote_word(w) for w in entry.words)
    if syntax == "keyval" and "=" not in entry.words[0]:
        raise Unrepresentable(f"{entry.words[0]!r}: no NAME=VALUE")
    return " ".join(quote_arg(w) for w in entry.words)


def _comment(text: str) -> list[str]:
    return [f"# {line}".rstrip() for line in text.splitlines()]


def render_unit(unit: ContainerUnit, *, description: str, notes: Sequence[str] = ()) -> str:
    """The `.container` file: header comments, [Unit], [Container], [Service], [Install]."""
    lines = _comment(f"Podman Quadlet unit of dankserve deployment {unit.deployment!r} (`dankserve export quadlet`).")
    lines += _comment(
        f"Needs Podman {MINIMUM_PODMAN} or later. Save it as /etc/containers/systemd/{unit_file_stem(unit.deployment)}"
        ".container (or under ~/.config/containers/systemd/; the file's name is the service's), then"
        f" `systemctl daemon-reload` and `systemctl start {unit_file_stem(unit.deployment)}`."
    )
    for note in notes:
        lines += _comment(note)
    if unit.secrets:
        lines += _comment(
            "Secrets are not in this file (Secret= names Podman secrets, mounted under /run/secrets):"
            " create each from its file before the first start, without the trailing newline as dankserve reads it:"
        )
        lines += _comment("\n".join(f"  {secret_create_command(n, p)}" for n, p in sorted(unit.secrets.items())))
    # Quadlet itself adds Wants= and After=network-online.target to a system unit.
    lines += ["", "[Unit]", f"Description={one_line(description)}", "", "[Container]"]
    for entry in unit.entries:
        if entry.comment:
            lines += _comment(entry.comment)
        lines.append(f"{entry.key}={entry_value(entry)}")
    lines += ["", "[Service]"]
    lines += _comment(
        "dankserve restarts a failed server too; a start lasts until /health answers (Notify=healthy): "
        "the image's pull, then the boot (boot_timeout_seconds)"
    )
    lines += ["Restart=on-failure", "RestartSec=10", f"TimeoutStartSec={unit.start_timeout_seconds}", "", "[Install]"]
    lines += ["WantedBy=multi-user.target default.target", ""]
    return "\n".join(lines)


def secret_create_command(name: str, path: Path) -> str:
    """The shell line creating a unit's Podman secret from its file (trailing newlines dropped)."""
    return f'printf %s "$(cat {shlex.quote(str(path))})" | podman secret create {shlex.quote(name)} -'


def unit_file_stem(deployment: str) -> str:
    """The service Quadlet generates from `<stem>.container`: the container's own name."""
    return workload_name(deployment)


def one_line(text: str) -> str:
    """Text for a systemd value of its own: one line, `%` doubled (systemd expands specifiers in every value)."""
    return " ".join(text.split()).replace("%", "%%")


def emitted_keys(text: str) -> dict[str, list[str]]:
    """Section -> the keys a unit text sets (for the check that every key is one Quadlet or systemd knows)."""
    sections: dict[str, list[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
            sections.setdefault(current, [])
        elif line and not line.startswith("#"):
            sections[current].append(line.split("=", 1)[0])
    return sections


def unknown_keys(sections: Mapping[str, Iterable[str]]) -> list[str]:
    """`Section.Key` of every key outside Quadlet's reference (for [Container]) and SYSTEMD_KEYS."""
    allowed = {"Container": QUADLET_CONTAINER_KEYS, **SYSTEMD_KEYS}
    return [f"{s}.{k}" for s, keys in sections.items() for k in keys if k not in allowed.get(s, frozenset())]
