"""Speculative decoding from vLLM's counters: the per-run deltas of two real vLLM 0.32 scrapes
(``tests/data/vllm032_spec_ngram``: n-gram speculation, k = 3, one 32-token request between
them), the figures, "not enabled", counters that go backwards, the step-cost fit and the
break-even."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from phaseprobe.analysis.phases import summarize
from phaseprobe.analysis.spec_decode import (
    NOT_ENABLED,
    ab_speculation_note,
    break_even,
    plain_step_of,
    spec_deltas,
    spec_figures,
    spec_report,
    step_costs,
)
from phaseprobe.present.cli.console import render_probe
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases
from phaseprobe.sources.vllm.metrics import parse_exposition

DATA = Path(__file__).parents[1] / "data" / "vllm032_spec_ngram"
PLAIN_METRICS = Path(__file__).parents[1] / "data" / "vllm_0.32.0_metrics.txt"
MS = 1_000_000


def _snap(name: str):  # type: ignore[no-untyped-def]
    return parse_exposition((DATA / name).read_text(), source=name)


def test_deltas_of_one_real_request() -> None:
    deltas, why = spec_deltas(_snap("before.txt"), _snap("after.txt"), "tiny-llama")
    assert why is None
    # read off the two pages: drafts 9→18, draft tokens 22→45, accepted 11→18 (7/2/2→12/3/3)
    assert deltas == {
        "spec_drafts": 9.0,
        "spec_draft_tokens": 23.0,
        "spec_accepted": 7.0,
        "spec_accepted_pos.0": 5.0,
        "spec_accepted_pos.1": 1.0,
        "spec_accepted_pos.2": 1.0,
    }
    fig = spec_figures(deltas)
    assert fig is not None
    assert fig.acceptance_rate == pytest.approx(7 / 23)
    assert fig.mean_accepted_length == pytest.approx(1 + 7 / 9)
    assert fig.draft_length == pytest.approx(23 / 9)
    assert fig.per_position_rate == pytest.approx((5 / 9, 1 / 9, 1 / 9))


def test_a_server_without_speculation_is_not_enabled() -> None:
    plain = parse_exposition(PLAIN_METRICS.read_text())
    assert spec_deltas(plain, plain, None) == ({}, None)
    assert spec_figures({}) is None
    runs = [_run(0, drafts=None)]
    rep = spec_report(runs)
    assert not rep.enabled
    assert rep.to_dict() == {"enabled": False, "why": NOT_ENABLED}
    assert "not enabled" in rep.sentence()


def test_a_counter_that_went_backwards_cannot_be_verified() -> None:
    deltas, why = spec_deltas(_snap("after.txt"), _snap("before.txt"), "tiny-llama")
    assert deltas == {}
    assert why is not None and "went backwards (18 -> 9)" in why and "cannot verify" in why


def _run(
    seq: int,
    *,
    drafts: float | None,
    accepted: float = 0.0,
    n: int = 32,
    drafted_ms: float = 12.0,
    plain_ms: float = 6.0,
    k: float = 3.0,
) -> Run:
    """An isolated run whose decode time is exactly drafted·c_s + plain·c_p."""
    counters: dict[str, float] = {"generation_tokens": float(n)}
    decode = (n - 1) * plain_ms * 1e-3
    if drafts is not None:
        counters |= {
            "spec_drafts": drafts,
            "spec_draft_tokens": drafts * k,
            "spec_accepted": accepted,
            "spec_accepted_pos.0": accepted,
        }
        plain = n - 1 - accepted - drafts
        decode = (drafts * drafted_ms + plain * plain_ms) * 1e-3
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(20 * MS, int((20 + decode * 1e3) * MS)),
        end_offset_ns=int((21 + decode * 1e3) * MS),
        http_status=200,
        prompt_tokens=8,
        completion_tokens=n,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(1e-4, 0.015, decode, None, 0.02, None, {}, counters)
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=True),
    )


def test_step_costs_are_fitted_when_the_runs_differ_in_drafted_share() -> None:
    runs = [_run(0, drafts=4, accepted=2), _run(1, drafts=10, accepted=10)]
    costs = step_costs(runs)
    assert costs.reason is None
    assert costs.drafted_s == pytest.approx(0.012)
    assert costs.plain_s == pytest.approx(0.006)
    # (12 / 6 − 1) / 3: a third of the drafts must be accepted to break even
    assert break_even(0.012, 0.006, 3) == pytest.approx(1 / 3)
    rep = spec_report(runs)
    assert rep.break_even_rate == pytest.approx(1 / 3)
    assert rep.figures is not None and rep.figures.acceptance_rate == pytest.approx(12 / 42)
    assert rep.below_break_even is True
    assert "slows decode down" in rep.sentence()


def test_step_costs_are_not_claimed_when_every_run_drafts_alike() -> None:
    runs = [_run(i, drafts=8, accepted=8) for i in range(4)]
    costs = step_costs(runs)
    assert costs.drafted_s is None and costs.plain_s is None
    assert costs.reason is not None and "cannot be told" in costs.reason
    rep = spec_report(runs)
    assert rep.break_even_rate is None and rep.below_break_even is None
    assert "break-even unknown" in rep.sentence()


def test_free_drafting_breaks_even_at_zero_and_dear_drafting_never_pays() -> None:
    assert break_even(0.005, 0.006, 3) == 0.0
    be = break_even(0.030, 0.006, 2)
    assert be is not None and be > 1


def test_probe_table_shows_acceptance_per_run_and_the_sentence() -> None:
    runs = [_run(0, drafts=4, accepted=2), _run(1, drafts=10, accepted=10)]
    console = Console(width=200, record=True)
    render_probe(console, runs, summarize(runs), {}, [], 1)
    text = console.export_text()
    assert "accepted %" in text and "accept len" in text
    assert "17%" in text and "1.50" in text  # run 1: 2 of 12 draft tokens, 1 + 2/4
    assert "33%" in text and "2.00" in text  # run 2: 10 of 30, 1 + 10/10
    assert "break-even acceptance 33%" in text


def test_the_fitted_costs_carry_their_standard_errors() -> None:
    exact = [_run(0, drafts=4, accepted=2), _run(1, drafts=10, accepted=10), _run(2, drafts=6)]
    costs = step_costs(exact)
    assert costs.drafted_se_s == pytest.approx(0, abs=1e-12)  # decode times fit exactly
    noisy = [*exact[:2], _run(2, drafts=6, drafted_ms=14.0)]  # one run's drafted steps dearer
    costs = step_costs(noisy)
    assert costs.drafted_se_s is not None and costs.drafted_se_s > 1e-4
    assert costs.plain_se_s is not None and costs.plain_se_s > 0
    assert " ± " in spec_report(noisy).sentence()
    assert step_costs(exact[:2]).drafted_se_s is None  # two runs: no residual to judge by


def test_costs_known_to_no_better_than_half_give_no_break_even() -> None:
    runs = [
        _run(0, drafts=4, accepted=2, drafted_ms=2.0),
        _run(1, drafts=10, accepted=10, drafted_ms=30.0),
        _run(2, drafts=6, drafted_ms=4.0, plain_ms=12.0),
    ]
    costs = step_costs(runs)
    assert costs.reason is not None and "too uncertain" in costs.reason, costs
    rep = spec_report(runs)
    assert rep.break_even_rate is None and rep.below_break_even is None
    assert "break-even unknown: the fitted step costs are too uncertain" in rep.sentence()


def test_an_ab_with_one_speculating_arm_sets_the_break_even_against_the_plain_arm() -> None:
    # the speculating server's non-drafted steps cost 8 ms (its proposer runs on every step);
    # the plain server's steps 5 ms: α* = (12 / 5 − 1) / 3 = 47 % against the plain arm,
    # (12 / 8 − 1) / 3 = 17 % against itself; 24 of 42 drafted tokens accepted (57 %)
    spec = [
        _run(0, drafts=4, accepted=6, k=3, drafted_ms=12.0, plain_ms=8.0),
        _run(1, drafts=10, accepted=18, k=3, drafted_ms=12.0, plain_ms=8.0),
    ]
    plain = [_run(i, drafts=None, plain_ms=5.0) for i in range(3)]
    assert plain_step_of(plain) == pytest.approx(0.005)
    note = ab_speculation_note(plain, spec, "plain", "ngram")
    assert note is not None
    assert (
        "speculation (arm ngram): acceptance 57%, mean accepted length 2.71 over 14 drafts" in note
    )
    assert "a drafted step 12.00 ms against arm plain's decode step 5.00 ms: break-even 47%" in note
    assert "(pays by the counters" in note
    assert "17% against its own non-drafted steps (8.00 ms)" in note
    # both arms plain, or both speculating: nothing to set against
    assert ab_speculation_note(plain, plain, "a", "b") is None
    assert ab_speculation_note(spec, spec, "a", "b") is None
