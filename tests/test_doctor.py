"""Tests for dankserve.doctor: the verdicts `dankserve doctor` (and so `make up`) prints."""

from __future__ import annotations

from dankserve.doctor import cdi_verdict, cni_iptables_verdict, podman_tool_verdict


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


# The spec written on the H200 test machine (bench/real_vllm/install-podman.sh): it mounts the
# driver's directory and names no version; nvidia-ctk's name libcuda.so.VERSION.
H200_SPEC = """cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}]
- name: "GPU-655b3264-6113-6baf-cc5b-11c5b5a15b47"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}]
containerEdits:
  env: ["LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib"]
  deviceNodes: [{path: /dev/nvidiactl}, {path: /dev/nvidia-uvm}, {path: /dev/nvidia-uvm-tools}]
  mounts:
  - {hostPath: /usr/local/nvidia, containerPath: /usr/local/nvidia, options: [ro, nosuid, nodev, bind]}
"""
CTK_SPEC = """cdiVersion: "0.5.0"
kind: nvidia.com/gpu
devices:
- name: "0"
  containerEdits:
    deviceNodes: [{path: /dev/nvidia0}]
containerEdits:
  mounts:
  - {hostPath: /usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14, containerPath: /usr/lib/libcuda.so.550.54.14}
"""


def test_cdi_spec_naming_no_driver_version_fits_any_driver() -> None:
    """A spec that mounts the driver's directory without versions passes (it failed on the real H200)."""
    check = cdi_verdict({"/etc/cdi/nvidia.yaml": H200_SPEC}, "580.159.04")
    assert check.verdict == "ok" and "names no driver version" in check.detail


def test_cdi_spec_naming_library_versions_must_name_the_installed_driver() -> None:
    """nvidia-ctk's spec names libcuda.so.VERSION: another driver fails with both versions named."""
    check = cdi_verdict({"/etc/cdi/nvidia.yaml": CTK_SPEC}, "580.159.04")
    assert check.verdict == "fail" and "550.54.14" in check.detail and "580.159.04" in check.detail
    assert cdi_verdict({"/etc/cdi/nvidia.yaml": CTK_SPEC}, "550.54.14").verdict == "ok"


def test_cni_without_iptables_on_the_default_path_fails() -> None:
    """CNI with no iptables where conmon's cleanup looks fails, naming the stale port forward and the fix."""
    check = cni_iptables_verdict("cni", None)
    assert check is not None and check.verdict == "fail"
    assert "port forward" in check.detail and check.fix is not None and "iptables" in check.fix


def test_cni_with_iptables_and_netavark_pass() -> None:
    """CNI with iptables on the default PATH is ok; netavark is not checked here."""
    check = cni_iptables_verdict("cni", "/usr/sbin/iptables")
    assert check is not None and check.verdict == "ok"
    assert cni_iptables_verdict("netavark", None) is None
    assert cni_iptables_verdict(None, None) is None
