"""``watch``'s speculation over its window: the pages it already reads for the span loss give
each watched server's drafts and acceptance (a window figure), "not enabled" servers get no
line, and a server that restarted is "cannot verify"."""

from __future__ import annotations

import itertools

from phaseprobe.collect.watch.counters import FinishedCounter
from phaseprobe.present.cli.cmd_watch import _spec_lines
from phaseprobe.sources.vllm.metrics import parse_exposition
from tests.unit.test_spec_decode import DATA, PLAIN_METRICS


def _counter(texts: list[str]) -> FinishedCounter:
    pages = iter(texts)
    shown: list[str] = []

    def page():  # type: ignore[no-untyped-def]
        return parse_exposition(shown[-1], wall_ns=len(shown) * 10**9)

    def read() -> float:
        shown.append(next(pages))
        return float(len(shown))

    t = itertools.count()
    return FinishedCounter(
        "http://vllm:8000",
        replica="vllm",
        read=read,
        page=page,
        min_interval_s=0.0,
        monotonic=lambda: float(next(t)),
    )


def test_the_window_gives_the_acceptance_of_the_real_counters() -> None:
    before, after = (DATA / "before.txt").read_text(), (DATA / "after.txt").read_text()
    c = _counter([before, after])
    assert c.spec(60.0) is None  # one page: nothing to compare yet
    c.refresh()
    f = c.spec(60.0)
    assert f is not None and not isinstance(f, str)
    assert (f.drafts, f.draft_tokens, f.accepted, f.accepted_per_pos) == (9, 23, 7, (5, 1, 1))
    lines = _spec_lines({"vllm": f}, 60.0)
    assert lines == [
        "speculative decoding of vllm (last 60 s, window figure): 9 drafts, 7 of 23 draft "
        "tokens accepted (30%; by position 5 / 1 / 1), mean accepted length 1.78"
    ]


def test_no_speculation_no_line_and_a_restart_cannot_verify() -> None:
    plain = PLAIN_METRICS.read_text()
    c = _counter([plain, plain])
    c.refresh()
    assert c.spec(60.0) is None
    before, after = (DATA / "before.txt").read_text(), (DATA / "after.txt").read_text()
    back = _counter([after, before])  # the counters went backwards: a restart
    back.refresh()
    why = back.spec(60.0)
    assert isinstance(why, str) and "cannot verify" in why
    assert "cannot verify" in _spec_lines({"vllm": why}, None)[0]
