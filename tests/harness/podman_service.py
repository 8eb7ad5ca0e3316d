"""The private Podman service of the tests: shipped as dankserve.testing.podman_service (the demo
uses it too); re-exported here under the names the tests and benchmarks import."""

from dankserve.testing.podman_service import (
    REQUIRED_TOOLS,
    SESSION_LABEL,
    PodmanEnv,
    containers_conf,
    leftover_containers,
    leftover_secrets,
    missing_requirements,
    podman_service,
    registries_conf,
    remove_containers,
    remove_images_from,
    run_root,
    storage_conf,
    storage_root,
)

__all__ = [
    "REQUIRED_TOOLS",
    "SESSION_LABEL",
    "PodmanEnv",
    "containers_conf",
    "leftover_containers",
    "leftover_secrets",
    "missing_requirements",
    "podman_service",
    "registries_conf",
    "remove_containers",
    "remove_images_from",
    "run_root",
    "storage_conf",
    "storage_root",
]
