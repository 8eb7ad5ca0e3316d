"""The `dankserve` entry point: global options, lazy command loading, error reporting.

Commands are imported only when invoked, so `dankserve probe --json` does not pay for
Podman's or rich's import. A DankserveError becomes its message, its fix and its exit code;
anything else is a bug: exit 1, with the traceback only under --debug.
"""

from __future__ import annotations

import difflib
import importlib
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path

import click

from dankserve.cli.context import CliContext
from dankserve.errors import DankserveError
from dankserve.exitcodes import ExitCode
from dankserve.exitcodes import summary as exit_summary

# command name -> module under dankserve.cli (each module exposes `command`)
COMMANDS: dict[str, tuple[str, str]] = {
    "probe": ("probe", "Probe GPUs, CPUs, memory and NUMA; print or save the host description."),
    "plan": ("plan", "Compute the vLLM command line for a deployment, with a reason per flag."),
    "pull": ("pull", "Download a model's weights into the HF cache, with progress (resumable)."),
    "run": ("run", "Run the supervisor daemon in the foreground (systemd's ExecStart)."),
    "up": ("up", "Start the service (or one deployment) and follow it until ready."),
    "down": ("down", "Stop the service (or one deployment) gracefully."),
    "restart": ("restart", "Restart one deployment (the gateway queues its requests) and follow it until ready."),
    "status": ("status", "Show the daemon and each deployment's state."),
    "reload": ("reload", "Make the running daemon re-read its config; say what restarts and what keeps running."),
    "sleep": ("sleep", "Put a swap group member to sleep now (vLLM's sleep mode)."),
    "wake": ("wake", "Wake a sleeping swap group member and wait until it is ready."),
    "upgrade": ("upgrade", "Try a new vLLM image beside the old server; switch, or roll back on a regression."),
    "rollback": ("rollback", "Go back to the image before the last upgrade (a warm boot)."),
    "logs": ("logs", "Show daemon and container logs together."),
    "usage": ("usage", "Show requests and tokens per gateway key and model (kept across restarts)."),
    "inspect-log": ("inspect_log", "Read a vLLM boot log and print the facts learned from it."),
    "export": ("export", "Print a deployment as a Podman Quadlet .container unit, for plain systemd."),
    "install": ("install", "Install the systemd unit and the example config."),
    "doctor": ("doctor", "Check what a GPU host needs: Podman, driver, CDI, disk, image."),
}


OTHER_TOOLS_WORDS: dict[str, str] = {
    "start": "up",
    "stop": "down",
    "ps": "status",
    "ls": "status",
    "list": "status",
    "show": "status",
    "log": "logs",
    "top": "status",
}
"""Verbs of systemctl, docker, podman and ollama that users type, and the dankserve command doing that."""


class StdoutClosed(Exception):
    """stdout's reader went away while a command wrote (`dankserve plan | head -1`): `main` ends quietly."""


class LazyGroup(click.Group):
    """A group whose commands are imported on first use."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except BrokenPipeError as exc:  # click's main would end a closed pipe with exit 1
            raise StdoutClosed from exc

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(name for name, (module, _) in COMMANDS.items() if _module_exists(module))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None or not _module_exists(entry[0]):
            return None
        module = importlib.import_module(f"dankserve.cli.{entry[0]}")
        command: click.Command = module.command
        return with_global_options(command)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        try:
            return super().resolve_command(ctx, args)
        except click.UsageError as exc:
            name = args[0] if args else ""
            if self.get_command(ctx, name) is not None:
                raise
            known = OTHER_TOOLS_WORDS.get(name.lower())
            if known is not None:
                rest = " ".join(args[1:])[:200]
                raise click.UsageError(
                    f"No such command {name!r}. Did you mean `dankserve {known}{' ' + rest if rest else ''}`?"
                    + (" (`dankserve sleep NAME` puts a swap group member to sleep)" if known == "down" else ""),
                    ctx,
                ) from exc
            close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
            if not close:
                raise
            raise click.UsageError(f"No such command {name!r}. Did you mean {close[0]!r}?", ctx) from exc

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, COMMANDS[name][1]) for name in self.list_commands(ctx)]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _set_config(ctx: click.Context, _param: click.Parameter, value: Path | None) -> None:
    if value is not None:
        current = ctx.find_object(CliContext) or CliContext(config=None, debug=False)
        ctx.obj = replace(current, config=value)


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        current = ctx.find_object(CliContext) or CliContext(config=None, debug=False)
        ctx.obj = replace(current, debug=True)


def with_global_options(command: click.Command) -> click.Command:
    """Accept `--config` and `--debug` after the command name too (`dankserve plan --config F`),
    as podman and kubectl accept their global options anywhere."""
    if any(p.name == "global_config" for p in command.params):
        return command
    command.params.append(
        click.Option(
            ["--config", "global_config"],
            type=click.Path(path_type=Path, dir_okay=False),
            default=None,
            expose_value=False,
            callback=_set_config,
            help="Config file (also accepted before the command).",
        )
    )
    command.params.append(
        click.Option(
            ["--debug", "global_debug"],
            is_flag=True,
            expose_value=False,
            callback=_set_debug,
            help="Print tracebacks of internal errors.",
        )
    )
    return command


def _module_exists(module: str) -> bool:
    return (Path(__file__).parent / f"{module}.py").is_file()


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Config file (default $DANKSERVE_CONFIG or /etc/dankserve/dankserve.toml).",
)
@click.option("--debug", is_flag=True, help="Print tracebacks of internal errors.")
@click.version_option(package_name="dankserve")
@click.pass_context
def cli(ctx: click.Context, config: Path | None, debug: bool) -> None:
    """dankserve: plan, start and keep the vLLM OpenAI server serving on this GPU host."""
    ctx.obj = CliContext(config=config, debug=debug)


cli.help = f"{cli.help}\n\nExit codes (README's table says more): {exit_summary()}."


def main(argv: list[str] | None = None) -> None:
    """Run the CLI and exit with a documented exit code.

    A closed stdout pipe (`dankserve plan | head -1`) ends quietly: exit 0 while the command still wrote (its
    reader wanted no more, as with unix filters), or the code the command had already decided when only the
    last buffered output met it. stdout then points at /dev/null, so the interpreter's own flush at exit cannot
    fail again (the recipe of Python's docs, signal module, "Note on SIGPIPE")."""
    code = int(ExitCode.OK)
    try:
        code = _run(argv)
        sys.stdout.flush()  # what is still buffered meets a closed pipe here, not in the interpreter's exit
    except (StdoutClosed, BrokenPipeError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    sys.exit(code)


def _run(argv: list[str] | None) -> int:
    """The command's exit code; a DankserveError reported as message and fix, a bug as exit 1."""
    debug = "--debug" in (sys.argv[1:] if argv is None else argv)
    try:
        rc = cli.main(args=argv, prog_name="dankserve", standalone_mode=False)
    except DankserveError as exc:
        click.echo(f"error: {exc.render()}", err=True)
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.exceptions.Exit as exc:
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return int(ExitCode.INVALID_INPUT)
    except KeyboardInterrupt:
        return 130
    except (StdoutClosed, BrokenPipeError):
        raise  # stdout's reader went away: not a bug (main ends it quietly)
    except Exception:  # the last line of defence: a bug
        if debug:
            traceback.print_exc()
        else:
            click.echo(
                "error: internal error (a bug in dankserve); run again with --debug for the traceback",
                err=True,
            )
        return int(ExitCode.INTERNAL)
    # commands return an ExitCode (or None for success); ctx.exit(n) returns n here
    return int(rc) if isinstance(rc, int) else int(ExitCode.OK)
