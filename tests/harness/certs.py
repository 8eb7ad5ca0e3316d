"""A group's certificates made by scripts/cluster-certs.sh, the script the docs tell users to run."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dankserve.cluster.api import GroupTls, load_tls

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "cluster-certs.sh"


@dataclass(frozen=True)
class HostCert:
    ca: Path
    cert: Path
    key: Path

    def tls(self) -> GroupTls:
        return load_tls(self.ca, self.cert, self.key)

    def settings(self) -> dict[str, str]:
        """The [cluster] keys naming these files."""
        return {"tls_ca_file": str(self.ca), "tls_cert_file": str(self.cert), "tls_key_file": str(self.key)}


def group_certs(directory: Path, addresses: Sequence[str]) -> dict[str, HostCert]:
    """The CA (created once per directory) and a certificate per address."""
    subprocess.run(["sh", str(SCRIPT), str(directory), *addresses], check=True, capture_output=True)
    return {a: HostCert(directory / "ca.pem", directory / f"{a}.pem", directory / f"{a}.key") for a in addresses}
