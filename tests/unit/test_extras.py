"""pyproject's extras: ``pip install -e '.[dev]'`` gives what the test command needs (issue 43:
``dev`` lacked clickhouse-connect, so mypy failed after installing it)."""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_dev_extra_holds_every_test_requirement() -> None:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    missing = sorted(set(extras["test"]) - set(extras["dev"]))
    assert missing == [], f"the dev extra lacks {missing} (the test extra has them)"
