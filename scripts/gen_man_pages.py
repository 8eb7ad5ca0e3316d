#!/usr/bin/env python3
"""Write the man pages rendered from the commands' help (dankserve.cli.manpages) into a directory
(`make man`: build/man); `dankserve install` installs the same pages."""

from __future__ import annotations

import sys
from pathlib import Path

from dankserve.cli.main import cli
from dankserve.cli.manpages import pages


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path("build/man")
    out.mkdir(parents=True, exist_ok=True)
    for name, text in sorted(pages(cli).items()):
        (out / name).write_text(text)
    print(f"wrote {len(pages(cli))} man pages to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
