"""A `.container` unit read back the way Podman's Quadlet and then systemd read it, written apart from the
renderer (dankserve/runtime/podman/quadlet.py) from Podman 5.8.2's pkg/systemd/parser (split.go's
extractFirstWord, unitfile.go's Lookup/LookupAllArgs/LookupAllStrv) and systemd's ExecStart rules
(`%%` is a `%`, `$$` a `$`; any other `%` or `$` would be expanded). Also: the generator itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from dankserve.runtime.podman.quadlet import KEY_SYNTAX, ContainerUnit, Entry

WHITESPACE = " \t\n\r"
C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "s": " "}
C_ESCAPES |= {"\\": "\\", '"': '"', "'": "'"}


def sections(text: str) -> dict[str, list[tuple[str, str]]]:
    """Section -> (key, value) lines in order, as Quadlet's parser keeps them (comments dropped)."""
    out: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";")):
            continue
        assert not line.endswith("\\"), f"a line continuation: {line!r}"
        if stripped.startswith("["):
            current = stripped[1:-1]
            out.setdefault(current, [])
            continue
        assert current is not None and "=" in line, line
        key, value = line.split("=", 1)
        out[current].append((key.rstrip(), value.lstrip()))
    return out


def split_args(value: str, *, c_unescape: bool = True) -> list[str]:
    """systemd's extract_first_word with RELAX|UNQUOTE|CUNESCAPE (or RETAIN_ESCAPE|UNQUOTE without)."""
    words: list[str] = []
    i, n = 0, len(value)
    while True:
        while i < n and value[i] in WHITESPACE:
            i += 1
        if i >= n:
            return words
        word: list[str] = []
        quote = ""
        while i < n:
            c = value[i]
            if not quote and c in WHITESPACE:
                break
            if c_unescape and c == "\\":
                i, char = _unescape(value, i + 1)
                word.append(char)
                continue
            if quote and c == quote:
                quote = ""
            elif not quote and c in "\"'":
                quote = c
            else:
                word.append(c)
            i += 1
        if not word:  # Quadlet's parser ends the line at an empty word
            return words
        words.append("".join(word))


def _unescape(value: str, i: int) -> tuple[int, str]:
    c = value[i]
    if c in C_ESCAPES:
        return i + 1, C_ESCAPES[c]
    if c == "x":
        return i + 3, chr(int(value[i + 1 : i + 3], 16))
    raise AssertionError(f"an escape Quadlet would refuse: \\{c} in {value!r}")


def systemd_unescape(word: str, *, strict: bool = True) -> str:
    """`%%` and `$$` back to one character; a lone `%` or `$` would be expanded by systemd: an error here
    (`strict`), else kept (the generator's own `%t/%N.cid`)."""
    out: list[str] = []
    i = 0
    while i < len(word):
        c = word[i]
        if c in "%$" and word[i + 1 : i + 2] == c:
            i += 1
        elif c in "%$":
            assert not strict, f"systemd would expand {word[i : i + 2]!r} in {word!r}"
        out.append(c)
        i += 1
    return "".join(out)


def raw(value: str) -> str:
    """Quadlet's Lookup: trailing blanks trimmed, one matched pair of surrounding quotes removed."""
    value = value.rstrip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value


def read_entries(text: str) -> list[Entry]:
    """The unit's [Container] entries as the generator understands them (words after systemd's unescaping)."""
    entries = []
    for key, value in sections(text)["Container"]:
        syntax = KEY_SYNTAX[key]
        words = [raw(value)] if syntax == "raw" else split_args(value, c_unescape=syntax != "words")
        entries.append(Entry(key, tuple(systemd_unescape(w) for w in words)))
    return entries


def unit_from_text(text: str, deployment: str) -> ContainerUnit:
    """A ContainerUnit holding what a unit text says (for `podman_run_args`)."""
    return ContainerUnit(deployment, tuple(read_entries(text)), {})


QUADLET_PATHS = (Path("/usr/libexec/podman/quadlet"), Path("/usr/lib/podman/quadlet"))


def quadlet_generator() -> Path | None:
    """Podman's Quadlet generator where this host has one (Podman 4.4 and later; $DANKSERVE_TEST_QUADLET names
    one unpacked from a newer podman package), else None."""
    named = os.environ.get("DANKSERVE_TEST_QUADLET")
    if named:
        return Path(named)
    for path in QUADLET_PATHS:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    found = shutil.which("quadlet")
    return Path(found) if found else None


def generator_version(generator: Path) -> tuple[int, ...]:
    """`quadlet -version` as numbers (5.4.2 -> (5, 4, 2))."""
    done = subprocess.run([str(generator), "-version"], capture_output=True, text=True, check=True, timeout=30)
    return tuple(int(p) for p in done.stdout.strip().split("-")[0].split(".") if p.isdigit())


def generated_exec_start(generator: Path, unit_dir: Path) -> list[str]:
    """`quadlet -dryrun` over a directory of units: the generated service's ExecStart as systemd runs it."""
    done = subprocess.run(
        [str(generator), "-dryrun"],
        env={**os.environ, "QUADLET_UNIT_DIRS": str(unit_dir)},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("ExecStart=")]
    assert len(lines) == 1, done.stdout
    words = split_args(lines[0].removeprefix("ExecStart="))
    return [systemd_unescape(w, strict=not w.startswith("--cidfile=")) for w in words]  # its own %t/%N.cid


GENERATOR_OPTIONS = {"--cidfile": 1, "--cgroups": 1, "--sdnotify": 1, "--replace": 0, "--rm": 0, "-d": 0}
"""What Quadlet's generator adds to every `podman run` for systemd (option -> how many values follow)."""


def without_generator_options(argv: list[str]) -> list[str]:
    """A normalised argv less the generator's own options (those of GENERATOR_OPTIONS, wherever they are)."""
    out: list[str] = []
    skip = 0
    for word in argv:
        if skip:
            skip -= 1
        elif word in GENERATOR_OPTIONS:
            skip = GENERATOR_OPTIONS[word]
        else:
            out.append(word)
    return out


def normalised_options(argv: list[str]) -> list[str]:
    """`--opt=value` as `--opt value`, so two renderings of the same options compare equal."""
    out: list[str] = []
    for word in argv:
        if word.startswith("--") and "=" in word:
            out += word.split("=", 1)
        else:
            out.append(word)
    return out
