"""Security: the CLI refuses unsafe configurations with exit 2 and a message naming the problem,
the value and the fix (never a traceback): a server exposed beyond loopback without an API key
(or with an empty one), a config file others can change, a secret file others can read, a flag
dankserve owns in extra_args, a secret in env, a model that would become a flag, pydantic-settings'
own `_options`, a nesting bomb, a FIFO as the config."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.harness.cli import RECORDED_HOST, run_dankserve

DEPLOYMENT = '[deployments.chat]\nmodel = "m"\n[deployments.chat.model_facts]\nparameter_bytes = 2_000_000_000\n'


def exposed_without_key(tmp_path: Path) -> Path:
    return config(tmp_path, DEPLOYMENT.replace('model = "m"\n', 'model = "m"\nhost = "0.0.0.0"\n'))


def group_writable(tmp_path: Path) -> Path:
    path = config(tmp_path, DEPLOYMENT)
    path.chmod(0o664)
    return path


def owned_by_another_user(tmp_path: Path) -> Path:
    path = config(tmp_path, DEPLOYMENT)
    os.chown(path, 4242, -1)
    return path


def world_readable_key(tmp_path: Path) -> Path:
    key = tmp_path / "api.key"
    key.write_text("sk-x\n")
    key.chmod(0o644)
    return config(tmp_path, DEPLOYMENT.replace('model = "m"\n', f'model = "m"\napi_key_file = "{key}"\n'))


def host_in_extra_args(tmp_path: Path) -> Path:
    extra = 'extra_args = ["--host", "0.0.0.0"]\n'
    return config(tmp_path, DEPLOYMENT.replace('model = "m"\n', f'model = "m"\n{extra}'))


def key_in_env(tmp_path: Path) -> Path:
    return config(tmp_path, DEPLOYMENT.replace('model = "m"\n', 'model = "m"\nenv = { VLLM_API_KEY = "sk-leak" }\n'))


def blank_key_file(tmp_path: Path) -> Path:
    key = tmp_path / "api.key"
    key.write_text("   \n")
    key.chmod(0o600)
    exposed = f'model = "m"\nhost = "0.0.0.0"\napi_key_file = "{key}"\n'
    return config(tmp_path, DEPLOYMENT.replace('model = "m"\n', exposed))


def dash_model(tmp_path: Path) -> Path:
    return config(tmp_path, DEPLOYMENT.replace('model = "m"', 'model = "--trust-remote-code"'))


def pydantic_option(tmp_path: Path) -> Path:
    return config(tmp_path, '_env_prefix = "NOPE_"\n' + DEPLOYMENT)


def nesting_bomb(tmp_path: Path) -> Path:
    return config(tmp_path, DEPLOYMENT + "x = " + "[" * 5000 + "]" * 5000 + "\n")


def fifo(tmp_path: Path) -> Path:
    path = tmp_path / "dankserve.toml"
    os.mkfifo(path, 0o600)
    return path


def config(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "dankserve.toml"
    path.write_text(text)
    path.chmod(0o600)
    return path


CASES: list[tuple[str, Callable[[Path], Path], list[str]]] = [
    ("exposed", exposed_without_key, ["deployments.chat", "host = '0.0.0.0'", "api_key_file", "127.0.0.1"]),
    ("group-writable", group_writable, ["writable by its group (mode 0664)", "fix: chmod go-w"]),
    ("foreign-owner", owned_by_another_user, ["owned by uid 4242", "fix: chmod go-w"]),
    ("readable-key", world_readable_key, ["deployments.chat.api_key_file", "open to others", "fix: chmod 600"]),
    ("host-in-extra-args", host_in_extra_args, ["deployments.chat.extra_args", "--host", "set host instead"]),
    ("key-in-env", key_in_env, ["deployments.chat.env", "VLLM_API_KEY", "set api_key_file instead"]),
    ("blank-key-file", blank_key_file, ["api_key_file", "only whitespace", "no key"]),
    ("dash-model", dash_model, ["deployments.chat.model", "starts with '-'"]),
    ("pydantic-option", pydantic_option, ["unknown key '_env_prefix'"]),
    ("nesting-bomb", nesting_bomb, ["nests arrays or tables too deeply"]),
    ("fifo", fifo, ["not a regular file"]),
]


@pytest.mark.parametrize(("case", "make", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", [["plan"], ["status"], ["run", "--hardware", str(RECORDED_HOST)]])
def test_unsafe_configuration_exits_2_with_the_reason(
    tmp_path: Path, case: str, make: Callable[[Path], Path], expected: list[str], command: list[str]
) -> None:
    """plan, status and the daemon itself refuse the unsafe configuration: exit 2, the reason and the fix."""
    if case == "foreign-owner" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    done = run_dankserve(make(tmp_path), *command)
    assert done.returncode == 2, done.stdout + done.stderr
    for fragment in expected:
        assert fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert "sk-leak" not in done.stdout + done.stderr  # a refused secret is never echoed
