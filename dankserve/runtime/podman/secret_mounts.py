"""A snapshot deployment's secrets as files dankserve keeps and bind-mounts, instead of Podman secrets (issue 41).

Podman mounts a secret from the container's own directory (`userdata/secrets/NAME`, written when the container
is created), and a checkpoint's archive names that path in its OCI config. Podman 4.3.1's restore with import
creates a new container but mounts what the archive's config names: the removed container's path, gone
("runc: stat .../userdata/secrets/NAME: no such file or directory"). So a container whose snapshots are on
gets its secrets from files at a path that outlives it: `DIR/NAME` (DIR: root's, 0700, under the state dir;
files 0600, root's), bind-mounted read-only at the same place in the container (/run/secrets/NAME). They are
written from the deployment's files before the container is created and again before every restore (so the
archive's path exists), and deleted with the container (the `LABEL_SECRETS_DIR` label names the directory).
The archive holds none of them (a bind mount's file is not in it); the server's memory holds what it read.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dankserve.errors import ConfigError
from dankserve.runtime.base import SecretFile
from dankserve.secret_files import read_secret

LABEL_SECRETS_DIR = "io.dankserve.secrets-dir"
"""The directory a container's secret files are in (deleted with the container)."""
SECRETS_TARGET = "/run/secrets"


def write(directory: Path, secrets: Sequence[SecretFile]) -> None:
    """The deployment's secret files read (all first: a bad one fails before anything is written) and written
    into `directory` (made root's and 0700; a symlink or another owner's refused), each 0600, atomically."""
    values = [(s.name, read_secret(s.source, s.name)) for s in secrets]
    directory.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # `parents` alone would make it 0755
    directory.mkdir(mode=0o700, exist_ok=True)
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        raise ConfigError(
            f"the secrets directory {directory} is not a directory of this user's",
            fix=f"remove {directory}: dankserve makes it again",
        )
    os.chmod(directory, 0o700)
    for name, value in values:
        path = directory / name
        temp = directory / f".{name}.tmp"
        temp.unlink(missing_ok=True)
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(value)
        os.replace(temp, path)


def mounts(directory: Path, secrets: Sequence[SecretFile]) -> list[dict[str, Any]]:
    """The read-only bind mounts of the secret files, where Podman would mount its secrets."""
    return [
        {"type": "bind", "source": str(directory / s.name), "target": f"{SECRETS_TARGET}/{s.name}", "read_only": True}
        for s in secrets
    ]


def remove(attrs: dict[str, Any]) -> None:
    """A removed container's secret files deleted: the regular files its bind mounts under /run/secrets name in
    the directory its label names (nothing else: a label or a mount is not trusted to name any other file)."""
    labels = (attrs.get("Config") or {}).get("Labels") or {}
    named = labels.get(LABEL_SECRETS_DIR)
    if not named or not os.path.isabs(named):
        return
    directory = Path(named)
    for mount in attrs.get("Mounts") or ():
        source = Path(str(mount.get("Source") or ""))
        if not str(mount.get("Destination") or "").startswith(f"{SECRETS_TARGET}/") or source.parent != directory:
            continue
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(source).st_mode):
                source.unlink()
