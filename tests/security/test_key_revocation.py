"""Issue 38.4: revoking a gateway key. A `dankserve reload` that reports success has put the key files in
force (a removed key is refused from then on), or the reload is refused and says why; this holds after
any edit of `[gateway]` too (it used to stop the key files being read again until a restart)."""

from __future__ import annotations

from pathlib import Path

import httpx

from dankserve.testing.config_file import write_config
from tests.harness.daemon import daemon_globals, free_port, process_deployment, running_daemon

ALICE, BOB = "sk-alice-0123456789abcdef", "sk-bob-0123456789abcdef"


def _write_key(keys: Path, name: str, secret: str, mode: int = 0o600) -> None:
    (keys / f"{name}.toml").write_text(f'key = "{secret}"\n')
    (keys / f"{name}.toml").chmod(mode)


def _status(url: str, secret: str) -> int:
    return httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {secret}"}, timeout=10).status_code


def test_a_removed_key_is_refused_after_the_reload_that_accepted_it_or_the_reload_is_refused(tmp_path: Path) -> None:
    gateway_port = free_port()
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    _write_key(keys, "alice", ALICE)
    _write_key(keys, "bob", BOB)
    deployments = {"chat": process_deployment(free_port(), served_model_name="tiny-chat", gpus=[0])}
    gateway = {"listen": f"127.0.0.1:{gateway_port}", "keys_dir": str(keys)}
    url = f"http://127.0.0.1:{gateway_port}"
    with running_daemon(tmp_path, deployments, extra_globals={"gateway": gateway}) as daemon:
        daemon.wait_for("chat", lambda d: d["phase"] == "ready")
        assert _status(url, BOB) == 200

        # Bob is revoked while another key file cannot be read (open to everyone): the reload must not say
        # it was accepted while Bob's key still works.
        (keys / "bob.toml").unlink()
        _write_key(keys, "carol", "sk-carol-0123456789abcdef", mode=0o644)
        refused = daemon.cli("reload")
        assert refused.returncode == 2, (refused.stdout, refused.stderr)
        assert "carol.toml" in refused.stderr and "chmod 600" in refused.stderr
        assert _status(url, BOB) == 200  # refused: the keys before stay, as the reload said
        (keys / "carol.toml").chmod(0o600)
        accepted = daemon.cli("reload")
        assert accepted.returncode == 0, accepted.stderr
        assert _status(url, BOB) == 401 and _status(url, ALICE) == 200

        # An edit of [gateway] (it waits for a restart) must not stop the key files being read on later reloads.
        edited = daemon_globals(tmp_path, {"gateway": {**gateway, "max_connections": 300}})
        write_config(daemon.config, edited, deployments)
        first = daemon.cli("reload")
        assert first.returncode == 0 and "gateway" in first.stdout, (first.stdout, first.stderr)
        (keys / "alice.toml").unlink()
        second = daemon.cli("reload")
        assert second.returncode == 0, second.stderr
        assert _status(url, ALICE) == 401
