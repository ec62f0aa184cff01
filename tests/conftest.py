"""Shared by every test: no state leaks from one test into the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

from phaseprobe.redact import forget_secrets

# No per-example deadline: Hypothesis' default (200 ms) is a timed assertion, and on a busy
# 2-core runner one example of a microsecond function took 267 ms and failed the suite. Speed
# targets live in bench/, not in tests.
settings.register_profile("phaseprobe", deadline=None)
settings.load_profile("phaseprobe")


@pytest.fixture(autouse=True)
def _no_secrets_carried_over() -> Iterator[None]:
    """The secret mask is process-wide (a secret registered once is masked everywhere after):
    a test's keys must not blot out the next test's output."""
    yield
    forget_secrets()
