"""The process exit codes of every dankserve command, documented in the README.

`systemd` relies on these: the unit lists 2, 3 and 4 in `RestartPreventExitStatus`, so a
configuration or environment error never turns into a restart loop.
"""

from enum import IntEnum


class ExitCode(IntEnum):
    """What a dankserve process's exit status means."""

    OK = 0
    """Success."""
    INTERNAL = 1
    """An unexpected internal error: a bug. The only case that may print a traceback (--debug)."""
    INVALID_INPUT = 2
    """Arguments, config file, setting values or a recorded-host file are invalid."""
    ENVIRONMENT = 3
    """The environment is not usable: no NVIDIA driver or GPU, Podman unreachable, a tool missing."""
    INFEASIBLE = 4
    """The deployment cannot run on this host as configured."""
