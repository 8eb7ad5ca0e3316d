"""The daemon's weights download before a boot (the lifecycle's `downloading` stage).

`WeightsFetcher(settings)(name, dep, progress)` downloads what is missing of a deployment's
model into hf_cache_dir, calling `progress(percent)`, so vLLM never downloads inside its boot
(where it shows no progress and a slow download looks like a hang to the boot timeout). A
model already complete is recognised from the record of its last pull without the network,
so restarts do not depend on the Hub. Deployments whose weights dankserve does not fetch
(`download = false`, a local path, declared model_facts unless `download = true`) return at once.
The deployment's Hub LoRA adapters are fetched after the model (unless `download = false`): the
plan reads them from the HF cache.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dankserve.hub.access import hub_access, is_hub_id
from dankserve.hub.download import Progress
from dankserve.settings import DeploymentSettings, Settings, SettingsSource, as_source

PercentCallback = Callable[[int], None]


def wants_download(dep: DeploymentSettings) -> bool:
    """Whether dankserve fetches this deployment's weights before booting it."""
    if dep.download is not None:
        return dep.download and is_hub_id(dep.model)
    return is_hub_id(dep.model) and dep.model_facts is None


def hub_adapters(dep: DeploymentSettings) -> list[str]:
    """The Hub repos of a deployment's LoRA adapters (local directories are not fetched)."""
    from dankserve.lora_adapters import parse_source

    sources = (parse_source(name, value) for name, value in dep.adapters.items())
    return list(dict.fromkeys(s.location for s in sources if s.kind == "hub"))


@dataclass(frozen=True)
class WeightsFetcher:
    """Fetches a deployment's weights; raises DankserveError (InvalidInput: permanent)."""

    settings: Settings | SettingsSource
    """The daemon's source (each download reads the settings of its moment), or fixed settings."""

    def __call__(self, name: str, dep: DeploymentSettings, progress: PercentCallback) -> None:
        from dankserve.hub.pull import complete_locally, pull

        settings = as_source(self.settings).current()
        access = hub_access(settings.hf_cache_dir, settings.state_dir, name, dep.hf_token_file)
        if dep.download is not False:
            for repo in hub_adapters(dep):  # small: fetched first, without progress of their own
                if not complete_locally(access, repo, None):
                    pull(access, repo, None)
        if not wants_download(dep):
            return
        if complete_locally(access, dep.model, dep.revision):
            progress(100)
            return
        last = [-1]

        def on_progress(p: Progress) -> None:
            if int(p.percent) != last[0]:
                last[0] = int(p.percent)
                progress(last[0])

        pull(access, dep.model, dep.revision, on_progress)
        progress(100)
