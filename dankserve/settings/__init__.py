"""dankserve's settings: one TOML file plus ``DANKSERVE_*`` variables, validated by pydantic.

Every key that any part of dankserve reads is declared here, with its default and its
meaning, so keys never change names. `docs/CONFIGURATION.md` is generated from this module.

Where the file lives: ``--config FILE``, else ``$DANKSERVE_CONFIG``, else
``/etc/dankserve/dankserve.toml``. A missing default file means "no deployments"; a missing
file that was named explicitly is an error. Environment variables override the file:
``DANKSERVE_PODMAN_URL``, ``DANKSERVE_STATE_DIR`` ... and nested keys with ``__``
(``DANKSERVE_DEPLOYMENTS__CHAT__PORT=8001``).

Security rules enforced here (each refusal is a ConfigError, exit 2, naming the key, the value
and the fix): a deployment bound to a non-loopback ``host`` must set ``api_key_file``; the
config file must not be writable by group or others nor owned by anyone but root or the user
running dankserve (it decides what runs as root); a secret file (``api_key_file``,
``hf_token_file``, ``cluster_token_file``) that exists must not be writable by its group nor
readable or writable by others.

The package: `values` (what any value must be), `sections` and `deployment` (the tables),
`model` (`Settings`), `files` (finding, trusting and loading the file), `reloading` (what a
reload applies and what waits for a restart), `source` (`SettingsSource`: the one holder of the
settings the daemon runs with).
"""

from __future__ import annotations

from dankserve.settings.deployment import DEFAULT_IMAGE, DeploymentSettings, Profile, PullPolicy, RuntimeKind
from dankserve.settings.files import (
    CONFIG_ENV,
    DEFAULT_CONFIG_PATH,
    MAX_CONFIG_BYTES,
    check_secret_files,
    config_dir_problem,
    config_file_problem,
    load_reload,
    load_settings,
    read_config_file,
    resolve_config_path,
    secret_file_problem,
    state_dir_despite_errors,
)
from dankserve.settings.model import DEFAULT_HF_CACHE_DIR, Settings, default_hf_cache_dir, keyless_gateway_exposure
from dankserve.settings.reloading import (
    ON_RELOAD,
    OnReload,
    ReloadEffects,
    global_keys,
    pending_changes,
    reload_effects,
)
from dankserve.settings.sections import (
    ClusterSettings,
    CpuOffloadSettings,
    GatewaySettings,
    ModelFactsSettings,
    SpeculativeSettings,
)
from dankserve.settings.source import SettingsSource, as_source
from dankserve.settings.values import MAX_GIB, MAX_SECONDS, check_address, is_loopback, parse_listen, split_listen

__all__ = [
    "CONFIG_ENV",
    "DEFAULT_CONFIG_PATH",
    "DEFAULT_HF_CACHE_DIR",
    "DEFAULT_IMAGE",
    "MAX_CONFIG_BYTES",
    "MAX_GIB",
    "MAX_SECONDS",
    "ON_RELOAD",
    "ClusterSettings",
    "CpuOffloadSettings",
    "DeploymentSettings",
    "GatewaySettings",
    "ModelFactsSettings",
    "OnReload",
    "Profile",
    "PullPolicy",
    "ReloadEffects",
    "RuntimeKind",
    "Settings",
    "SettingsSource",
    "SpeculativeSettings",
    "as_source",
    "check_address",
    "check_secret_files",
    "config_dir_problem",
    "config_file_problem",
    "default_hf_cache_dir",
    "global_keys",
    "is_loopback",
    "keyless_gateway_exposure",
    "load_reload",
    "load_settings",
    "parse_listen",
    "pending_changes",
    "read_config_file",
    "reload_effects",
    "resolve_config_path",
    "secret_file_problem",
    "split_listen",
    "state_dir_despite_errors",
]
