"""Shared by every test: no state leaks from one test into the next."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from phaseprobe.redact import forget_secrets


@pytest.fixture(autouse=True)
def _no_secrets_carried_over() -> Iterator[None]:
    """The secret mask is process-wide (a secret registered once is masked everywhere after):
    a test's keys must not blot out the next test's output."""
    yield
    forget_secrets()
