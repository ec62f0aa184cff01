"""Driving the dashboard with Streamlit's AppTest: shared by the unit tests (hand-made stores)
and the integration tests (stores filled by real probes of the local vLLM)."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from phaseprobe.present.cli.cmd_dashboard import APP

__all__ = ["open_app", "goto", "count_charts", "page_text"]


def open_app(monkeypatch: pytest.MonkeyPatch, store: Path) -> AppTest:
    monkeypatch.setenv("PHASEPROBE_STORE", str(store))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    assert not at.exception, at.exception
    return at


def goto(at: AppTest, page: str, experiment: int | None = None) -> AppTest:
    at.sidebar.radio(key="page").set_value(page).run()
    if experiment is not None:
        at.sidebar.selectbox(key="experiment").set_value(experiment).run()
    assert not at.exception, at.exception
    return at


def count_charts(at: AppTest) -> int:
    return len(at.get("arrow_vega_lite_chart")) + len(at.get("vega_lite_chart"))


def page_text(at: AppTest) -> str:
    """Every info, caption, markdown, warning and error text on the page, one per line."""
    parts = [
        e.value
        for kind in ("info", "caption", "markdown", "warning", "error")
        for e in at.get(kind)
        if isinstance(getattr(e, "value", None), str)
    ]
    return "\n".join(parts)
