"""`dankserve plan [DEPLOYMENT] [--model M] [--json] [--hardware FILE] [--vllm-version V]`.

Prints the `vllm serve` command line of each deployment with a reason for every flag. Without
DEPLOYMENT, `--model M` plans an ad-hoc deployment of M with every key at its default, named "--model M"
in the plan and its errors (checked against the configured deployments); without either, every enabled
deployment is planned. GPU sharing and host RAM are checked against every enabled deployment, also when
one is named. `--json` always prints a list; a plan that fails still prints its entry, with
`error` (message, fix, exit code), and the command exits with that code. Nothing is started.
"""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from dankserve.cli.context import cli_context
from dankserve.cli.options import complete_deployment
from dankserve.errors import ConfigError, DankserveError
from dankserve.exitcodes import ExitCode

if TYPE_CHECKING:
    from dankserve.host.model import Host
    from dankserve.plan.types import Plan
    from dankserve.settings import DeploymentSettings, Settings


@click.command("plan")
@click.argument("deployment", required=False, shell_complete=complete_deployment)
@click.option(
    "--model",
    default=None,
    help="Model to plan (HF id); without DEPLOYMENT: an ad-hoc deployment of it, every key at its default.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the plan(s) as JSON.")
@click.option(
    "--hardware",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Recorded host (`dankserve probe --save`) instead of probing; also $DANKSERVE_HARDWARE.",
)
@click.option("--vllm-version", default=None, help="Plan for this vLLM release (default: the image tag's).")
def command(
    deployment: str | None, model: str | None, as_json: bool, hardware: Path | None, vllm_version: str | None
) -> ExitCode:
    """Compute the vLLM command line for a deployment, with a reason per flag."""
    settings = cli_context().load_settings()
    selected = local_entrypoints(settings, select_deployments(settings, deployment, model))
    from dankserve.host.probe import load_host

    host = load_host(hardware, cache_dirs=lambda: [settings.cache_dir, settings.hf_cache_dir])
    _note_running_config(settings)
    if not as_json:
        print_plans(plan_all(settings, selected, host, vllm_version), {n: runs_in(d) for n, d in selected})
        return ExitCode.OK
    from dankserve.cli.render import print_json

    failed: dict[str, DankserveError] = {}
    try:
        plans = plan_all(settings, selected, host, vllm_version, failed=failed)
    except DankserveError as exc:  # a check across deployments (GPU sharing, host RAM): every entry carries it
        plans, failed = [], {name: exc for name, _ in selected}
    by_name = {p.deployment: p.to_json() for p in plans}
    entries = [by_name[n] if n in by_name else {"deployment": n, "error": error_json(failed[n])} for n, _ in selected]
    print_json(entries)
    for name, error in failed.items():
        click.echo(f"error: {name}: {error.render()}", err=True)
    return max((e.exit_code for e in failed.values()), default=ExitCode.OK)


def _note_running_config(settings: Settings) -> None:
    """This plans the file; a daemon running another config serves what that one planned: say so (stderr)."""
    from dankserve.cli.status import disk_changes, pending_line

    pending = disk_changes(settings)
    if pending:
        click.echo(f"note: this plans the file; {pending_line(list(pending))}", err=True)


def local_entrypoints(
    settings: Settings, selected: list[tuple[str, DeploymentSettings]]
) -> list[tuple[str, DeploymentSettings]]:
    """`launcher = "auto"` decides by a Podman image's entrypoint: read here where the image is in local storage
    and the local Podman service answers at once (one try, a short timeout); else the plan says it is read when
    the daemon ensures the image at boot."""
    wanted = {n for n, d in selected if d.runtime == "podman" and d.launcher == "auto"}
    url = settings.podman_url
    if not wanted or not url.startswith("unix://") or not Path(url.removeprefix("unix://")).exists():
        return selected
    from dankserve.runtime.podman import PodmanRuntime

    try:
        runtime = PodmanRuntime(url, request_timeout=5.0, attempts=1)
    except DankserveError:
        return selected
    try:
        read = []
        for name, dep in selected:
            entrypoint = None
            if name in wanted:
                with contextlib.suppress(DankserveError):
                    entrypoint = runtime.local_entrypoint(dep.image)
            read.append((name, dep.with_image_entrypoint(entrypoint)))
        return read
    finally:
        runtime.close()


def error_json(exc: DankserveError) -> dict[str, object]:
    """An error as `plan --json` prints it."""
    return {"message": exc.message, "fix": exc.fix, "exit_code": int(exc.exit_code)}


