"""`dankserve install`: put the systemd unit (and the example config if none) in place, enable it."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import click

from dankserve.cli.context import cli_context
from dankserve.errors import EnvironmentUnusable
from dankserve.exitcodes import ExitCode

CHECKOUT = Path(__file__).resolve().parents[2]
SHARED = Path(sys.prefix) / "share" / "dankserve"
"""Where a plain `pip install .` puts the unit and the example (pyproject's data-files): no checkout there."""


def shipped(checkout_file: Path, shared: Path = SHARED) -> Path:
    """A file of the checkout (units/, config/), else the copy the package installed under share/dankserve."""
    return checkout_file if checkout_file.is_file() else shared / checkout_file.name


UNIT_TEMPLATE = shipped(CHECKOUT / "units" / "dankserve.service")
EXAMPLE_CONFIG = shipped(CHECKOUT / "config" / "dankserve.toml")
MAN_DIR = Path("/usr/local/share/man/man1")


def render_unit(template: str, executable: str) -> str:
    """The unit with ExecStart pointing at this installation's dankserve."""
    out = []
    for line in template.splitlines():
        out.append(f"ExecStart={executable} run" if line.startswith("ExecStart=") else line)
    return "\n".join(out) + "\n"


def dankserve_executable() -> str:
    """The absolute path of the running installation's `dankserve` script."""
    beside = Path(sys.executable).parent / "dankserve"
    if beside.is_file():
        return str(beside)
    found = shutil.which("dankserve")
    if found:
        return str(Path(found).resolve())
    raise EnvironmentUnusable(
        "cannot find the dankserve executable", fix="install dankserve (make setup) and run install from its venv"
    )


@click.command("install")
@click.option(
    "--unit-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("/etc/systemd/system"),
    show_default=True,
    help="Where to write dankserve.service.",
)
@click.option(
    "--config-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Where to write the example dankserve.toml if none is there (default: the config file's directory, "
    "/etc/dankserve unless --config or $DANKSERVE_CONFIG names another file).",
)
@click.option(
    "--man-dir",
    type=click.Path(path_type=Path, file_okay=False),
    default=MAN_DIR,
    show_default=True,
    help="Where to write the man pages (dankserve(1), dankserve-COMMAND(1)), rendered from this help.",
)
@click.option("--no-enable", is_flag=True, help="Write the files only; do not run systemctl.")
def command(unit_dir: Path, config_dir: Path | None, man_dir: Path, no_enable: bool) -> ExitCode:
    """Install dankserve.service, the man pages, and /etc/dankserve/dankserve.toml (kept if present), then
    enable the unit."""
    from dankserve import servicectl
    from dankserve.cli.main import cli
    from dankserve.cli.manpages import pages
    from dankserve.settings import resolve_config_path

    ctx = cli_context()
    unit_path = unit_dir / servicectl.UNIT_NAME
    unit_dir.mkdir(parents=True, exist_ok=True)
    if not UNIT_TEMPLATE.is_file():
        raise EnvironmentUnusable(
            f"the unit template is missing: {UNIT_TEMPLATE} (this installation of dankserve is incomplete)",
            fix="reinstall dankserve (`pip install .` from the checkout, or `make setup`)",
        )
    unit_path.write_text(render_unit(UNIT_TEMPLATE.read_text(), dankserve_executable()))
    os.chmod(unit_path, 0o644)
    click.echo(f"wrote {unit_path}")
    man_dir.mkdir(parents=True, exist_ok=True)
    for name, text in pages(cli).items():
        (man_dir / name).write_text(text)
        os.chmod(man_dir / name, 0o644)
    click.echo(f"wrote the man pages to {man_dir} (`man dankserve`)")
    config_path, _ = resolve_config_path(ctx.config)
    if config_dir is not None:
        config_path = config_dir / "dankserve.toml"
    if config_path.exists():
        click.echo(f"kept {config_path}")
    else:
        config_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        config_path.write_text(EXAMPLE_CONFIG.read_text() if EXAMPLE_CONFIG.exists() else "# dankserve\n")
        os.chmod(config_path, 0o600)
        click.echo(f"wrote {config_path} (an example: edit the deployments)")
    if no_enable or not servicectl.systemd_running():
        if not no_enable:
            click.echo("systemd is not running here: start the daemon with `dankserve up` instead")
        return ExitCode.OK
    servicectl.systemctl("daemon-reload")
    servicectl.systemctl("enable", servicectl.UNIT_NAME)
    click.echo(f"enabled {servicectl.UNIT_NAME}; start it with `dankserve up`")
    return ExitCode.OK
