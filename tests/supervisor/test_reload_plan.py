"""Tests for dankserve.supervisor.control.reload_plan: a reload as a typed plan, computed from the running
settings, the file's and what each deployment does now. Pure: no daemon, no thread, no file."""

from __future__ import annotations

from typing import Any

from dankserve.settings import Settings
from dankserve.settings.reloading import reload_effects
from dankserve.state import UpgradeRecord
from dankserve.supervisor.control.reload_plan import (
    DeploymentNow,
    ImageFromConfig,
    Keep,
    LoadAdapters,
    ReloadPlan,
    Restart,
    Start,
    Stop,
    plan_reload,
)
from dankserve.supervisor.worker.adapters import AdapterChanges

ALIVE = DeploymentNow(alive=True, ready=True)
ENDED = DeploymentNow(alive=False)


def settings(deployments: dict[str, dict[str, Any]], **globals_: Any) -> Settings:
    return Settings.model_validate({**globals_, "deployments": deployments})


def dep(port: int, **extra: Any) -> dict[str, Any]:
    return {"model": "org/m", "image": "img:1", "port": port, "runtime": "process", **extra}


def plan(old: Settings, new: Settings, views: dict[str, DeploymentNow], down: tuple[str, ...] = ()) -> ReloadPlan:
    return plan_reload(old, reload_effects(old, new), views, down)


def test_an_unchanged_file_keeps_every_deployment_and_changes_no_key() -> None:
    """The same file: every supervised deployment kept as it runs (alive or ended), nothing applied."""
    old = settings({"a": dep(8001), "b": dep(8002)})
    done = plan(old, old, {"a": ALIVE, "b": ENDED})
    assert done.actions == (Keep("a"), Keep("b"))
    assert done.refusal is None and done.applied == () and done.needs_restart == () and done.images == ()


def test_a_removed_or_disabled_deployment_stops() -> None:
    """Gone from the file, or `enabled = false`: its worker stops."""
    old = settings({"a": dep(8001), "b": dep(8002)})
    new = settings({"b": dep(8002, enabled=False)})
    assert plan(old, new, {"a": ALIVE, "b": ALIVE}).actions == (Stop("a"), Stop("b"))


def test_a_changed_server_restarts_when_running_and_starts_when_its_worker_ended() -> None:
    """A setting the plan reads changed: the running worker boots it; an ended worker is started anew."""
    old = settings({"a": dep(8001), "b": dep(8002)})
    new = settings({"a": dep(8001, max_num_seqs=8), "b": dep(8002, max_num_seqs=8)})
    done = plan(old, new, {"a": ALIVE, "b": ENDED})
    assert done.actions == (Restart("a", new.deployments["a"]), Start("b", new.deployments["b"]))
    assert done.names(Restart) == ("a",) and done.names(Start) == ("b",)


def test_a_new_deployment_starts_unless_it_was_taken_down() -> None:
    """Added to the file: started after the supervised ones; one `dankserve down` took down stays down, and a
    disabled one is not started."""
    old = settings({"a": dep(8001)})
    new = settings({"a": dep(8001), "b": dep(8002), "c": dep(8003), "d": dep(8004, enabled=False)})
    done = plan(old, new, {"a": ALIVE}, down=("c",))
    assert done.actions == (Keep("a"), Start("b", new.deployments["b"]))


def test_a_member_joining_a_running_group_joins_asleep_and_a_new_group_boots() -> None:
    """A swap member added to a group that already runs joins asleep; the first member of a new group boots."""
    member = {"gpus": [0], "gpu_memory_utilization": 0.4, "swap_group": "g", "sleep_level": "1"}
    old = settings({"a": dep(8001, **member)})
    new = settings(
        {"a": dep(8001, **member), "b": dep(8002, **member), "c": dep(8003, **{**member, "swap_group": "h"})}
    )
    done = plan(old, new, {"a": ALIVE})
    assert done.actions[1:] == (
        Start("b", new.deployments["b"], join_asleep=True),
        Start("c", new.deployments["c"], join_asleep=False),
    )
    # A group whose only member's worker ended does not run: the new member boots.
    assert plan(old, new, {"a": ENDED}).actions[1] == Start("b", new.deployments["b"], join_asleep=False)


