"""Stand-in NVIDIA GPUs (device nodes and a CDI spec): shipped as dankserve.testing.gpus (the demo
uses them too); re-exported here under the names the tests import."""

from dankserve.testing.gpus import (
    SPEC_PREFIX,
    StandInGpus,
    cdi_spec_text,
    make_nodes,
    remove_stale_specs,
    stand_in_gpus,
)

__all__ = ["SPEC_PREFIX", "StandInGpus", "cdi_spec_text", "make_nodes", "remove_stale_specs", "stand_in_gpus"]
