"""The Podman runtime: vLLM in a container, driven through the Podman REST API (podman-py).

Split the way podman-py splits its client into managers: `session` (the connection: retries,
Podman's errors as dankserve's), `containers` (create and start with secrets, stop, remove, wait,
list), `images` (the pull policy, digests, the vLLM version an image holds), `streams` (log lines
and exit events), and `runtime` (`PodmanRuntime`, the Runtime made of them). The decisions are pure
functions: `cdi` (which GPU passthrough), `spec` (what the create request holds), `parsing` (how an
inspect document, a pull report or an event reads); `k8s_log` follows a container's k8s-file log
here, `versions` keeps each image's vLLM version. podman-py, requests and tenacity are imported only
when a runtime is built. docs/podman-runtime.md explains what the container gets and why.
"""

from dankserve.runtime.podman.cdi import (
    CDI_KIND_NVIDIA_GPU,
    CONTROL_NODES,
    DEFAULT_CDI_DIRS,
    GpuPassthrough,
    cdi_device_names,
    choose_gpu_passthrough,
    present_device_nodes,
    read_cdi_device_names,
)
from dankserve.runtime.podman.containers import (
    ContainerManager,
)
from dankserve.runtime.podman.images import (
    ImageManager,
)
from dankserve.runtime.podman.k8s_log import (
    conmon_exit_file,
    local_k8s_log,
    local_k8s_path,
)
from dankserve.runtime.podman.parsing import (
    LABEL_PROBE,
    LABEL_VLLM_VERSION,
    exit_event_from,
    is_transient,
    parse_podman_time,
    parse_vllm_version,
    pull_error,
    pull_progress,
    split_lines,
    with_default_tag,
    workload_from_inspect,
)
from dankserve.runtime.podman.runtime import (
    PodmanRuntime,
)
from dankserve.runtime.podman.session import (
    PODMAN_SOCKET_FIX,
    PodmanSession,
)
from dankserve.runtime.podman.spec import (
    HF_CACHE_TARGET,
    JOURNAL_SOCKET,
    SECRETS_DIR,
    container_create_kwargs,
    container_env,
    launch_request,
    secret_is_path,
    secret_name,
    serve_entrypoint,
    server_argv,
)
from dankserve.runtime.podman.streams import (
    LogStreams,
)
from dankserve.runtime.podman.versions import (
    VersionCache,
)

__all__ = [
    "CDI_KIND_NVIDIA_GPU",
    "CONTROL_NODES",
    "DEFAULT_CDI_DIRS",
    "HF_CACHE_TARGET",
    "JOURNAL_SOCKET",
    "LABEL_PROBE",
    "LABEL_VLLM_VERSION",
    "PODMAN_SOCKET_FIX",
    "SECRETS_DIR",
    "ContainerManager",
    "GpuPassthrough",
    "ImageManager",
    "LogStreams",
    "PodmanRuntime",
    "PodmanSession",
    "VersionCache",
    "cdi_device_names",
    "choose_gpu_passthrough",
    "conmon_exit_file",
    "container_create_kwargs",
    "container_env",
    "exit_event_from",
    "is_transient",
    "launch_request",
    "local_k8s_log",
    "local_k8s_path",
    "parse_podman_time",
    "parse_vllm_version",
    "present_device_nodes",
    "pull_error",
    "pull_progress",
    "read_cdi_device_names",
    "secret_is_path",
    "secret_name",
    "serve_entrypoint",
    "server_argv",
    "split_lines",
    "with_default_tag",
    "workload_from_inspect",
]
