"""Tests for dankserve.doctor: the verdicts `dankserve doctor` (and so `make up`) prints."""

from __future__ import annotations

from dankserve.doctor import cdi_verdict, podman_tool_verdict


def test_missing_podman_fails_with_how_to_install_and_start_it() -> None:
    """Without the podman program the check fails and says how to install it and start its socket."""
    check = podman_tool_verdict(None)
    assert check is not None and check.verdict == "fail"
    assert check.fix is not None and "apt-get install podman" in check.fix and "podman.socket" in check.fix


def test_installed_podman_leaves_the_socket_check_to_follow() -> None:
    """With podman installed there is no verdict here: reaching the API socket is checked next."""
    assert podman_tool_verdict("/usr/bin/podman") is None


def test_no_cdi_spec_warns_with_the_toolkit_and_the_generate_command() -> None:
    """No CDI spec: a warning whose fix names the NVIDIA Container Toolkit and `nvidia-ctk cdi generate`."""
    check = cdi_verdict({}, "570.86.15")
    assert check.verdict == "warn"
    assert check.fix is not None and "NVIDIA Container Toolkit" in check.fix and "nvidia-ctk cdi generate" in check.fix


def test_cdi_spec_of_another_driver_fails() -> None:
    """A CDI spec made for another driver version fails (containers would get the wrong libraries)."""
    spec = {"/etc/cdi/nvidia.yaml": "kind: nvidia.com/gpu\n# driver 550.54.14\n"}
    assert cdi_verdict(spec, "570.86.15").verdict == "fail"
    assert cdi_verdict(spec, "550.54.14").verdict == "ok"
