"""Security: `extra_args` may not point vLLM at a YAML of more flags (`--config FILE`): dankserve checks
every flag it passes (the address, the key, the GPUs, the caches), and a file vLLM reads on its own
would carry a `--host 0.0.0.0` or an `--api-key` past every one of those checks (issue 26)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.harness.cli import RECORDED_HOST, dankserve_cli
from tests.security.test_config import DEPLOYMENT, config

EXTRA = 'model = "m"\n'


@pytest.mark.parametrize("args", ['["--config", "FILE"]', '["--config=FILE"]'])
@pytest.mark.parametrize("command", [["plan"], ["run", "--hardware", str(RECORDED_HOST)]])
def test_a_vllm_config_file_in_extra_args_is_refused(tmp_path: Path, args: str, command: list[str]) -> None:
    """A YAML holding `host: 0.0.0.0` named by `--config`: plan and the daemon exit 2 naming the flag and the fix."""
    hostile = tmp_path / "more-flags.yaml"
    hostile.write_text("host: 0.0.0.0\napi-key: sk-planted\n")
    text = DEPLOYMENT.replace(EXTRA, EXTRA + f"extra_args = {args.replace('FILE', str(hostile))}\n")
    done = dankserve_cli(config(tmp_path, text), *command, env={"DANKSERVE_HARDWARE": str(RECORDED_HOST)}, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "extra_args holds --config" in done.stderr and "put the flags in extra_args" in done.stderr
    assert "Traceback" not in done.stderr


def test_vllms_config_format_flag_is_not_taken_for_config(tmp_path: Path) -> None:
    """`--config-format` (how vLLM reads the model's config) is a flag of its own and passes."""
    text = DEPLOYMENT.replace(EXTRA, EXTRA + 'extra_args = ["--config-format", "hf"]\n')
    done = dankserve_cli(config(tmp_path, text), "plan", env={"DANKSERVE_HARDWARE": str(RECORDED_HOST)}, timeout=60)
    assert "--config-format" in done.stdout, done.stdout + done.stderr
