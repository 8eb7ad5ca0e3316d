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
"""Where a plain `pip install .` puts the units and the example (pyproject's data-files): no checkout there."""


def shipped(checkout_file: Path, shared: Path = SHARED) -> Path:
    """A file of the checkout (units/, config/), else the copy the package installed under share/dankserve."""
    return checkout_file if checkout_file.is_file() else shared / checkout_file.name


UNIT_TEMPLATE = shipped(CHECKOUT / "units" / "dankserve.service")
AUTO_UPDATE_UNITS = tuple(
    shipped(CHECKOUT / "units" / name) for name in ("dankserve-auto-update.service", "dankserve-auto-update.timer")
)
"""The daily `dankserve upgrade --auto` (the [upgrade] auto_update setting says whether it does anything)."""
AUTO_UPDATE_TIMER = "dankserve-auto-update.timer"
EXAMPLE_CONFIG = shipped(CHECKOUT / "config" / "dankserve.toml")
MAN_DIR = Path("/usr/local/share/man/man1")


def render_unit(template: str, executable: str, config: Path | None = None) -> str:
    """The unit with ExecStart running this installation's dankserve (its arguments kept), quoted as systemd
    reads a command line (a path with blanks, `%` or `$` stays one word); `config`: the file the daemon reads
    when it is not the default one (`--config`)."""
    from dankserve.runtime.podman.quadlet import Unrepresentable, quote_arg

    try:
        words = [quote_arg(executable)]
        if config is not None:
            words += ["--config", quote_arg(str(config))]
    except Unrepresentable as exc:
        raise EnvironmentUnusable(
            f"the unit cannot name {exc}", fix="install dankserve and its config under plain paths (/opt, /etc)"
        ) from None
    out = []
    for line in template.splitlines():
        if line.startswith("ExecStart="):
            arguments = line.split(None, 1)[1] if " " in line else "run"
            out.append(f"ExecStart={' '.join(words)} {arguments}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


PRIVATE_TMP = (Path("/tmp"), Path("/var/tmp"))
"""The unit runs with PrivateTmp=yes: it sees empty directories of its own here, never the host's."""


def under_private_tmp(path: Path) -> bool:
    """Whether the unit would not see `path` (it is under /tmp or /var/tmp, the symlinks resolved)."""
    resolved = Path(os.path.realpath(path))
    return any(resolved == tmp or tmp in resolved.parents for tmp in PRIVATE_TMP)


def unit_code_problems(executable: Path, *, unit: bool = True) -> list[str]:
    """Why root could not trust `executable` (code_trust), and (`unit`) why the unit could not even see it
    (PrivateTmp)."""
    from dankserve.code_trust import CodeUnreadable, code_paths, code_problems

    try:
        paths = code_paths(executable)
    except CodeUnreadable as exc:
        return [str(exc)]
    hidden = [p for p in (paths.executable, paths.interpreter, paths.package) if unit and under_private_tmp(p)]
    unseen = [f"{p} is under /tmp or /var/tmp, which the unit (PrivateTmp=yes) does not see" for p in hidden]
    return unseen + code_problems(paths)


def check_unit_code(executable: Path, allow: bool) -> None:
    """Refuse (or with `allow`, warn) when anyone but root could change what the root units would run."""
    from dankserve.code_trust import ROOT_INSTALL_FIX, describe

    problems = unit_code_problems(executable)
    if not problems:
        return
    said = (
        f"the units run {executable} as root, but someone other than root could change what it runs:\n"
        f"{describe(problems)}"
    )
    if not allow:
        raise EnvironmentUnusable(said, fix=ROOT_INSTALL_FIX + " (--allow-untrusted-code installs anyway)")
    click.echo(f"warning: {said}\n  fix: {ROOT_INSTALL_FIX}", err=True)


def warn_private_tmp(config: Path) -> None:
    if under_private_tmp(config):
        click.echo(
            f"warning: the unit runs with PrivateTmp=yes and will not see {config}: keep the config under "
            "/etc/dankserve (the default) for the unit",
            err=True,
        )


INSTALLED_UNIT = Path("/etc/systemd/system/dankserve.service")


def installed_executable() -> Path | None:
    """The executable the installed unit runs (its ExecStart's first word), None when no unit is installed."""
    from dankserve import servicectl
    from dankserve.systemd.unit_file import exec_start

    text = servicectl.unit_text()
    if text is None:
        try:
            text = INSTALLED_UNIT.read_text()
        except OSError:
            return None
    words = exec_start(text)
    return Path(words[0]) if words else None


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
@click.option(
    "--allow-untrusted-code",
    is_flag=True,
    help="Install even when a user other than root could change the code the root units run (warn instead).",
)
def command(
    unit_dir: Path, config_dir: Path | None, man_dir: Path, no_enable: bool, allow_untrusted_code: bool
) -> ExitCode:
    """Install dankserve.service, the daily dankserve-auto-update.timer, the man pages, and
    /etc/dankserve/dankserve.toml (kept if present), then enable the unit and the timer.

    The units run as root: install refuses (exit 3) when anyone but root could change what they run
    (this dankserve, its interpreter, site-packages, an editable install's source, or a directory
    above them), and a checkout the unit cannot see (under /tmp: the unit has its own /tmp)."""
    from dankserve import servicectl
    from dankserve.cli.main import cli
    from dankserve.cli.manpages import pages
    from dankserve.settings import DEFAULT_CONFIG_PATH, resolve_config_path

    ctx = cli_context()
    unit_path = unit_dir / servicectl.UNIT_NAME
    if not UNIT_TEMPLATE.is_file():
        raise EnvironmentUnusable(
            f"the unit template is missing: {UNIT_TEMPLATE} (this installation of dankserve is incomplete)",
            fix="reinstall dankserve (`pip install .` from the checkout, or `make setup`)",
        )
    config_path, _ = resolve_config_path(ctx.config)
    if config_dir is not None:
        config_path = config_dir / "dankserve.toml"
    config_path = config_path.absolute()
    executable = dankserve_executable()
    check_unit_code(Path(executable), allow_untrusted_code)
    warn_private_tmp(config_path)
    config_arg = None if config_path == DEFAULT_CONFIG_PATH else config_path
    unit_dir.mkdir(parents=True, exist_ok=True)
    unit_path.write_text(render_unit(UNIT_TEMPLATE.read_text(), executable, config_arg))
    os.chmod(unit_path, 0o644)
    click.echo(f"wrote {unit_path}")
    for template in AUTO_UPDATE_UNITS:
        path = unit_dir / template.name
        path.write_text(render_unit(template.read_text(), executable, config_arg))
        os.chmod(path, 0o644)
        click.echo(f"wrote {path}")
    man_dir.mkdir(parents=True, exist_ok=True)
    for name, text in pages(cli).items():
        (man_dir / name).write_text(text)
        os.chmod(man_dir / name, 0o644)
    click.echo(f"wrote the man pages to {man_dir} (`man dankserve`)")
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
    servicectl.systemctl("enable", "--now", AUTO_UPDATE_TIMER)  # does nothing while auto_update = "off"
    click.echo(f"enabled {servicectl.UNIT_NAME}; start it with `dankserve up`")
    click.echo(f'enabled {AUTO_UPDATE_TIMER} (daily; [upgrade] auto_update = "off" until set)')
    return ExitCode.OK
