"""Tests for dankserve.errors: which errors are the daemon's own (out of descriptors or memory), which are transient."""

from __future__ import annotations

import errno

import pytest

from dankserve.errors import (
    ClusterUnreachable,
    ConfigError,
    DaemonResourcesExhausted,
    DankserveError,
    GroupNotFormed,
    HubAnswerRefused,
    HubUnreachable,
    ImageUnavailable,
    PodmanRequestFailed,
    PodmanUnreachable,
    resources_exhausted,
)


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


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (PodmanUnreachable("podman"), True),
        (HubUnreachable("hub"), True),
        (HubAnswerRefused("hub"), True),
        (ClusterUnreachable("group"), True),
        (GroupNotFormed("ray"), True),
        (PodmanRequestFailed("did not answer in time", transient=True), True),
        (PodmanRequestFailed("refused: port in use"), False),
        (ImageUnavailable("absent"), False),
        (ConfigError("bad value"), False),
    ],
)
def test_errors_say_whether_they_are_transient(error: DankserveError, transient: bool) -> None:
    """The Unreachable errors and a Podman request not answered are transient (waited out); the rest are not."""
    assert error.transient is transient
