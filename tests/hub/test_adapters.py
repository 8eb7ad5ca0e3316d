"""Tests for dankserve.hub.adapters: adapter directories found and read, after `dankserve pull` fetched them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dankserve.cli.main import main
from dankserve.errors import ConfigError
from dankserve.exitcodes import ExitCode
from dankserve.hub.adapters import adapter_facts
from dankserve.plan.models import CONTAINER_HF_CACHE
from dankserve.settings import DeploymentSettings
from dankserve.testing.config_file import write_config
from dankserve.testing.hub import StandInHub


def local_adapter(root: Path, rank: int = 8) -> Path:
    root.mkdir(parents=True)
    config = {"peft_type": "LORA", "r": rank, "lora_alpha": 16, "target_modules": ["q_proj", "v_proj"]}
    (root / "adapter_config.json").write_text(json.dumps(config))
    (root / "adapter_model.safetensors").write_bytes(b"\0" * 4096)
    return root


def test_a_local_adapter_is_read_and_mounted_in_a_container(tmp_path: Path) -> None:
    """Rank, modules and weight bytes from the directory; a container reads it at its mount, a process in place."""
    path = local_adapter(tmp_path / "sql")
    dep = DeploymentSettings(model="org/base", adapters={"sql": str(path)})
    (facts,) = adapter_facts(tmp_path / "hf", "d", dep)
    assert (facts.rank, facts.target_modules, facts.weights_bytes) == (8, ("q_proj", "v_proj"), 4096)
    assert facts.host_dir == str(path) and facts.server_path.startswith("/dankserve/adapters/sql-")
    (process,) = adapter_facts(tmp_path / "hf", "d", dep.model_copy(update={"runtime": "process"}))
    assert process.server_path == str(path) and process.host_dir is None


def test_missing_and_hostile_adapter_directories_are_config_errors(tmp_path: Path) -> None:
    """No directory, no adapter_config.json, a FIFO, no weights or a broken config: exit 2 naming it and the fix."""
    dep = DeploymentSettings(model="org/base", adapters={"sql": str(tmp_path / "absent")})
    with pytest.raises(ConfigError, match=r"adapters\.sql.*no such directory"):
        adapter_facts(tmp_path, "d", dep)
    (tmp_path / "file").write_text("{}")
    with pytest.raises(ConfigError, match=r"adapters\.sql = .*: a file, not a directory"):
        adapter_facts(tmp_path, "d", dep.model_copy(update={"adapters": {"sql": str(tmp_path / "file")}}))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match=r"^deployments\.d\.adapters\.sql: cannot read"):
        adapter_facts(tmp_path, "d", dep.model_copy(update={"adapters": {"sql": str(tmp_path / "empty")}}))
    fifo = tmp_path / "fifo"
    fifo.mkdir()
    os.mkfifo(fifo / "adapter_config.json")
    with pytest.raises(ConfigError, match=r"^deployments\.d\.adapters\.sql: .* not a regular file"):
        adapter_facts(tmp_path, "d", dep.model_copy(update={"adapters": {"sql": str(fifo)}}))
    unweighted = local_adapter(tmp_path / "unweighted")
    (unweighted / "adapter_model.safetensors").unlink()
    with pytest.raises(ConfigError, match=r"adapters\.sql = .*: no adapter_model\.safetensors or .* in ") as refused:
        adapter_facts(tmp_path, "d", dep.model_copy(update={"adapters": {"sql": str(unweighted)}}))
    assert refused.value.fix is not None and "save_pretrained" in refused.value.fix
    broken = local_adapter(tmp_path / "broken")
    (broken / "adapter_config.json").write_text('{"r": -1}')
    with pytest.raises(ConfigError, match="rank r = -1") as refused:
        adapter_facts(tmp_path, "d", dep.model_copy(update={"adapters": {"sql": str(broken)}}))
    assert refused.value.fix is not None and "PEFT LoRA" in refused.value.fix


def test_a_hub_adapter_needs_a_pull(tmp_path: Path) -> None:
    """A Hub adapter not in the HF cache: fix: `dankserve pull DEPLOYMENT`, or an absolute path if it meant one."""
    dep = DeploymentSettings(model="org/base", adapters={"sql": "org/sql-lora"})
    with pytest.raises(ConfigError, match="not in the HF cache") as refused:
        adapter_facts(tmp_path, "d", dep)
    assert refused.value.fix is not None and refused.value.fix.startswith("run `dankserve pull d` (it fetches")
    assert "give its absolute path (ORG/NAME is read as a Hub repo)" in refused.value.fix


def test_pull_fetches_a_deployments_hub_adapters(
    hub: StandInHub,
    hub_environment: dict[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`dankserve pull NAME` fetches the model's adapters too; the plan then reads them from the HF cache."""
    hub.add_adapter("lora/sql", rank=24)
    config = write_config(
        tmp_path / "dankserve.toml",
        {},
        {"d": {"model": "/models/local", "adapters": {"sql": "lora/sql"}}},
    )
    monkeypatch.setenv("DANKSERVE_CONFIG", str(config))
    with pytest.raises(SystemExit) as done:
        main(["pull", "d", "-q"])
    out = capsys.readouterr().out
    assert done.value.code == ExitCode.OK and "lora/sql: 2 of 2 files" in out
    hf = Path(hub_environment["DANKSERVE_HF_CACHE_DIR"])
    (facts,) = adapter_facts(hf, "d", DeploymentSettings(model="/models/local", adapters={"sql": "lora/sql"}))
    assert facts.rank == 24 and facts.weights_bytes > 0
    assert facts.server_path.startswith(f"{CONTAINER_HF_CACHE}/hub/models--lora--sql/snapshots/")
