"""The `dankserve` command line: one module per command, each exposing `command`."""
