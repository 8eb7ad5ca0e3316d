"""The exit codes: README's table is the one generated from dankserve/exitcodes.py, the unit's
RestartPreventExitStatus is NO_RESTART, and the real CLI ends with each code for its cause."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dankserve.exitcodes import NO_RESTART, ExitCode, render_table
from tests.cli.test_up import configured
from tests.harness.daemon import (
    REPO,
    daemon_globals,
    dankserve_cli,
    free_port,
    process_deployment,
    write_config,
    write_host,
)


def test_readme_holds_the_exit_code_table_generated_from_exitcodes() -> None:
    """README.md's table is exactly render_table() (`make docs` writes it)."""
    assert render_table() in (REPO / "README.md").read_text()


def test_the_unit_prevents_restarts_on_exactly_the_codes_restarting_cannot_mend() -> None:
    """units/dankserve.service lists NO_RESTART in RestartPreventExitStatus, nothing else."""
    unit = (REPO / "units" / "dankserve.service").read_text().splitlines()
    line = next(line for line in unit if line.startswith("RestartPreventExitStatus="))
    assert sorted(int(code) for code in line.split("=", 1)[1].split()) == sorted(int(code) for code in NO_RESTART)


def test_exit_code_0_success_and_2_invalid_input(tmp_path: Path) -> None:
    """`status` of a configured host ends 0; `up` of a deployment the config does not name ends 2."""
    config = write_config(
        tmp_path / "dankserve.toml", daemon_globals(tmp_path), {"chat": process_deployment(free_port())}
    )
    assert dankserve_cli(config, "status").returncode == ExitCode.OK
    unknown = dankserve_cli(config, "up", "nosuch")
    assert unknown.returncode == ExitCode.INVALID_INPUT and "unknown deployment 'nosuch'" in unknown.stderr


def test_exit_code_1_is_a_bug_reported_without_a_traceback(tmp_path: Path) -> None:
    """An unexpected exception inside a command (here injected at the command's status call) ends 1 naming a bug."""
    config = write_config(
        tmp_path / "dankserve.toml", daemon_globals(tmp_path), {"chat": process_deployment(free_port())}
    )
    program = (
        "import dankserve.cli.status as s\n"
        "s.current_status = lambda settings: 1 / 0\n"
        "from dankserve.cli.main import main\n"
        f"main(['--config', {str(config)!r}, 'status'])\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == ExitCode.INTERNAL and "internal error (a bug in dankserve)" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.slow
def test_exit_code_3_the_environment_the_daemon_needs_is_not_there(tmp_path: Path) -> None:
    """The daemon's metrics address taken: the daemon exits 3 and `up` ends 3 with the daemon's words."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        globals_ = {"metrics_listen": f"127.0.0.1:{taken.getsockname()[1]}"}
        with configured(tmp_path, {"chat": process_deployment(free_port())}, globals_) as (config, host):
            done = dankserve_cli(config, "up", "--hardware", str(host), "--timeout", "60")
            assert done.returncode == ExitCode.ENVIRONMENT and "cannot serve metrics" in done.stderr


def test_exit_code_4_a_deployment_this_host_cannot_hold(tmp_path: Path) -> None:
    """`plan` of weights larger than every GPU together ends 4."""
    big = process_deployment(free_port(), model_facts={"parameter_bytes": 10**13})
    config = write_config(tmp_path / "dankserve.toml", daemon_globals(tmp_path), {"huge": big})
    host = write_host(tmp_path / "host.json")
    done = dankserve_cli(config, "plan", "huge", "--hardware", str(host))
    assert done.returncode == ExitCode.INFEASIBLE, done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fail", "timeout", "code", "said"),
    [
        # A boot that fails for good (the model does not exist): 5 naming it, not 4.
        ("model_not_found", "60", ExitCode.DEPLOYMENT_FAILED, "deployment(s) failed: chat"),
        # A boot that hangs: --timeout runs out, 6 (the daemon keeps trying), not 3.
        ("hang", "3", ExitCode.TIMED_OUT, "the daemon keeps trying"),
    ],
)
def test_exit_code_5_a_deployment_failed_and_6_up_timed_out(
    tmp_path: Path, fail: str, timeout: str, code: ExitCode, said: str
) -> None:
    """`up` ends 5 when a deployment it waited for failed, 6 when its --timeout ran out."""
    deployment = process_deployment(free_port(), env={"FAKE_VLLM_FAIL": fail})
    with configured(tmp_path, {"chat": deployment}) as (config, host):
        done = dankserve_cli(config, "up", "--hardware", str(host), "--timeout", timeout)
        assert done.returncode == code, done.stdout + done.stderr
        assert said in done.stderr
