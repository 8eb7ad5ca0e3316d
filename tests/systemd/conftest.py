"""The real journald fixture for the systemd edge tests."""

from tests.harness.journald import journald

__all__ = ["journald"]
