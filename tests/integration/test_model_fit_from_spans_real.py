"""``model fit --from-spans`` on the real local vLLM: a short open-loop load (the session
server exports its spans to the session receiver), a refit from the spans of that window
alone, and the refit's prediction for the load's own arrivals set against what the client
measured. About 20 s: one load of 60 requests, no server start.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.capacity.check_run import LoadPoint, run_load_point
from phaseprobe.collect.capacity.model_check import predicted_for
from phaseprobe.collect.capacity.model_fit import load_fit
from phaseprobe.present.cli import main
from phaseprobe.store import Store
from tests.integration.conftest import SpanTarget, VllmTarget

pytestmark = pytest.mark.integration


def _median(values: list[Any]) -> float:
    v = sorted(x for x in values if x is not None)
    return float(v[len(v) // 2])


def test_a_refit_from_a_busy_servers_spans_predicts_its_load(
    local_vllm: VllmTarget,
    span_target: SpanTarget | None,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if span_target is None:
        pytest.skip("an external vLLM exports its spans elsewhere")
    started = time.time_ns()
    # two lengths, so the prefill cost has something to vary; Poisson, so the load varies
    loads = [
        run_load_point(
            local_vllm.base_url,
            local_vllm.model,
            LoadPoint(rate=5.0, requests=30, prompt_tokens=p, output_tokens=16, seed=11 + p),
        )
        for p in (48, 320)
    ]
    for load in loads:
        assert len(load.ok) == 30, [r.error for r in load.requests if r.error][:3]
    deadline = time.monotonic() + 30  # the exporter sends its batch every few seconds
    while time.monotonic() < deadline:
        with Store(span_target.store_path, readonly=True) as spans:
            n = len(spans.finished_spans(since_ns=started))
        if n >= 60:
            break
        time.sleep(1.0)
    assert n >= 60, f"{n} spans of the 60 requests reached the store"
    window_s = (time.time_ns() - started) / 1e9 + 1
    store = tmp_path / "fits.sqlite"
    rc = main(
        ["model", "fit", "--from-spans", "--spans-store", str(span_target.store_path),
         "--window", f"{window_s:.0f}s", "--model", local_vllm.model, "--store", str(store),
         "--json"]
    )  # fmt: skip
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    doc = json.loads(captured.out)
    assert doc["source"] == "spans" and doc["design"]["from_spans"]["spans_used"] >= 60
    cost = doc["fit"]["cost"]
    assert cost["base_s"] > 0 and cost["per_prefill_token_s"] > 0, cost
    held = doc["fit"]["held_out_error"]
    assert held["span_decode"] is not None and held["span_prefill"] is not None, held

    with Store(store, readonly=True) as s:
        fit = load_fit(s)
    for load in loads:
        pred = predicted_for(fit, load)
        ttft = [r.ttft_s for r in load.ok]
        e2e = [r.e2e_s for r in load.ok]
        ratio_ttft = _median(pred["ttft"]) / _median(ttft)
        ratio_e2e = _median(pred["e2e"]) / _median(e2e)
        print(
            f"prompt {load.point.prompt_tokens}: TTFT p50 predicted/measured {ratio_ttft:.2f}, "
            f"E2E p50 {ratio_e2e:.2f}; held-out {held}"
        )
        # the client's side holds what no span does (the network, a busy box's client, whose
        # TTFT the clean-clone CI measured 3.4x the refit's at load 15): each point within
        # 10x (a wrong unit is 100-1000x), the request's end, the server's, within 3x
        assert 1 / 10 < ratio_ttft < 10 and 1 / 3 < ratio_e2e < 3, (ratio_ttft, ratio_e2e)
    # Not asserted: how TTFT grows from the 48- to the 320-token prompt. The client's share
    # is a constant the spans do not hold, so the ratios move apart with the load (0.15 and
    # 0.34 at load 3 here): neither their quotient nor their difference is the refit's own.
