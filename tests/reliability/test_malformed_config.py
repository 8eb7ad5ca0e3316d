"""Malformed configurations at volume: many generated examples in process, and a sample as real processes
(`python -m dankserve --config F plan|run`), each answered with exit 2 and a message, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dankserve.exitcodes import ExitCode
from tests.cli.test_malformed_config import HOST, answers_exit_2, safe_globals
from tests.harness.broken_config import broken_configs
from tests.harness.faults import FaultTally, cycles, reproduce

pytestmark = [pytest.mark.reliability, pytest.mark.slow, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[2]
IN_PROCESS = FaultTally(
    "09-malformed-config",
    "a generated broken configuration (hypothesis: broken TOML, wrong types, unknown keys, out-of-range "
    "numbers, duplicate ports, bad names, missing keys, empty values, values vLLM does not know, hostile "
    "values: owned flags, secrets in extra_args/env, '-' models, `_options`, nesting bombs), given to "
    "`dankserve plan` and `dankserve run` in process",
    "exit 2 with `error: <message>` and its fix, no traceback (counted per command run)",
    reproduce("tests/reliability/test_malformed_config.py::test_many_malformed_configs_exit_2"),
)
AS_PROCESSES = FaultTally(
    "10-malformed-config-processes",
    "a sample of the generated broken configurations given to real `python -m dankserve plan` and "
    "`python -m dankserve run` processes",
    "exit status 2, `error: <message>` on stderr, no traceback",
    reproduce("tests/reliability/test_malformed_config.py::test_malformed_configs_as_processes_exit_2"),
)


def test_many_malformed_configs_exit_2(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    """Hundreds of broken configurations: `plan` and `run` each exit 2 with a message, never a traceback."""
    root = tmp_path_factory.mktemp("malformed")

    @settings(max_examples=cycles("config_examples"), deadline=None, database=None)
    @given(data=st.data())
    def check(data: st.DataObject) -> None:
        example = data.draw(broken_configs(safe_globals(root)))
        config = root / "dankserve.toml"
        config.write_bytes(example.text)
        for command in ("plan", "run"):
            IN_PROCESS.inject(example.category)
            problem = answers_exit_2(config, command, capsys)
            if problem:
                IN_PROCESS.lose(f"{example.category} ({example.detail}): {problem[:300]}")
            else:
                IN_PROCESS.recover()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("dankserve.settings.files.DEFAULT_CONFIG_PATH", Path("/nonexistent/dankserve.toml"))
        patch.setattr("dankserve.logging_setup.configure_logging", lambda *a, **k: "console")
        for name in ("DANKSERVE_CONFIG", "DANKSERVE_HARDWARE"):
            patch.delenv(name, raising=False)
        try:
            check()
        finally:
            IN_PROCESS.write()
    IN_PROCESS.check()


@settings(
    max_examples=max(6, cycles("config_examples") // 10),
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_malformed_configs_as_processes_exit_2(tmp_path: Path, data: st.DataObject) -> None:
    """Real processes: `python -m dankserve plan|run` on a broken configuration exit 2, message on stderr."""
    example = data.draw(broken_configs(safe_globals(tmp_path)))
    config = tmp_path / "dankserve.toml"
    config.write_bytes(example.text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DANKSERVE_")}
    for command in ("plan", "run"):
        AS_PROCESSES.inject(example.category)
        done = subprocess.run(
            [sys.executable, "-m", "dankserve", "--config", str(config), command, "--hardware", str(HOST)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=60,
            check=False,
        )
        if done.returncode == ExitCode.INVALID_INPUT and "error: " in done.stderr and "Traceback" not in done.stderr:
            AS_PROCESSES.recover()
        else:
            AS_PROCESSES.lose(
                f"{example.category} ({example.detail}): {command} exit {done.returncode}: {done.stderr[-300:]}"
            )
    AS_PROCESSES.write()
    assert AS_PROCESSES.lost == 0, AS_PROCESSES.notes[-1]
