"""Security: values no process can be given are refused at config validation, exit 2 with the key and
the reason, before any boot (issue 26, finding 11): a NUL byte in an env value, an argument or a
path, an env name that is not a variable name (`=X`), a 300-character deployment name. Each used to
pass validation and crash six boots in a row."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.cli import RECORDED_HOST, dankserve_cli
from tests.security.test_config import DEPLOYMENT, config

EXTRA = 'model = "m"\n'
CASES: list[tuple[str, str, list[str]]] = [
    ("nul-in-env", DEPLOYMENT.replace(EXTRA, EXTRA + 'env = { A = "x\\u0000y" }\n'), ["deployments.chat.env", "NUL"]),
    ("nul-in-args", DEPLOYMENT.replace(EXTRA, EXTRA + 'extra_args = ["--x\\u0000"]\n'), ["extra_args", "NUL"]),
    ("nul-in-model", DEPLOYMENT.replace(EXTRA, 'model = "m\\u0000"\n'), ["deployments.chat.model", "NUL"]),
    ("nul-in-path", 'state_dir = "/tmp/s\\u0000"\n' + DEPLOYMENT, ["state_dir", "NUL"]),
    ("equals-env-name", DEPLOYMENT.replace(EXTRA, EXTRA + 'env = { "=X" = "1" }\n'), ["'=X'", "not a variable"]),
    ("long-name", DEPLOYMENT.replace("deployments.chat", "deployments." + "a" * 300), ["300 characters"]),
]


@pytest.mark.parametrize(("case", "text", "expected"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("command", [["plan"], ["run", "--hardware", str(RECORDED_HOST)]])
def test_a_value_no_process_can_take_exits_2_at_validation(
    tmp_path: Path, case: str, text: str, expected: list[str], command: list[str]
) -> None:
    """plan and the daemon refuse the value before any boot: exit 2, the key and the reason, no traceback."""
    path = config(tmp_path, text)
    done = dankserve_cli(path, *command, env={"DANKSERVE_HARDWARE": str(RECORDED_HOST)}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    for fragment in expected:
        assert fragment in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
