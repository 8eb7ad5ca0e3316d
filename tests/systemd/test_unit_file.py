"""An installed unit's ExecStart= read back (servicectl: which config the unit's daemon reads)."""

from __future__ import annotations

from pathlib import Path

from dankserve.cli.install import UNIT_TEMPLATE, render_unit
from dankserve.systemd.unit_file import config_of, exec_start


def test_what_install_writes_reads_back_word_for_word() -> None:
    executable, config = "/opt/d s/100% $x/bin/dankserve", Path('/etc/my "conf"/dankserve.toml')
    words = exec_start(render_unit(UNIT_TEMPLATE.read_text(), executable, config))
    assert words == [executable, "--config", str(config), "run"]
    assert config_of(words) == config


def test_no_config_is_the_default_and_prefixes_are_not_the_path() -> None:
    assert config_of(exec_start("ExecStart=-/usr/bin/dankserve run\n")) is None
    assert exec_start("ExecStart=-/usr/bin/dankserve run\n")[0] == "/usr/bin/dankserve"
    assert config_of(["/x", "--config=/etc/a.toml", "run"]) == Path("/etc/a.toml")
    assert exec_start("[Unit]\n") == []
