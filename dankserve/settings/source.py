"""The one holder of the settings the daemon runs with: every part asks it, none keeps a copy.

Readers hold the `SettingsSource` and call `current()` where they use a value, so an accepted
reload reaches all of them at once; keys a reload cannot apply are kept at their running values
inside the source itself (`reloading.reload_effects`), so no reader sees a half-applied file.
"""

from __future__ import annotations

import threading

from dankserve.settings.model import Settings
from dankserve.settings.reloading import ReloadEffects


class SettingsSource:
    """The running settings (thread-safe), and the global keys that wait for a daemon restart."""

    def __init__(self, settings: Settings) -> None:
        self._lock = threading.Lock()
        self._current = settings
        self._needs_restart: tuple[str, ...] = ()

    def current(self) -> Settings:
        """The settings now (frozen: a reader keeps one for a whole decision)."""
        with self._lock:
            return self._current

    def needs_restart(self) -> tuple[str, ...]:
        """The global keys the last accepted file changed that keep their old value until a restart."""
        with self._lock:
            return self._needs_restart

    def accept(self, effects: ReloadEffects) -> None:
        """An accepted reload: its settings from now on (the only change: runtime facts such as the image an
        upgrade switched to live in state.json, never here)."""
        with self._lock:
            self._current = effects.settings
            self._needs_restart = effects.needs_restart


def as_source(settings: Settings | SettingsSource) -> SettingsSource:
    """The source itself, or a new one holding fixed settings (a part used without a daemon: tests, the CLI)."""
    return settings if isinstance(settings, SettingsSource) else SettingsSource(settings)
