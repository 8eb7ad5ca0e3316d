"""The stand-in GPUs' CDI specs (dankserve/testing/gpus.py) when several runs start at once (pytest-xdist's
workers): a spec is never seen half written, and one naming no node is not taken for another run's leftover.

Found stressing the suite on 10 workers: a worker's spec was deleted as stale by another worker's start while
it was being written, and every deployment of that worker failed with "GPU 0 ... has no CDI entry"."""

from __future__ import annotations

import os
from pathlib import Path

from dankserve.testing.gpus import SPEC_PREFIX, remove_stale_specs, stand_in_gpus


def test_a_spec_naming_no_node_is_kept_and_one_whose_nodes_are_gone_is_removed(tmp_path: Path) -> None:
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    half = cdi / f"{SPEC_PREFIX}half.yaml"
    half.write_text("")  # another run's, opened and not yet written
    gone = cdi / f"{SPEC_PREFIX}gone.yaml"
    gone.write_text(f"  - path: /dev/nvidia0\n    hostPath: {tmp_path}/absent/nvidia0\n")
    live = cdi / f"{SPEC_PREFIX}live.yaml"
    (tmp_path / "nvidia0").touch()
    live.write_text(f"  - path: /dev/nvidia0\n    hostPath: {tmp_path}/nvidia0\n")
    other = cdi / "nvidia.yaml"
    other.write_text("")
    remove_stale_specs(cdi)
    assert sorted(p.name for p in cdi.iterdir()) == sorted([half.name, live.name, other.name])


def test_a_spec_appears_whole_and_goes_with_its_nodes(tmp_path: Path) -> None:
    """Written beside its final name and renamed into place; nothing of it is left afterwards. (Needs mknod:
    the suite runs as root.)"""
    cdi = tmp_path / "cdi"
    with stand_in_gpus(tmp_path / "gpus", count=2, cdi_dir=cdi) as made:
        assert [p.name for p in cdi.iterdir()] == [made.cdi_spec.name]
        text = made.cdi_spec.read_text()
        assert all(g.uuid in text for g in made.gpus) and text.endswith("\n")
        remove_stale_specs(cdi)  # another run starting now leaves it
        assert made.cdi_spec.exists()
    assert os.listdir(cdi) == []
