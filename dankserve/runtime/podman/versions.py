"""The vLLM version per image ID, kept in a small JSON file so each image is run at most once."""

from __future__ import annotations

import json
from pathlib import Path

import structlog

log = structlog.get_logger("dankserve.runtime.podman")


class VersionCache:
    """vLLM version per image ID, kept in a small JSON file so each image is run at most once."""

    def __init__(self, path: Path | None) -> None:
        self._path = path
        self._versions: dict[str, str] = {}
        if path is not None:
            try:
                loaded = json.loads(path.read_text())
                if isinstance(loaded, dict):
                    self._versions = {str(k): str(v) for k, v in loaded.items()}
            except (OSError, ValueError):
                pass

    def get(self, image_id: str) -> str | None:
        return self._versions.get(image_id)

    def put(self, image_id: str, version: str) -> None:
        """Remember a version; kept in memory when the file cannot be written (read-only or full disk)."""
        self._versions[image_id] = version
        if self._path is None:
            return
        from dankserve.processes import write_private_file

        try:
            self._path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            write_private_file(self._path, json.dumps(self._versions, indent=1, sort_keys=True) + "\n")
        except OSError as exc:
            log.warning("version_cache_not_saved", path=str(self._path), error=exc.strerror or str(exc))
