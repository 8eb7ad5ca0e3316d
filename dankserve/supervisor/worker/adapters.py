"""LoRA adapters changed by a reload, applied to the running server instead of a restart.

`changes` is pure: a reload whose settings differ only in `adapters`, on a server that already
runs with LoRA (it was planned with adapters, so `--enable-lora` and
VLLM_ALLOW_RUNTIME_LORA_UPDATING=True), becomes loads and unloads. Turning LoRA on (no adapters
before) still restarts: `--enable-lora` and the slots are fixed at start-up. So does a local
adapter directory added to a container (it is mounted at creation only). `apply` is the edge:
vLLM's `POST /v1/unload_lora_adapter` and `/v1/load_lora_adapter` (vLLM 0.26:
vllm/entrypoints/serve/lora/api_router.py); any refusal (a rank above the server's
--max-lora-rank, a broken directory) answers False, and the reload restarts the server instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import structlog

from dankserve.backend_address import BackendAddress, httpx_client
from dankserve.lora_adapters import parse_source
from dankserve.settings import DeploymentSettings

log = structlog.get_logger(__name__)

ADAPTER_REQUEST_SECONDS = 120.0
"""A load reads the adapter's weights into the engine's CPU cache: seconds for large ones."""


@dataclass(frozen=True)
class AdapterChanges:
    """What a reload changes of a running server's adapters: names to load (with their sources) and to unload."""

    load: Mapping[str, str]
    unload: tuple[str, ...]


def changes(old: DeploymentSettings, new: DeploymentSettings) -> AdapterChanges | None:
    """The adapter loads and unloads that turn `old`'s server into `new`'s, or None when it must restart."""
    if not old.adapters or old.model_copy(update={"adapters": new.adapters}) != new:
        return None  # LoRA off before (flags fixed at start-up), or more than the adapters changed
    load = {n: v for n, v in new.adapters.items() if old.adapters.get(n) != v}
    if new.runtime != "process" and any(parse_source(n, v).kind == "path" for n, v in load.items()):
        return None  # a container sees a local directory only through a mount made at its creation
    unload = tuple(n for n, v in old.adapters.items() if new.adapters.get(n) != v)
    return AdapterChanges(load, unload)


def apply(
    address: BackendAddress,
    api_key: str | None,
    change: AdapterChanges,
    server_paths: Callable[[], Mapping[str, str]],
    timeout: float = ADAPTER_REQUEST_SECONDS,
) -> bool:
    """Unload, then load, on the running server; False (logged) at the first refusal or failure.

    `server_paths`: each adapter to load, the path the server reads it from (raises a
    DankserveError when one is not found: the restart then reports it)."""
    from dankserve.errors import DankserveError

    try:
        paths = server_paths()
    except DankserveError as exc:
        log.warning("adapters_not_loaded", error=exc.message, then="restart")
        return False
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx_client(address, headers, timeout) as client:
            for name in change.unload:
                if not _post(client, "/v1/unload_lora_adapter", {"lora_name": name}, name, ok_missing=True):
                    return False
            for name in change.load:
                if not _post(client, "/v1/load_lora_adapter", {"lora_name": name, "lora_path": paths[name]}, name):
                    return False
    except httpx.HTTPError as exc:
        log.warning("adapters_not_loaded", error=f"{type(exc).__name__}: {exc}", then="restart")
        return False
    log.info("adapters_reloaded", loaded=list(change.load), unloaded=list(change.unload), server="kept")
    return True


def _post(client: httpx.Client, path: str, body: dict[str, str], name: str, *, ok_missing: bool = False) -> bool:
    response = client.post(path, json=body)
    if response.status_code == 200 or (ok_missing and response.status_code == 404):
        return True
    log.warning(
        "adapters_not_loaded",
        adapter=name,
        route=path,
        status=response.status_code,
        answer=response.text[:300],
        then="restart",
    )
    return False


def server_paths_for(hf_cache_dir: Path, deployment: str, dep: DeploymentSettings, names: list[str]) -> dict[str, str]:
    """The server's path of each named adapter (read as a boot's plan reads them)."""
    from dankserve.hub.adapters import adapter_facts

    only = dep.model_copy(update={"adapters": {n: dep.adapters[n] for n in names}})
    return {f.name: f.server_path for f in adapter_facts(hf_cache_dir, deployment, only)}
