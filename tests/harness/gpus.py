"""Stand-in NVIDIA GPUs (device nodes and a CDI spec): shipped as dankserve.testing.gpus (the demo
uses them too); re-exported here under the names the tests import, and whether NVML can be used here (the
tests that need a real GPU skip without one)."""

from dankserve.testing.gpus import (
    SPEC_PREFIX,
    StandInGpus,
    cdi_spec_text,
    make_nodes,
    remove_stale_specs,
    stand_in_gpus,
)

__all__ = [
    "SPEC_PREFIX",
    "StandInGpus",
    "cdi_spec_text",
    "make_nodes",
    "nvml_unusable_reason",
    "remove_stale_specs",
    "stand_in_gpus",
]


def nvml_unusable_reason() -> str | None:
    """Why NVML cannot be used here (no package, no driver, no GPU), or None when it can."""
    try:
        import pynvml
    except ImportError:
        return "the nvidia-ml-py package is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return f"NVML cannot be initialised ({exc})"
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return "NVML sees no GPU"
    finally:
        pynvml.nvmlShutdown()
    return None
