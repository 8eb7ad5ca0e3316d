"""Tests for dankserve.errors: which errors are the daemon's own (out of descriptors or memory)."""

from __future__ import annotations

import errno

import pytest

from dankserve.errors import DaemonResourcesExhausted, PodmanUnreachable, resources_exhausted


def _raised_from(cause: BaseException) -> RuntimeError:
    try:
        try:
            raise cause
        except BaseException as exc:
            raise RuntimeError("wrapped") from exc
    except RuntimeError as wrapped:
        return wrapped


@pytest.mark.parametrize(
    ("exc", "own"),
    [
        (OSError(errno.EMFILE, "Too many open files"), True),
        (OSError(errno.ENFILE, "File table overflow"), True),
        (OSError(errno.ENOMEM, "Cannot allocate memory"), True),
        (MemoryError(), True),
        (_raised_from(OSError(errno.EMFILE, "Too many open files")), True),
        (OSError(errno.ECONNREFUSED, "Connection refused"), False),
        (FileNotFoundError(errno.ENOENT, "No such file"), False),
        (PodmanUnreachable("podman"), False),
        (ValueError("bug"), False),
    ],
)
def test_own_resource_errors_are_recognised(exc: BaseException, own: bool) -> None:
    """EMFILE, ENFILE, ENOMEM and MemoryError (also behind a wrapper) are the daemon's own; others are not."""
    found = resources_exhausted(exc)
    assert (found is not None) is own
    if found is not None:
        assert isinstance(found, DaemonResourcesExhausted) and "retrying" in found.message
