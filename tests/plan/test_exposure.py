"""What a server exposes and to whom (issue 38): the private socket, or TCP with the routes vLLM's key leaves open."""

from __future__ import annotations

from dankserve.plan.exposure import exposure, exposure_warning


def test_the_private_socket_exposes_nothing_to_anyone_but_dankserve() -> None:
    found = exposure(
        "/run/dankserve-backend/vllm.sock",
        "127.0.0.1",
        8000,
        dev_mode=True,
        lora_updating=True,
        keyed=False,
        runtime="podman",
    )
    assert found.private and found.unguarded == () and found.guarded == ()
    assert "dankserve alone" in found.reachable_by and exposure_warning(found) is None
    assert found.lines()[-1] == "dev mode (VLLM_SERVER_DEV_MODE): on"


def test_tcp_names_every_local_user_and_what_the_key_does_not_guard() -> None:
    keyed = exposure(None, "127.0.0.1", 8000, dev_mode=True, lora_updating=True, keyed=True, runtime="process")
    assert keyed.listen == "127.0.0.1:8000" and keyed.reachable_by == "every user of this host"
    assert any("/sleep" in route for route in keyed.unguarded)  # dev mode: beyond /v1, so no key guards it
    assert any("/v1/load_lora_adapter" in route for route in keyed.guarded)
    warning = exposure_warning(keyed)
    assert warning is not None and 'listen = "socket"' in warning
    open_ = exposure(None, "0.0.0.0", 8000, dev_mode=False, lora_updating=True, keyed=False, runtime="process")
    assert open_.reachable_by == "anyone who can reach 0.0.0.0:8000" and open_.guarded == ()
    assert any(route.startswith("/v1/*") for route in open_.unguarded) and exposure_warning(open_) is None
