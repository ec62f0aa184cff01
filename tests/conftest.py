"""Shared by every test: no state leaks from one test into the next."""

from __future__ import annotations

import signal
from collections.abc import Iterator

import pytest
from hypothesis import settings

from phaseprobe.redact import forget_secrets

# No per-example deadline: Hypothesis' default (200 ms) is a timed assertion, and on a busy
# 2-core runner one example of a microsecond function took 267 ms and failed the suite. Speed
# targets live in bench/, not in tests.
settings.register_profile("phaseprobe", deadline=None)
settings.load_profile("phaseprobe")

# A pytest started in the background by a non-interactive shell (tests/run_all.sh runs one of
# its two integration runs so) begins with SIGINT ignored, and every process a test starts would
# inherit that (an ignored signal survives exec; a handler does not): the tests that stop a
# `phaseprobe watch` with SIGINT, as Ctrl-C does, then waited 120 s for a watch that never heard
# it (6 tests in the first trial of the split run). Python's own Ctrl-C handler is put back.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(autouse=True)
def _no_secrets_carried_over() -> Iterator[None]:
    """The secret mask is process-wide (a secret registered once is masked everywhere after):
    a test's keys must not blot out the next test's output."""
    yield
    forget_secrets()
