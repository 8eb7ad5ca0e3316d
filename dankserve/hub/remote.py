"""Model facts from the Hub over the network, kept under the state dir.

`config.json` and the safetensors headers (parameter count per dtype, read with Range
requests, never the weights) through huggingface_hub's `HfApi`. What was read is written to
`state_dir/model-facts/` (one JSON file per endpoint, model and revision), so a later plan
needs no network. Every way the Hub can refuse becomes a DankserveError naming the model
and the fix: exit 2 for an unknown or gated model or revision, exit 3 for no network.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dankserve.errors import HubUnreachable, ModelAccessDenied, ModelNotFound
from dankserve.hub.access import HubAccess
from dankserve.hub.answers import checked_commit
from dankserve.plan.models import bytes_of_parameters

if TYPE_CHECKING:
    from huggingface_hub import HfApi

FACTS_SCHEMA = 1
HUB_TIMEOUT_SECONDS = 10.0
"""Per request: a Hub that does not answer is reported, never waited on for ever."""


@dataclass(frozen=True)
class HubModel:
    """What the Hub said about one model at one revision."""

    model: str
    revision: str | None
    endpoint: str
    commit: str
    config: dict[str, Any]
    parameter_bytes: int | None


def facts_file(access: HubAccess, model: str, revision: str | None) -> Path:
    key = hashlib.sha256(f"{access.endpoint}\n{model}\n{revision or 'main'}".encode()).hexdigest()[:32]
    return access.facts_dir / f"{key}.json"


def read_cached(access: HubAccess, model: str, revision: str | None) -> HubModel | None:
    """Facts fetched earlier for this endpoint, model and revision (None when absent or unreadable)."""
    try:
        data = json.loads(facts_file(access, model, revision).read_text(encoding="utf-8"))
        if data.pop("schema", None) != FACTS_SCHEMA:
            return None
        found = HubModel(**data)
    except (OSError, ValueError, TypeError):
        return None
    if (found.model, found.revision, found.endpoint) != (model, revision, access.endpoint):
        return None
    return found


def write_cached(access: HubAccess, found: HubModel) -> None:
    """Keep the facts (0600 in a 0700 dir, atomically); a state dir we may not write is skipped."""
    path = facts_file(access, found.model, found.revision)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".facts-")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump({"schema": FACTS_SCHEMA, **asdict(found)}, out)
        os.replace(tmp, path)
    except OSError:
        return  # e.g. `dankserve plan` as a user beside a root daemon: plan anyway, fetch again next time


@contextmanager
def hub_errors(access: HubAccess, model: str, revision: str | None) -> Iterator[None]:
    """huggingface_hub's errors as dankserve's, each naming the model and the fix."""
    import httpx2
    from huggingface_hub.errors import (
        DisabledRepoError,
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"{model}" + (f" (revision {revision})" if revision else "")
    try:
        yield
    except GatedRepoError:
        raise ModelAccessDenied(
            f"{where} is a gated model on {access.endpoint} and "
            + ("the token in hf_token_file may not read it" if access.token else "no token is configured"),
            fix=f"accept its licence at {access.endpoint}/{model} while logged in, then put a token of that "
            "account in a file (chmod 600) and set hf_token_file to it",
        ) from None
    except RevisionNotFoundError:
        raise ModelNotFound(
            f"{model} on {access.endpoint} has no revision {revision or 'main'!r}",
            fix="set revision to a branch, tag or commit the repo has, or remove revision for main",
        ) from None
    except (RepositoryNotFoundError, DisabledRepoError):
        private = "" if access.token else " (a private model needs a token: set hf_token_file)"
        raise ModelNotFound(
            f"no model {model!r} on {access.endpoint}{private}",
            fix=f"check the model id (ORG/NAME as on {access.endpoint}) in the deployment's model",
        ) from None
    except (OfflineModeIsEnabled, LocalEntryNotFoundError, httpx2.TransportError) as exc:
        raise _unreachable(access, where, str(exc)) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else "no"
        raise _unreachable(access, where, f"HTTP {status}") from None


def _unreachable(access: HubAccess, where: str, detail: str) -> HubUnreachable:
    return HubUnreachable(
        f"cannot read {where} from {access.endpoint} ({detail.splitlines()[0][:200] if detail else 'no answer'}) "
        f"and it is not in the HF cache ({access.cache_dir})",
        fix="connect this host to the Hub (or set HF_ENDPOINT to a mirror), run `dankserve pull` where it can, "
        "or declare the deployment's model_facts",
    )


def offline_error(access: HubAccess, model: str, revision: str | None) -> HubUnreachable:
    where = f"{model}" + (f" (revision {revision})" if revision else "")
    return HubUnreachable(
        f"HF_HUB_OFFLINE is set and {where} is neither in the HF cache ({access.cache_dir}) nor in "
        f"dankserve's model facts ({access.facts_dir})",
        fix="unset HF_HUB_OFFLINE for one `dankserve plan` or `dankserve pull`, "
        "or declare the deployment's model_facts",
    )


def fetch(access: HubAccess, model: str, revision: str | None) -> HubModel:
    """Read config.json and the safetensors headers from the Hub (no weights)."""
    if access.offline:
        raise offline_error(access, model, revision)
    from huggingface_hub import HfApi
    from huggingface_hub.utils.tqdm import disable_progress_bars

    disable_progress_bars()
    token: str | bool | None = access.token
    api = HfApi(endpoint=access.endpoint, token=token)
    with hub_errors(access, model, revision):
        info = api.model_info(model, revision=revision, token=token, timeout=HUB_TIMEOUT_SECONDS)
        commit = checked_commit(access.endpoint, model, revision, info.sha)
        names = {s.rfilename for s in info.siblings or ()}
        # into a scratch cache, not the HF cache: a snapshot holding only config.json would look like a
        # cached model (and huggingface_hub's get_safetensors_metadata would write to its default cache)
        with tempfile.TemporaryDirectory(prefix="dankserve-facts-") as scratch:
            config = _load(api.hf_hub_download(model, "config.json", revision=commit, cache_dir=scratch))
            if SINGLE in names:
                shards = [SINGLE]
            elif INDEX in names:
                index = _load(api.hf_hub_download(model, INDEX, revision=commit, cache_dir=scratch))
                weight_map = index.get("weight_map")
                shards = sorted(set(weight_map.values())) if isinstance(weight_map, dict) else []
            else:
                shards = []  # .bin or GGUF weights only: the size stays unknown, with a warning
        parameter_bytes = _parameter_bytes(api, model, commit, shards) if shards else None
    found = HubModel(model, revision, access.endpoint, commit, config, parameter_bytes)
    write_cached(access, found)
    return found


SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
HEADER_READERS = 8


def _parameter_bytes(api: HfApi, model: str, commit: str, shards: list[str]) -> int | None:
    """Weight bytes from the shards' safetensors headers (each a Range request, read in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    from huggingface_hub.errors import SafetensorsParsingError

    def read(shard: str) -> dict[str, int]:
        return {
            str(k): v
            for k, v in api.parse_safetensors_file_metadata(model, shard, revision=commit).parameter_count.items()
        }

    totals: dict[str, int] = {}
    try:
        with ThreadPoolExecutor(max_workers=min(HEADER_READERS, len(shards))) as pool:
            for counts in pool.map(read, shards):
                for dtype, count in counts.items():
                    totals[dtype] = totals.get(dtype, 0) + count
    except SafetensorsParsingError:
        return None
    return bytes_of_parameters(totals)


def _load(path: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cached_or_fetch(access: HubAccess, model: str, revision: str | None) -> HubModel:
    """The facts kept under the state dir, else fetched from the Hub (and kept)."""
    return read_cached(access, model, revision) or fetch(access, model, revision)
