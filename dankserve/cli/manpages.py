"""Man pages rendered from the commands' own help (click): `dankserve(1)` and one
`dankserve-COMMAND(1)` per command, in roff. `dankserve install` writes them (into
/usr/local/share/man/man1 by default), `make man` into build/man (scripts/gen_man_pages.py).
Pure: a click group in, page names and texts out."""

from __future__ import annotations

import inspect

import click

from dankserve import __version__

SECTION = "1"


def roff(text: str) -> str:
    """Text as roff: backslashes and hyphens escaped, no line starting with a control character."""
    escaped = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join("\\&" + line if line.startswith((".", "'")) else line for line in escaped.splitlines())


def _paragraphs(text: str) -> str:
    blocks = [block.strip() for block in inspect.cleandoc(text or "").split("\n\n") if block.strip()]
    return "\n.PP\n".join(roff(" ".join(block.split())) for block in blocks)


def _header(title: str, summary: str) -> list[str]:
    return [
        f'.TH {roff(title.upper())} {SECTION} "" "dankserve {__version__}" "dankserve manual"',
        ".SH NAME",
        f"{roff(title)} \\- {roff(summary)}",
    ]


def command_page(group_ctx: click.Context, name: str, command: click.Command) -> str:
    """The page of one command: synopsis, description, options, and the exit codes."""
    ctx = click.Context(command, info_name=name, parent=group_ctx)
    lines = _header(f"dankserve-{name}", command.get_short_help_str(limit=200))
    lines += [".SH SYNOPSIS", f".B dankserve {roff(name)}", roff(" ".join(command.collect_usage_pieces(ctx)))]
    lines += [".SH DESCRIPTION", _paragraphs(command.help or "")]
    options = [param.get_help_record(ctx) for param in command.get_params(ctx) if isinstance(param, click.Option)]
    arguments = [param for param in command.params if isinstance(param, click.Argument)]
    if arguments:
        lines += [".SH ARGUMENTS"]
        for argument in arguments:
            names_deployment = argument.name in ("deployment", "name")
            what = "a deployment of the config file (TAB completes the names)" if names_deployment else ""
            lines += [".TP", f".B {roff(argument.human_readable_name)}", roff(what or argument.human_readable_name)]
    records = [record for record in options if record is not None]
    if records:
        lines += [".SH OPTIONS"]
        for flags, help_text in records:
            lines += [".TP", f".B {roff(flags)}", roff(" ".join(help_text.split()))]
    lines += [".SH SEE ALSO", "\\fBdankserve\\fR(1)"]
    return "\n".join(lines) + "\n"


def pages(group: click.Group) -> dict[str, str]:
    """File name -> page text: dankserve.1 (every command, the exit codes) and dankserve-NAME.1 each."""
    ctx = click.Context(group, info_name="dankserve")
    names = group.list_commands(ctx)
    out: dict[str, str] = {}
    lines = _header("dankserve", "plan, start and keep the vLLM OpenAI server serving on a GPU host")
    lines += [".SH SYNOPSIS", ".B dankserve", "[\\-\\-config FILE] [\\-\\-debug] COMMAND [ARGS]..."]
    lines += [".SH DESCRIPTION", _paragraphs(group.help or ""), ".SH COMMANDS"]
    for name in names:
        command = group.get_command(ctx, name)
        if command is None:
            continue
        lines += [".TP", f"\\fBdankserve\\-{roff(name)}\\fR({SECTION})", roff(command.get_short_help_str(limit=200))]
        out[f"dankserve-{name}.{SECTION}"] = command_page(ctx, name, command)
    lines += [".SH FILES", "/etc/dankserve/dankserve.toml (the default config; \\-\\-config or $DANKSERVE_CONFIG)"]
    out[f"dankserve.{SECTION}"] = "\n".join(lines) + "\n"
    return out
