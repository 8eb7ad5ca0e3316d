"""`dankserve pull [DEPLOYMENT] [--model M] [--revision R]`: download weights (and LoRA adapters) into hf_cache_dir.

Shows bytes, rate and time left while it runs (a line rewritten on a terminal, a line every
few seconds otherwise), resumes interrupted downloads, skips complete files, and checks the
free disk first (exit 3 naming the shortfall). Without DEPLOYMENT: every enabled deployment
whose model is a Hub id. A deployment's Hub adapters (`[deployments.NAME.adapters]` naming
ORG/NAME) are pulled after its model, unless --model picks one model.
"""

from __future__ import annotations

import os
import sys
import time
from typing import TYPE_CHECKING

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import ConfigError
from dankserve.exitcodes import ExitCode

if TYPE_CHECKING:
    from dankserve.hub.download import Progress
    from dankserve.settings import DeploymentSettings, Settings

LOG_INTERVAL_SECONDS = 5.0


@click.command("pull")
@click.argument("deployment", required=False, shell_complete=complete_deployment)
@click.option("--model", default=None, help="Model to download (ORG/NAME); without DEPLOYMENT: only this one.")
@click.option("--revision", default=None, help="Branch, tag or commit (default: the deployment's, else main).")
@click.option("--quiet", "-q", is_flag=True, help="No progress, only the summary.")
def command(deployment: str | None, model: str | None, revision: str | None, quiet: bool) -> ExitCode:
    """Download a model's weights into the HF cache (resumable, with progress)."""
    from dankserve.cli.plan import select_deployments
    from dankserve.hub.access import is_hub_id
    from dankserve.hub.weights import hub_adapters

    settings = cli_context().load_settings()
    selected = select_deployments(settings, deployment, model)
    todo = [(n, d) for n, d in selected if is_hub_id(d.model) or (model is None and hub_adapters(d))]
    if not todo:
        names = ", ".join(f"{n} ({d.model})" for n, d in selected)
        raise ConfigError(
            f"nothing to pull: no selected deployment names a Hub model (ORG/NAME): {names}",
            fix="name a deployment whose model is a Hub id, or pass --model ORG/NAME",
        )
    shell_umask = os.umask(0o077)  # the HF cache as private as the daemon keeps it, whatever the shell's umask
    try:
        for name, dep in todo:
            if is_hub_id(dep.model):
                _pull_one(name, dep, revision, quiet, settings)
            for repo in hub_adapters(dep) if model is None else []:
                _pull_one(name, dep.model_copy(update={"model": repo, "revision": None}), None, quiet, settings)
    finally:
        os.umask(shell_umask)
    return ExitCode.OK


def _pull_one(name: str, dep: DeploymentSettings, revision: str | None, quiet: bool, settings: Settings) -> None:
    from dankserve.hub.access import hub_access
    from dankserve.hub.download import duration_text, size_text
    from dankserve.hub.pull import pull

    access = hub_access(settings.hf_cache_dir, settings.state_dir, name, dep.hf_token_file)
    rev = revision or dep.revision
    click.echo(f"{dep.model}{'@' + rev if rev else ''} -> {access.cache_dir}", err=True)
    reporter = None if quiet else _Reporter(dep.model)
    try:
        result = pull(access, dep.model, rev, reporter)
    finally:  # a failed pull's error starts its own line, not the end of the progress line
        if reporter is not None:
            reporter.close()
    if result.fetched_files == 0:
        click.echo(f"{dep.model}: complete already ({result.files} files, {size_text(result.total_bytes)})")
    else:
        rate = result.fetched_bytes / result.seconds if result.seconds > 0 else 0.0
        click.echo(
            f"{dep.model}: {result.fetched_files} of {result.files} files, {size_text(result.fetched_bytes)} "
            f"in {duration_text(result.seconds)} ({size_text(rate)}/s); commit {result.commit[:12]}"
        )


class _Reporter:
    """Progress on stderr: rewritten in place on a terminal, a line every few seconds otherwise."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.shown = False

    def __call__(self, progress: Progress) -> None:
        from dankserve.hub.download import progress_text

        now = time.monotonic()
        if self.tty:
            sys.stderr.write(f"\r\x1b[K{self.model}: {progress_text(progress)}")
            sys.stderr.flush()
            self.shown = True
        elif now - self.last >= LOG_INTERVAL_SECONDS or progress.done_bytes >= progress.total_bytes:
            self.last = now
            sys.stderr.write(f"{self.model}: {progress_text(progress)}\n")
            sys.stderr.flush()

    def close(self) -> None:
        if self.tty and self.shown:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.shown = False