def select_deployments(settings: Settings, name: str | None, model: str | None) -> list[tuple[str, DeploymentSettings]]:
    """The deployments to plan: the named one, an ad-hoc one for --model, or every enabled one."""
    from dankserve.settings import DeploymentSettings, resolve_config_path

    configured = settings.deployments
    if name is not None:
        if name in configured:
            dep = configured[name]
            return [(name, dep.model_copy(update={"model": model}) if model else dep)]
        if model is not None:
            return [(name, DeploymentSettings(model=model))]
        known = ", ".join(sorted(configured)) or "none configured"
        verb = click.get_current_context().info_name or "plan"
        what = {"pull": "download a model by its Hub id"}.get(verb, "plan an ad-hoc one")
        raise ConfigError(
            f"no deployment named {name!r} (deployments: {known})",
            fix=f"name a configured deployment, or `dankserve {verb} --model ORG/NAME` to {what}",
        )
    if model is not None:  # named as the user wrote it: "--model M" in the plan, its errors and the fit checks
        from dankserve.planning import ad_hoc_name

        return [(ad_hoc_name(model), DeploymentSettings(model=model))]
    enabled = [(n, d) for n, d in configured.items() if d.enabled]
    if not enabled:
        what = "no deployment is enabled" if configured else "no deployments are configured"
        path, _ = resolve_config_path(cli_context().config)
        if not path.exists():  # only the default path may be absent: a named one is refused as it is read
            what += f" (there is no config file at {path})"
        raise ConfigError(
            what,
            fix=f"name one (dankserve {click.get_current_context().info_name} NAME), pass --model ORG/NAME, "
            "or add an enabled [deployments.NAME] table (`dankserve install` writes an example)",
        )
    return enabled


def plan_all(
    settings: Settings,
    selected: Sequence[tuple[str, DeploymentSettings]],
    host: Host,
    vllm_version: str | None,
    *,
    failed: dict[str, DankserveError] | None = None,
) -> list[Plan]:
    """Plan each selected deployment, then check GPU sharing and host RAM against every enabled one.

    With `failed`, a deployment whose plan fails is recorded there (for --json) instead of raising.
    """
    from dankserve.plan.checks import check_fit_together
    from dankserve.planning import plan_one
    from dankserve.settings import keyless_gateway_exposure

    plans: list[Plan] = []
    enabled: list[Plan] = []
    for name, dep in selected:
        try:
            plan = plan_one(settings, name, dep, host, vllm_version=vllm_version)
        except DankserveError as exc:
            if failed is None:
                raise
            failed[name] = exc
            continue
        exposure = keyless_gateway_exposure(settings, name)
        if exposure is not None:
            plan = _with_warning(plan, exposure)
        if not dep.enabled:
            plan = _with_warning(plan, "disabled in config (enabled = false): the daemon does not run it")
        else:
            enabled.append(plan)
        plans.append(plan)
    chosen = {name for name, _ in selected}
    others: list[Plan] = []
    for name, dep in settings.deployments.items():
        if name in chosen or not dep.enabled:
            continue
        try:  # only to check the named deployments against it
            others.append(plan_one(settings, name, dep, host, vllm_version=vllm_version))
        except DankserveError as exc:
            plans = [_with_warning(p, f"not checked against deployment {name!r}: {exc.message}") for p in plans]
    check_fit_together([*enabled, *others], settings.deployments.items(), host, involving=chosen)
    return plans


def _with_warning(plan: Plan, warning: str) -> Plan:
    from dataclasses import replace

    return replace(plan, warnings=(*plan.warnings, warning))


def runs_in(dep: DeploymentSettings) -> str:
    """What runs the server, for the plan's header: the image, or the process runtime's executable."""
    if dep.runtime == "process":
        return f"process {dep.executable or 'vllm'}"
    return dep.image


WHY_INDENT = 6


def print_plans(plans: Sequence[Plan], runs: Mapping[str, str] | None = None) -> None:
    """The text form: the full command, then each flag with its value and, indented beneath, why; warnings last.

    Each reason wraps to the terminal's width under its flag (a table column would squeeze it to a few
    characters at 80 columns)."""
    import shlex

    from rich.text import Text

    from dankserve.cli.console import console as stdout_console

    console = stdout_console(highlight=False)
    indent = " " * WHY_INDENT

    def wrap(text: str, first: str, rest: str) -> str:
        return textwrap.fill(text, max(40, console.width), initial_indent=first, subsequent_indent=rest)

    for i, plan in enumerate(plans):
        if i:
            console.print()
        runner = (runs or {}).get(plan.deployment, plan.image)
        console.rule(Text.assemble((plan.deployment, "bold"), f"  {runner}  (vLLM {plan.vllm_version})"))
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in plan.env.items())
        console.print(f"{env} vllm serve {shlex.join(plan.argv)}", soft_wrap=True, markup=False)
        for choice in plan.flags:
            value = choice.value
            shown = "" if value is None else " ".join(value) if isinstance(value, tuple) else value
            console.print(Text.assemble((choice.flag, "bold"), f" {shown}" if shown else ""))
            console.print(wrap(choice.reason, indent, indent), soft_wrap=True, markup=False)
        gpus = ", ".join(str(i) for i in plan.gpu_indices)
        console.print(f"GPUs: {gpus}   fingerprint: {plan.fingerprint[:16]}")
        if plan.capacity is not None:
            console.print(wrap(f"promises: {plan.capacity.describe()}", "", "  "), soft_wrap=True, markup=False)
        for line in plan.exposure.lines() if plan.exposure is not None else ():
            console.print(wrap(line, "", "  "), soft_wrap=True, markup=False)
        for note in plan.notes:
            console.print(wrap(f"note: {note}", "", "  "), soft_wrap=True, markup=False)
        for warning in plan.warnings:
            text = wrap(f"warning: {warning}", "", "  ")
            console.print(Text.assemble(("warning:", "yellow"), text.removeprefix("warning:")), soft_wrap=True)
