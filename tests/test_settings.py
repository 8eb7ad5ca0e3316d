"""Tests for dankserve.settings."""

import os
import re
from pathlib import Path

import pytest

from dankserve.errors import ConfigError
from dankserve.file_trust import dir_problem as config_dir_problem
from dankserve.secret_files import secret_file_problem
from dankserve.settings import (
    MAX_CONFIG_BYTES,
    DeploymentSettings,
    config_file_problem,
    is_loopback,
    load_settings,
    parse_listen,
)


def write(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "dankserve.toml"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_absent_default_file_means_no_deployments(tmp_path: Path) -> None:
    """Without a config file the settings load with defaults and no deployments."""
    settings = load_settings(None, environ={})
    assert settings.deployments == {} or isinstance(settings.deployments, dict)


def test_named_missing_file_is_invalid_input(tmp_path: Path) -> None:
    """A config file named explicitly but absent is an error naming the path."""
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(tmp_path / "nope.toml", environ={})


def test_unknown_key_names_key_and_value(tmp_path: Path) -> None:
    """An unknown key is rejected with the file, the key and its value."""
    path = write(tmp_path, '[deployments.chat]\nmodel = "m"\nflavour = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "deployments.chat.flavour" in info.value.message
    assert str(path) in info.value.message


def test_two_deployments_on_one_port_are_invalid(tmp_path: Path) -> None:
    """Two deployments on the same port are rejected, naming both."""
    path = write(tmp_path, '[deployments.a]\nmodel = "m"\n[deployments.b]\nmodel = "n"\n')
    with pytest.raises(ConfigError, match="both use port 8000"):
        load_settings(path, environ={})


def test_env_overrides_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DANKSERVE_* variables override the file's values."""
    path = write(tmp_path, 'podman_url = "unix:///file.sock"\n')
    monkeypatch.setenv("DANKSERVE_PODMAN_URL", "unix:///env.sock")
    assert load_settings(path).podman_url == "unix:///env.sock"


def test_bad_toml_is_invalid_input(tmp_path: Path) -> None:
    """A file that is not TOML is an error naming the file."""
    path = write(tmp_path, "deployments = [")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(path, environ={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("192.168.1.10", False),
        ("gpu1.example", False),
    ],
)
def test_is_loopback(host: str, loopback: bool) -> None:
    """Loopback addresses and `localhost` count as loopback; every other address or name does not."""
    assert is_loopback(host) is loopback


def test_default_bind_address_is_loopback() -> None:
    """A deployment binds to 127.0.0.1 unless told otherwise."""
    assert DeploymentSettings(model="m").host == "127.0.0.1"


def test_non_loopback_host_without_api_key_is_refused(tmp_path: Path) -> None:
    """host = 0.0.0.0 without api_key_file is refused, naming the key, the value and the fix."""
    path = write(tmp_path, '[deployments.chat]\nmodel = "m"\nhost = "0.0.0.0"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "deployments.chat" in info.value.message
    assert "host = '0.0.0.0'" in info.value.message
    assert "api_key_file" in info.value.message and "127.0.0.1" in info.value.message


def test_non_loopback_host_with_api_key_is_accepted(tmp_path: Path) -> None:
    """host = 0.0.0.0 with an api_key_file loads."""
    path = write(tmp_path, '[deployments.chat]\nmodel = "m"\nhost = "0.0.0.0"\napi_key_file = "/etc/k"\n')
    assert load_settings(path, environ={}).deployments["chat"].host == "0.0.0.0"


@pytest.mark.parametrize(
    ("mode", "owner", "problem"),
    [
        (0o100600, 0, None),
        (0o100644, 0, None),
        (0o100640, 1000, None),  # the user running dankserve (me = 1000 below)
        (0o100664, 0, "writable by its group (mode 0664)"),
        (0o100646, 0, "writable by others (mode 0646)"),
        (0o100666, 0, "writable by its group and others (mode 0666)"),
        (0o100600, 4242, "owned by uid 4242"),
    ],
)
def test_config_file_problem(mode: int, owner: int, problem: str | None) -> None:
    """A config file writable by group or others, or owned by another user than root or me, is untrusted."""
    found = config_file_problem(mode, owner, me=1000)
    assert found == problem if problem is None else problem in (found or "")


@pytest.mark.parametrize(
    ("mode", "owner", "entry_owner", "problem"),
    [
        (0o040755, 0, 0, None),
        (0o040700, 1000, 1000, None),  # the user running dankserve (me = 1000 below)
        (0o041777, 0, 0, None),  # /tmp holding root's entry
        (0o041777, 0, 1000, None),  # /tmp holding mine
        (0o041777, 0, 4242, "writable by its group and others (mode 1777)"),  # /tmp holding another's
        (0o041777, 4242, 0, "owned by uid 4242"),
        (0o040777, 0, 0, "writable by its group and others (mode 0777)"),
        (0o040775, 0, 0, "writable by its group (mode 0775)"),
        (0o040755, 4242, 0, "owned by uid 4242"),
    ],
)
def test_config_dir_problem(mode: int, owner: int, entry_owner: int, problem: str | None) -> None:
    """A directory on the way to the config is safe when only root and I own and write it, or it is sticky
    and root's or mine holding an entry of root or mine."""
    found = config_dir_problem(mode, owner, entry_owner, me=1000)
    assert found == problem if problem is None else problem in (found or "")


@pytest.mark.parametrize(
    ("mode", "problem"),
    [
        (0o100600, None),
        (0o100400, None),
        (0o100640, None),
        (0o100644, "is open to others (mode 0644)"),
        (0o100604, "is open to others (mode 0604)"),
        (0o100660, "is writable by its group (mode 0660)"),
    ],
)
def test_secret_file_problem(mode: int, problem: str | None) -> None:
    """A secret file open to others, or writable by its group, is unsafe; a group may read it."""
    assert secret_file_problem(mode) == problem


def test_group_writable_config_file_is_refused(tmp_path: Path) -> None:
    """load_settings refuses a config file writable by its group, naming the file and the fix."""
    path = write(tmp_path, "", mode=0o664)
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert str(path) in info.value.message and "writable by its group" in info.value.message
    assert info.value.fix is not None and "chmod go-w" in info.value.fix


def test_world_readable_secret_file_is_refused(tmp_path: Path) -> None:
    """load_settings refuses an existing api_key_file readable by others, naming the key and the fix."""
    key = tmp_path / "api.key"
    key.write_text("k\n")
    key.chmod(0o644)
    path = write(tmp_path, f'[deployments.chat]\nmodel = "m"\napi_key_file = "{key}"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert "deployments.chat.api_key_file" in info.value.message
    assert info.value.fix is not None and f"chmod 600 {key}" in info.value.fix
    key.chmod(0o600)
    assert load_settings(path, environ={}).deployments["chat"].api_key_file == key


REJECTED_VALUES = [
    ("a boolean for a port", "port = true", "deployments.chat.port = True"),
    ("a boolean among GPU indices", "gpus = [0, true]", "deployments.chat.gpus"),
    ("NaN", "kv_offload = nan", "finite number"),
    ("infinity", "gpu_memory_utilization = inf", "gpu_memory_utilization"),
    ("an empty model", 'model = ""', "deployments.chat.model = '': expected a non-empty string"),
    ("an empty image", 'image = ""', "deployments.chat.image = '': expected a non-empty string"),
    ("an absurd CPU offload", "cpu_offload = { gib = 1e308 }", "expected a number of at most 1000000"),
]


@pytest.mark.parametrize(("_what", "line", "named"), REJECTED_VALUES, ids=[r[0] for r in REJECTED_VALUES])
def test_values_no_deployment_can_use_are_invalid(tmp_path: Path, _what: str, line: str, named: str) -> None:
    """Booleans for numbers, NaN and infinity, empty names and absurd amounts are rejected, naming the key."""
    model = "" if line.startswith("model") else 'model = "m"\n'
    path = write(tmp_path, f"[deployments.chat]\n{model}{line}\n")
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert named in info.value.message


def test_durations_are_bounded(tmp_path: Path) -> None:
    """A duration beyond a week (or infinite) is rejected rather than overflowing a timer later."""
    for value in ("1e300", "inf", "604801"):
        path = write(tmp_path, f"stop_timeout_seconds = {value}\n")
        with pytest.raises(ConfigError, match="stop_timeout_seconds"):
            load_settings(path, environ={})
    assert load_settings(write(tmp_path, "stop_timeout_seconds = 604800\n"), environ={}).stop_timeout_seconds == 604800


def test_booleans_stay_booleans(tmp_path: Path) -> None:
    """Boolean keys still take TOML booleans."""
    path = write(tmp_path, '[deployments.chat]\nmodel = "m"\nenabled = false\nnuma_bind = true\n')
    dep = load_settings(path, environ={}).deployments["chat"]
    assert (dep.enabled, dep.numa_bind) == (False, True)


def test_a_file_that_is_not_utf8_is_invalid_input(tmp_path: Path) -> None:
    """A config file with bytes that are not UTF-8 is an error naming the file and the byte, not a crash."""
    path = tmp_path / "dankserve.toml"
    path.write_bytes(b'[deployments.chat]\nmodel = "m"\n# caf\xe9\n')
    with pytest.raises(ConfigError, match="not UTF-8") as info:
        load_settings(path, environ={})
    assert str(path) in info.value.message


@pytest.mark.parametrize("name", ["é", "chat bot", "a.b", "модель"])
def test_deployment_names_are_plain_ascii(tmp_path: Path, name: str) -> None:
    """A deployment name outside ASCII letters, digits, '-' and '_' is refused (it names a container)."""
    path = write(tmp_path, f'[deployments."{name}"]\nmodel = "m"\n')
    with pytest.raises(ConfigError, match="may hold only"):
        load_settings(path, environ={})


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ("pinned = true", "pinned is set but swap_group is not"),
        ("idle_sleep_seconds = 60", "idle_sleep_seconds is set but swap_group is not"),
        ('swap_group = "g"\npinned = true\nidle_sleep_seconds = 60', "a pinned member never sleeps"),
        ('swap_group = "g g"', "may hold only letters"),
        ('swap_group = "g"\nhost = "0.0.0.0"\napi_key_file = "/k"', "dev-mode"),
        ('swap_group = "g"\nhosts = ["10.0.0.2"]', "multi-host"),
        ('swap_group = "g"\nidle_sleep_seconds = 0', "greater than 0"),
        ('swap_group = "auto"\ngpu_memory_utilization = 0.5', "an auto group is planned from each member"),
        ('swap_group = "g"\nmin_awake_seconds = 0', "greater than 0"),
        ('swap_group = "g"\nsleep_check_margin_bytes = -1', "at least 0"),
    ],
)
def test_swap_group_settings_are_checked(tmp_path: Path, fields: str, message: str) -> None:
    """Swap settings outside a group, a pinned member with idle sleep, and a member beyond loopback are refused."""
    path = write(tmp_path, f'[deployments.a]\nmodel = "m"\n{fields}\n')
    with pytest.raises(ConfigError, match=message):
        load_settings(path, environ={})


def test_swap_group_members_load(tmp_path: Path) -> None:
    """Two members of one group, one pinned, the other sleeping when idle."""
    text = (
        '[deployments.a]\nmodel = "m"\nswap_group = "g"\npinned = true\n'
        '[deployments.b]\nmodel = "n"\nport = 8001\nswap_group = "g"\nidle_sleep_seconds = 300\n'
    )
    settings = load_settings(write(tmp_path, text), environ={})
    assert settings.deployments["a"].pinned and settings.deployments["b"].idle_sleep_seconds == 300


@pytest.mark.parametrize(
    ("value", "expected"), [("127.0.0.1:9400", ("127.0.0.1", 9400)), ("[::1]:9400", ("::1", 9400))]
)
def test_metrics_listen_is_host_and_port(value: str, expected: tuple[str, int]) -> None:
    """metrics_listen reads as an address and a port (IPv6 in brackets)."""
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9400", "127.0.0.1:", "127.0.0.1:99999", ":9400", "host:port"])
def test_malformed_metrics_listen_is_a_config_error(tmp_path: Path, value: str) -> None:
    """A metrics_listen that is not HOST:PORT is refused at load, naming the value and an example."""
    path = write(tmp_path, f'metrics_listen = "{value}"\n')
    with pytest.raises(ConfigError, match=re.escape("127.0.0.1:9400")):
        load_settings(path, environ={})


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('extra_args = ["--host", "0.0.0.0"]', "--host, which dankserve sets itself: set host instead"),
        ('extra_args = ["--host=0.0.0.0"]', "set host instead"),
        ('extra_args = ["--port", "9"]', "set port instead"),
        ('extra_args = ["--hos", "0.0.0.0"]', "set host instead"),
        ('extra_args = ["-pp", "2"]', "set hosts (a multi-host group) instead"),
        ('extra_args = ["--download_dir", "/tmp"]', "set hf_cache_dir instead"),
        ('extra_args = ["--kv-cache-memory-bytes", "1"]', "--kv-cache-memory-bytes"),
        ('extra_args = ["--api-key", "sk-1"]', "set api_key_file instead"),
        ('extra_args = ["--api-key=sk-1"]', "a secret on the command line"),
        ('extra_args = ["--hf-token", "hf_x"]', "set hf_token_file instead"),
        ('env = { VLLM_API_KEY = "sk-1" }', "set api_key_file instead"),
        ('env = { HF_TOKEN = "hf_x" }', "set hf_token_file instead"),
        ('env = { CUDA_VISIBLE_DEVICES = "3" }', "dankserve assigns the GPUs"),
        ('env = { VLLM_CACHE_ROOT = "/tmp/c" }', "compile cache"),
        ('env = { LD_PRELOAD = "/tmp/x.so" }', "loads code into the server"),
        ('env = { PATH = "/tmp" }', "PATH"),
        ('revision = "--trust-remote-code"', "starts with '-'"),
    ],
)
def test_what_dankserve_owns_is_refused_with_the_key_to_use(tmp_path: Path, line: str, expected: str) -> None:
    """Owned flags, secrets and contract-breaking variables in extra_args/env are refused, naming the key to
    use, without echoing the secret."""
    path = write(tmp_path, f'[deployments.chat]\nmodel = "m"\n{line}\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert expected in info.value.message and "deployments.chat" in info.value.message
    assert "sk-1" not in info.value.message and "hf_x" not in info.value.message  # never echo a secret


def test_a_model_that_starts_with_a_dash_is_refused(tmp_path: Path) -> None:
    """A model id starting with '-' would become a vLLM flag: refused."""
    path = write(tmp_path, '[deployments.chat]\nmodel = "--help"\n')
    with pytest.raises(ConfigError, match="starts with '-'"):
        load_settings(path, environ={})


def test_ordinary_extra_args_and_env_pass(tmp_path: Path) -> None:
    """Flags and variables dankserve does not own pass through."""
    path = write(
        tmp_path,
        '[deployments.chat]\nmodel = "m"\nextra_args = ["--enable-prefix-caching", "--swap-space", "16", "-O3"]\n'
        'env = { VLLM_LOGGING_LEVEL = "DEBUG" }\n',
    )
    dep = load_settings(path, environ={}).deployments["chat"]
    assert dep.extra_args[0] == "--enable-prefix-caching" and dep.env == {"VLLM_LOGGING_LEVEL": "DEBUG"}


@pytest.mark.parametrize("content", ["", "   \n", "\t\n\n"])
def test_a_blank_api_key_file_is_no_key(tmp_path: Path, content: str) -> None:
    """An empty or whitespace-only api_key_file is refused like a missing key (it would serve unauthenticated)."""
    key = tmp_path / "api.key"
    key.write_text(content)
    key.chmod(0o600)
    path = write(tmp_path, f'[deployments.chat]\nmodel = "m"\nhost = "0.0.0.0"\napi_key_file = "{key}"\n')
    with pytest.raises(ConfigError, match="empty or holds only whitespace"):
        load_settings(path, environ={})


@pytest.mark.parametrize("key", ["_env_prefix", "_case_sensitive", "_env_nested_delimiter", "_cli_parse_args"])
def test_keys_beginning_with_underscore_are_unknown(tmp_path: Path, key: str) -> None:
    """pydantic-settings' own `_options` are unknown keys in the file (they would switch off DANKSERVE_*)."""
    path = write(tmp_path, f'{key} = "X_"\n')
    with pytest.raises(ConfigError) as info:
        load_settings(path, environ={})
    assert f"unknown key {key!r}" in info.value.message


def test_underscore_keys_do_not_switch_off_env_overrides(tmp_path: Path) -> None:
    """A `_env_prefix` in the file is refused rather than silently ignoring DANKSERVE_* variables."""
    path = write(tmp_path, '_env_prefix = "NOPE_"\npodman_url = "unix:///file.sock"\n')
    with pytest.raises(ConfigError):
        load_settings(path, environ={"DANKSERVE_PODMAN_URL": "unix:///env.sock"})


def test_a_fifo_is_refused_at_once(tmp_path: Path) -> None:
    """A FIFO as the config file is refused without blocking (it used to hang `plan` forever)."""
    path = tmp_path / "dankserve.toml"
    os.mkfifo(path, 0o600)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(path, environ={})


def test_a_directory_is_refused(tmp_path: Path) -> None:
    """A directory named as the config file is refused, naming it."""
    path = tmp_path / "conf.d"
    path.mkdir(mode=0o700)
    with pytest.raises(ConfigError, match="not a regular file"):
        load_settings(path, environ={})


def test_a_huge_config_is_refused_before_parsing(tmp_path: Path) -> None:
    """A config beyond the size limit is refused with its size, before it is parsed."""
    path = write(tmp_path, "# " + "x" * (MAX_CONFIG_BYTES + 10) + "\n")
    with pytest.raises(ConfigError, match=f"more than the {MAX_CONFIG_BYTES}"):
        load_settings(path, environ={})


@pytest.mark.parametrize("bomb", ["x = " + "[" * 5000 + "]" * 5000, "x = " + "{a = " * 5000 + "1" + "}" * 5000])
def test_a_nesting_bomb_is_a_config_error(tmp_path: Path, bomb: str) -> None:
    """Deeply nested arrays or inline tables are a config error (exit 2), not an internal error."""
    path = write(tmp_path, bomb + "\n")
    with pytest.raises(ConfigError, match="nest"):
        load_settings(path, environ={})


def test_the_state_dir_is_found_in_a_file_that_does_not_validate(tmp_path: Path) -> None:
    """A refused file still names its state dir (for reaching the running daemon): from the TOML, from its line when
    the TOML does not parse, DANKSERVE_STATE_DIR over either; a file others may change names none (the default)."""
    from dankserve.settings import Settings, state_dir_despite_errors

    default = Settings.model_fields["state_dir"].default
    path = write(tmp_path, 'state_dir = "/srv/ds"\n[deployments.a]\nmodel = "m"\nmax_num_seq = 64\n')
    assert state_dir_despite_errors(path, environ={}) == Path("/srv/ds")
    path = write(tmp_path, "state_dir = '/srv/ds2'  # mine\n[deployments.a\nmodel = \n")
    assert state_dir_despite_errors(path, environ={}) == Path("/srv/ds2")
    assert state_dir_despite_errors(path, environ={"DANKSERVE_STATE_DIR": "/env"}) == Path("/env")
    path.chmod(0o666)
    assert state_dir_despite_errors(path, environ={}) == default
    assert state_dir_despite_errors(tmp_path / "absent.toml", environ={}) == default