def test_only_swap_settings_changed_keeps_the_server_with_the_new_settings() -> None:
    """pinned, idle_sleep_seconds: read by the swap coordinator only; the server stays, the settings are handed over."""
    member = {"gpus": [0], "gpu_memory_utilization": 0.4, "swap_group": "g", "sleep_level": "1"}
    old = settings({"a": dep(8001, **member)})
    new = settings({"a": dep(8001, **member, idle_sleep_seconds=600)})
    assert plan(old, new, {"a": ALIVE}).actions == (Keep("a", new.deployments["a"]),)
    # An ended worker starts again with them.
    assert plan(old, new, {"a": ENDED}).actions == (Start("a", new.deployments["a"]),)


def test_only_adapters_changed_on_a_ready_server_loads_them_in_place() -> None:
    """A ready server with LoRA: the adapter changes are loaded and unloaded; a server not ready restarts."""
    old = settings({"a": dep(8001, adapters={"sql": "org/sql"})})
    new = settings({"a": dep(8001, adapters={"sql": "org/sql-v2", "code": "org/code"})})
    change = AdapterChanges({"sql": "org/sql-v2", "code": "org/code"}, ("sql",))
    assert plan(old, new, {"a": ALIVE}).actions == (LoadAdapters("a", new.deployments["a"], change),)
    booting = DeploymentNow(alive=True, ready=False)
    assert plan(old, new, {"a": booting}).actions == (Restart("a", new.deployments["a"]),)


def test_global_keys_are_applied_or_wait_for_a_restart() -> None:
    """vllm_version applies at the next plan; boot_timeout_seconds waits for a daemon restart."""
    old = settings({"a": dep(8001)})
    new = settings({"a": dep(8001)}, vllm_version="0.34.0", boot_timeout_seconds=999)
    done = plan(old, new, {"a": ALIVE})
    assert done.applied == ("vllm_version",) and done.needs_restart == ("boot_timeout_seconds",)


def switched(old: str = "img:1", new: str = "img:2") -> UpgradeRecord:
    return UpgradeRecord("switched", old, new, 0.0)


def test_a_file_keeping_the_image_keeps_the_upgraded_one() -> None:
    """An upgrade switched the deployment to img:2 (state.json keeps it): a file that still names img:1 keeps
    the server, and the plan names no image change."""
    old = settings({"a": dep(8001)})
    done = plan(old, old, {"a": DeploymentNow(alive=True, ready=True, upgrade=switched())})
    assert done.actions == (Keep("a"),) and done.images == ()


def test_a_file_naming_another_image_wins_over_the_upgrade_and_says_so() -> None:
    """The file names img:3 where an upgrade had switched img:1 to img:2: the deployment restarts on img:3 and
    the plan says which image it leaves. Without a switched upgrade a new image is a plain restart."""
    old = settings({"a": dep(8001)})
    new = settings({"a": dep(8001, image="img:3")})
    done = plan(old, new, {"a": DeploymentNow(alive=True, ready=True, upgrade=switched())})
    assert done.actions == (Restart("a", new.deployments["a"]),)
    assert done.images == (ImageFromConfig("a", upgraded="img:2", configured="img:3"),)
    rolled_back = UpgradeRecord("rolled_back", "img:1", "img:2", 0.0)
    assert plan(old, new, {"a": DeploymentNow(alive=True, upgrade=rolled_back)}).images == ()
    assert plan(old, new, {"a": ALIVE}).images == ()


def test_a_reload_changing_a_deployment_under_upgrade_is_refused() -> None:
    """Its worker and its trial server would both act on the new settings: refused with the fix, nothing done.
    A reload that leaves it as it is goes through."""
    old = settings({"a": dep(8001), "b": dep(8002)})
    upgrading = DeploymentNow(alive=True, ready=True, upgrading=True)
    refused = plan(old, settings({"a": dep(8001, max_num_seqs=8), "b": dep(8002)}), {"a": upgrading, "b": ALIVE})
    assert refused.actions == () and refused.refusal is not None and "'a' is being upgraded" in refused.refusal
    assert refused.refusal_fix is not None and "upgrade has ended" in refused.refusal_fix
    assert plan(old, settings({"b": dep(8002)}), {"a": upgrading, "b": ALIVE}).refusal is not None  # a removed
    other = settings({"a": dep(8001), "b": dep(8002, max_num_seqs=8)})
    accepted = plan(old, other, {"a": upgrading, "b": ALIVE})
    assert accepted.refusal is None and accepted.actions == (Keep("a"), Restart("b", other.deployments["b"]))
