"""``model fit → predict → check`` on the real local vLLM (the session's, started with its step
log): the fit comes from the server's own steps, the check from a real open-loop load that was
not part of the fit. Kept short for CI: a quick fit and two rates of 24 requests.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.present.cli import main
from tests.integration.conftest import VllmTarget

pytestmark = pytest.mark.integration


def _cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    rc = main(argv)
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    doc: dict[str, Any] = json.loads(captured.out)
    return doc


def test_fit_predict_check_on_the_local_vllm(
    local_vllm: VllmTarget, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if local_vllm.log_path is None:
        pytest.skip("an external vLLM: its step log is not ours to read")
    store = str(tmp_path / "model.sqlite")
    url = local_vllm.base_url
    fit = _cli(
        ["model", "fit", "--endpoint", url, "--step-log", str(local_vllm.log_path), "--quick",
         "--store", store, "--json"],
        capsys,
    )  # fmt: skip
    cost = fit["fit"]["cost"]
    # a prompt token costs compute, and a step has a fixed part: both seen in the real steps
    assert cost["per_prefill_token_s"] > 0 and cost["base_s"] > 0, cost
    assert fit["steps"] > 50 and fit["fingerprint"]["model"] == local_vllm.model
    held = fit["fit"]["held_out_error"]
    assert held["prefill"] is not None and held["decode"] is not None, held
    # limits say where they came from: not launched by phaseprobe, none given
    assert "assumed" in fit["limits"]["max_num_seqs"]["source"]
    assert fit["limits"]["kv_capacity_tokens"]["source"].startswith("server")

    slo = "ttft=2,tpot=0.5"
    work = ["--prompt-tokens", "64", "--output-tokens", "16", "--slo", slo, "--store", store]
    pred = _cli(
        ["model", "predict", "--rates", "1,4", "--requests", "300", *work, "--json"], capsys
    )
    assert [p["rate"] for p in pred["rates"]] == [1.0, 4.0]
    p1 = pred["rates"][0]
    assert p1["stable"] and p1["ttft"]["p50"] is not None
    assert pred["saturation"]["rate"] > 4.0 or not pred["rates"][1]["stable"]

    check = _cli(
        ["model", "check", "--endpoint", url, "--rates", "1,4", "--requests", "24", "--seed", "3",
         *work, "--json"],
        capsys,
    )  # fmt: skip
    assert [p["rate"] for p in check["points"]] == [1.0, 4.0]
    ratios = []
    for point in check["points"]:
        assert point["failed"] == 0, point
        rows = {(r["metric"], r["percentile"]): r for r in point["rows"]}
        ttft, e2e = rows[("ttft", 50)], rows[("e2e", 50)]
        assert ttft["predicted_s"] is not None and ttft["measured_s"] is not None
        assert rows[("tpot", 50)]["predicted_s"] is not None
        assert ("ttft", 99) not in rows  # 24 requests do not make a p99
        ratios.append(
            (ttft["predicted_s"] / ttft["measured_s"], e2e["predicted_s"] / e2e["measured_s"])
        )
    # On a shared 2-core box the measured side carries the machine's contention, which the fit
    # (made minutes earlier) did not: the clean-clone CI, with six other vLLMs of the session
    # alive at load 15, measured a TTFT p50 of 200 ms where the fit said 16 ms (12x), E2E 5x.
    # So each point is held to 30x (a wrong unit or a missing term is 100-1000x). Not asserted:
    # how the phases grow from 1 to 4 requests/s; the contention differs from one point to the
    # next (a later CI: TTFT ratios 0.21 at 1/s and 0.66 at 4/s).
    for ratio_ttft, ratio_e2e in ratios:
        assert 1 / 30 < ratio_ttft < 30 and 1 / 30 < ratio_e2e < 30, ratios
    assert check["analysis_id"] is not None and check["fit_id"] == fit["analysis_id"]
    # the three requests sent alone first: measured, predicted, and said when 2x apart
    alone = check["alone"]
    assert (alone["requests"], alone["answered"]) == (3, 3), alone
    unlike = [d for d in check["differences"] if d.startswith("a request alone now takes")]
    for metric in ("ttft", "tpot"):
        assert alone["measured_s"][metric] > 0 and alone["predicted_s"][metric] > 0, alone
        far = not 0.5 <= alone["ratio"][metric] <= 2.0
        assert far == any(
            d.startswith(f"a request alone now takes {metric.upper()}") for d in unlike
        )
