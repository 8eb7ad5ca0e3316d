"""A reload as a plan: `plan_reload(old, effects, views) -> ReloadPlan`. Pure.

In the manner of pipx's `reconcile.py`: the running settings, the accepted file's effects
(`settings.reloading.ReloadEffects`) and what each deployment is doing now (`DeploymentNow`) go
in; a typed plan comes out: stop these deployments, restart these, start these, keep these (with
their new settings when only what the swap coordinator reads changed), load and unload these
adapters in place (restarting the server if one is refused), apply these global keys now, leave
these until the daemon restarts; or refuse the whole reload, with the reason. The daemon only
executes the plan (`Daemon._apply_reload`), in the plan's order.

The image a deployment runs is a runtime fact kept in state.json (an upgrade's switch,
`records.serving_image`), never written into the settings: a reload whose file keeps the
deployment's image keeps the upgraded one; a file that names another image wins over the
upgrade, and the plan says so (`ImageFromConfig`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from dankserve.settings import DeploymentSettings, ReloadEffects, Settings
from dankserve.state import UpgradeRecord
from dankserve.supervisor.fleet import swap
from dankserve.supervisor.records import serving_image
from dankserve.supervisor.worker.adapters import AdapterChanges, changes


@dataclass(frozen=True)
class DeploymentNow:
    """What a reload needs to know of one deployment the daemon supervises now."""

    alive: bool
    """Its worker runs (a worker that gave up, or stopped, is not alive)."""
    ready: bool = False
    """Its server serves now (adapters are changed in place only in a ready server)."""
    upgrading: bool = False
    """An upgrade of it is under way (its trial server boots or is checked)."""
    upgrade: UpgradeRecord | None = None
    """Its last upgrade as state.json keeps it (the image it switched to)."""


@dataclass(frozen=True)
class Stop:
    """Removed from the file, or disabled: its worker is retired (not waited for)."""

    name: str


@dataclass(frozen=True)
class Restart:
    """Its server plans differently: the running worker boots the new settings."""

    name: str
    dep: DeploymentSettings


@dataclass(frozen=True)
class Start:
    """A new worker: added, enabled again, or changed while its worker had ended."""

    name: str
    dep: DeploymentSettings
    join_asleep: bool = False
    """A swap member joining a group that already runs: it joins asleep (`swap.joins_asleep`)."""


@dataclass(frozen=True)
class Keep:
    """Left as it runs; `dep`: settings that plan the same server (only swap settings changed), handed over."""

    name: str
    dep: DeploymentSettings | None = None


@dataclass(frozen=True)
class LoadAdapters:
    """Only its LoRA adapters changed and its server is ready: loaded and unloaded in place; a refusal
    restarts it with `dep` instead."""

    name: str
    dep: DeploymentSettings
    change: AdapterChanges


@dataclass(frozen=True)
class ImageFromConfig:
    """The file names another image than the deployment's before: it wins over the upgrade that had switched
    the deployment to `upgraded` (said in the log; the upgrade is recorded as left)."""

    name: str
    upgraded: str
    configured: str


DeploymentAction = Stop | Restart | Start | Keep | LoadAdapters


@dataclass(frozen=True)
class ReloadPlan:
    """What an accepted reload does, or why it is refused (then nothing is done)."""

    actions: tuple[DeploymentAction, ...] = ()
    """One per deployment, in the order the daemon runs them: the supervised ones first, then the new ones."""
    images: tuple[ImageFromConfig, ...] = ()
    applied: tuple[str, ...] = ()
    """Global keys the file changed that are in force at once."""
    needs_restart: tuple[str, ...] = ()
    """Global keys the file changed that keep their running values until the daemon restarts."""
    refusal: str | None = None
    refusal_fix: str | None = None

    def names(self, kind: type[DeploymentAction]) -> tuple[str, ...]:
        return tuple(a.name for a in self.actions if isinstance(a, kind))


def plan_reload(
    old: Settings, effects: ReloadEffects, views: Mapping[str, DeploymentNow], down: Collection[str] = ()
) -> ReloadPlan:
    """The plan that turns the running deployments (`views`, planned from `old`) into `effects.settings`';
    `down`: the deployments `dankserve down` took down (they stay down)."""
    new = effects.settings
    refusal = _refusal(old, new, views)
    if refusal is not None:
        return ReloadPlan(refusal=refusal[0], refusal_fix=refusal[1])
    actions: list[DeploymentAction] = []
    images: list[ImageFromConfig] = []
    for name, now in views.items():
        dep, before = new.deployments.get(name), old.deployments.get(name)
        if dep is None or not dep.enabled:
            actions.append(Stop(name))
            continue
        image = _image_from_config(name, before, dep, now.upgrade)
        if image is not None:
            images.append(image)
        actions.append(_changed(name, before, dep, now))
    started = {a.name for a in actions if isinstance(a, Start)}
    kept = {a.name for a in actions if not isinstance(a, Stop)}
    groups = [new.deployments[n].swap_group for n in kept if views[n].alive or n in started]
    for name, dep in new.deployments.items():
        if name not in views and dep.enabled and name not in down:
            actions.append(Start(name, dep, join_asleep=swap.joins_asleep(dep.swap_group, groups)))
    return ReloadPlan(tuple(actions), tuple(images), effects.applied, effects.needs_restart)


def _changed(
    name: str, before: DeploymentSettings | None, dep: DeploymentSettings, now: DeploymentNow
) -> DeploymentAction:
    """What becomes of a supervised deployment the file keeps."""
    if dep == before:
        return Keep(name)
    if before is not None:
        change = changes(before, dep)
        if change is not None and now.alive and now.ready:
            return LoadAdapters(name, dep, change)
        if now.alive and swap.server_unchanged(before, dep):
            return Keep(name, dep)  # only what the swap coordinator reads: the server, awake or asleep, stays
    return Restart(name, dep) if now.alive else Start(name, dep)


def _image_from_config(
    name: str, before: DeploymentSettings | None, dep: DeploymentSettings, record: UpgradeRecord | None
) -> ImageFromConfig | None:
    """The file's new image where it replaces the one an upgrade switched the deployment to."""
    if before is None or before.image == dep.image:
        return None
    upgraded = serving_image(before.image, record)
    if upgraded == before.image:
        return None  # no upgrade had switched it
    return ImageFromConfig(name, upgraded, dep.image)


def _refusal(old: Settings, new: Settings, views: Mapping[str, DeploymentNow]) -> tuple[str, str] | None:
    """Why the reload cannot be done now: a deployment under upgrade whose settings it changes (its worker and
    the trial server would both act on them)."""
    for name, now in views.items():
        if now.upgrading and old.deployments.get(name) != new.deployments.get(name):
            return (
                f"deployment {name!r} is being upgraded, and the file changes its settings",
                f"reload again once the upgrade has ended (`dankserve status {name}` shows it)",
            )
    return None
