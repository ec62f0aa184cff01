"""``model check`` wired: a real open-loop load at each rate, the model's prediction for the
very arrivals the load achieved, and the comparison, stored.

The server is the one given, or the local CPU vLLM started with the fit's own scheduler limits
(a check of a model against another configuration would be no check). Either way the check's
requests are new ones: the model is judged on runs it was not fitted on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from phaseprobe.analysis.capacity_model.alike import AloneCheck, alone_check
from phaseprobe.analysis.capacity_model.check import PointCheck, compare_point, share_meeting
from phaseprobe.analysis.capacity_model.simulate import simulate
from phaseprobe.analysis.capacity_model.slo import Slo, largest_rate
from phaseprobe.analysis.capacity_model.slo_search import (
    MeasuredSloRate,
    SearchBounds,
    SearchPoint,
    search_slo_rate,
)
from phaseprobe.analysis.capacity_model.workload import Fixed, SimRequest, WorkloadSpec
from phaseprobe.collect.capacity.check_run import LoadPoint, MeasuredLoad, run_load_point
from phaseprobe.collect.capacity.model_fit import (
    CapacityFit,
    LimitsGiven,
    fingerprint_differences,
    load_fit,
)
from phaseprobe.errors import ConfigError
from phaseprobe.notes import Notes
from phaseprobe.sources.vllm.openai_stream import normalize_base_url
from phaseprobe.store import Store

__all__ = ["CHECK_KIND", "CheckResult", "check_deployment", "predicted_for", "check_bench"]

CHECK_KIND = "capacity_check"


@dataclass
class CheckResult:
    """Every load point's comparison, and what makes the comparison weaker."""

    fit_id: int | None
    points: list[PointCheck] = field(default_factory=list)
    loads: list[MeasuredLoad] = field(default_factory=list)
    differences: list[str] = field(default_factory=list)
    notes: Notes = field(default_factory=Notes)
    analysis_id: int | None = None
    slo_search: MeasuredSloRate | None = None  # with --search-slo
    search_loads: list[MeasuredLoad] = field(default_factory=list)
    alone: AloneCheck | None = None  # the requests sent alone before the load
    alone_loads: list[MeasuredLoad] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "fit_id": self.fit_id,
            "points": [p.to_dict() for p in self.points],
            "differences": self.differences,
            "notes": self.notes.to_list(),
            "analysis_id": self.analysis_id,
            "slo_search": None if self.slo_search is None else self.slo_search.to_dict(),
            "alone": None if self.alone is None else self.alone.to_dict(),
        }


def predicted_for(fit: CapacityFit, load: MeasuredLoad) -> dict[str, list[float | None]]:
    """The model's TTFT/TPOT/ITL/E2E for the requests of ``load``, at the times they left."""
    reqs = [
        SimRequest(arrival_s=r.sent_s, prompt_tokens=r.prompt_tokens, output_tokens=r.output_tokens)
        for r in load.requests
    ]
    run = simulate(reqs, fit.cost, fit.limits, fit.overheads)
    outcomes = sorted(run.outcomes, key=lambda o: o.arrival_s)
    return {
        "ttft": [o.ttft_s for o in outcomes],
        "tpot": [o.tpot_s for o in outcomes],
        "e2e": [o.e2e_s for o in outcomes],
        "itl": [g for o in outcomes for g in o.itl_s],
    }


def _measured(load: MeasuredLoad) -> dict[str, list[float | None]]:
    ok = load.ok
    return {
        "ttft": [r.ttft_s for r in ok],
        "tpot": [r.tpot_s for r in ok],
        "e2e": [r.e2e_s for r in ok],
        "itl": [g for r in ok for g in r.itl_s],
    }


def check_deployment(
    store_path: Path,
    endpoint: str | None,
    rates: list[float],
    *,
    requests: int,
    prompt_tokens: int,
    output_tokens: int,
    slo: dict[str, float] | None = None,
    fit_id: int | None = None,
    model: str | None = None,
    api_key: str | None = None,
    seed: int = 0,
    progress: Callable[[str], None] = lambda _: None,
    share: float = 0.9,
    search: SearchBounds | None = None,
    alone_requests: int = 3,
) -> CheckResult:
    """First send ``alone_requests`` requests one after the other and compare them with the
    model's cost for a request alone (is the machine as it was at fit time? see
    :mod:`~phaseprobe.analysis.capacity_model.alike`). Then load the server at each rate and
    compare with the fit's prediction; with ``search``
    (and an SLO), then bisect for the measured largest SLO rate (``share`` of requests meeting
    ``slo``) and set it against the predicted one. Stores the result (and every measured
    request) in ``store_path``."""
    if search is not None and not slo:
        raise ConfigError("--search-slo needs an SLO to search for (--slo ttft=S,tpot=S)")
    from phaseprobe.collect.capacity.model_fit import server_cache_limits, server_version
    from phaseprobe.collect.target import served_model

    with Store(store_path) as store:
        fit = load_fit(store, fit_id)
    result = CheckResult(fit_id=fit.analysis_id)
    with ExitStack() as stack:
        if endpoint is None:
            from phaseprobe.local import LocalVllm, ensure_model, install
            from phaseprobe.local.process import stop_with_parent

            lim = fit.limits
            given = LimitsGiven(
                max_num_seqs=lim.max_num_seqs,
                max_num_batched_tokens=lim.max_num_batched_tokens,
                chunked_prefill=lim.chunked_prefill,
                prefix_caching=lim.prefix_caching,
            )
            progress("starting the local CPU vLLM with the fit's limits (about 30 s)…")
            venv = install(progress=progress)
            ensure_model(venv=venv)
            server = stack.enter_context(LocalVllm(venv=venv, extra_args=given.launch_args()))
            stack.enter_context(stop_with_parent(server.pid))
            base_url = server.base_url
        else:
            base_url = normalize_base_url(endpoint)
        name = served_model(base_url, api_key, model)
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        result.differences = fingerprint_differences(
            fit, name, server_version(base_url, headers), server_cache_limits(base_url)
        )
        if alone_requests > 0:
            result.alone, result.alone_loads = _alone(
                fit, base_url, name, alone_requests, prompt_tokens, output_tokens,
                api_key, seed, progress,
            )  # fmt: skip
            said = result.alone.differences()
            result.differences += said
            for sentence in said:  # now, not after every load has run: it colours all of them
                progress(sentence)
        rng = fit.fitted_range
        if prompt_tokens > rng.get("max_prompt_tokens", prompt_tokens):
            result.notes.add(
                f"prompts of {prompt_tokens} tokens: beyond the fit's longest "
                f"({rng['max_prompt_tokens']}), an extrapolation"
            )
        for i, rate in enumerate(rates):
            point = LoadPoint(rate, requests, prompt_tokens, output_tokens, seed=seed + i)
            load = run_load_point(base_url, name, point, api_key=api_key, progress=progress)
            result.loads.append(load)
            failed = len(load.requests) - len(load.ok)
            result.points.append(
                compare_point(
                    rate,
                    [r.sent_s for r in load.requests],
                    _measured(load),
                    predicted_for(fit, load),
                    failed,
                    slo,
                    fit.cost.fastest_decode_s(),
                )
            )
            if load.late_s > 0.05:
                result.notes.add(
                    f"{rate:g} req/s: the client sent up to {load.late_s * 1e3:.0f} ms late "
                    "(a busy client machine): the prediction uses the actual send times"
                )
        if search is not None and slo:
            result.slo_search = _search(
                fit, result, base_url, name, search, slo, share,
                LoadPoint(1.0, requests, prompt_tokens, output_tokens, seed=seed + 1000),
                api_key, progress,
            )  # fmt: skip
    doc = result.to_dict()
    doc["requests"] = {
        f"{load.point.rate:g}": [r.to_dict() for r in load.requests] for load in result.loads
    }
    for load in result.search_loads:
        doc["requests"][f"search {load.point.rate:.6g}"] = [r.to_dict() for r in load.requests]
    doc["requests"]["alone"] = [r.to_dict() for load in result.alone_loads for r in load.requests]
    doc["workload"] = {
        "requests": requests,
        "prompt_tokens": prompt_tokens,
        "output_tokens": output_tokens,
        "slo": slo,
        "share": share,
        "seed": seed,
    }
    with Store(store_path) as store:
        result.analysis_id = store.add_analysis(CHECK_KIND, base_url, doc)
    return result


def _alone(
    fit: CapacityFit,
    base_url: str,
    model: str,
    n: int,
    prompt_tokens: int,
    output_tokens: int,
    api_key: str | None,
    seed: int,
    progress: Callable[[str], None],
) -> tuple[AloneCheck, list[MeasuredLoad]]:
    """``n`` requests, each sent when the one before has ended (truly alone, however slow the
    machine now is), measured and predicted one by one."""
    progress(f"{n} requests alone first: is the server as it was when the model was fitted?")
    measured: dict[str, list[float | None]] = {"ttft": [], "tpot": []}
    predicted: dict[str, list[float | None]] = {"ttft": [], "tpot": []}
    loads = []
    for i in range(n):
        point = LoadPoint(1.0, 1, prompt_tokens, output_tokens, seed=seed + 2000 + i)
        load = run_load_point(base_url, model, point, api_key=api_key)
        loads.append(load)
        if not load.ok:
            continue
        got, want = _measured(load), predicted_for(fit, load)
        for metric in measured:
            measured[metric] += got[metric]
            predicted[metric] += want[metric]
    return alone_check(measured, predicted, n), loads


def _load_point(
    load: MeasuredLoad, slo: dict[str, float], share: float, secs: float
) -> SearchPoint:
    """A load as a search point: a failed request counts as missing the SLO."""
    reqs = load.requests
    ttft = [r.ttft_s if r.error is None else None for r in reqs]
    met = share_meeting(ttft, [r.tpot_s for r in reqs], slo) or 0.0
    failed = len(reqs) - len(load.ok)
    return SearchPoint(load.point.rate, met, met >= share, len(reqs), failed, secs)


def _search(
    fit: CapacityFit,
    result: CheckResult,
    base_url: str,
    name: str,
    bounds: SearchBounds,
    slo: dict[str, float],
    share: float,
    like: LoadPoint,
    api_key: str | None,
    progress: Callable[[str], None],
) -> MeasuredSloRate:
    """The measured largest SLO rate by bisection over real loads like ``like`` (its rate
    replaced), beside the model's for the same workload (1,000 Poisson requests, as
    ``model predict`` gives it)."""
    spec = WorkloadSpec(
        Fixed(like.prompt_tokens), Fixed(like.output_tokens), n=1000, seed=like.seed
    )
    target = Slo(ttft_s=slo.get("ttft"), tpot_s=slo.get("tpot"), share=share)
    progress("SLO search: the model's largest SLO rate for this workload…")
    predicted = largest_rate(spec.at, fit.cost, fit.limits, target, fit.overheads).rate
    known = [replace(_load_point(load, slo, share, 0.0), from_check=True) for load in result.loads]

    def measure(rate: float) -> SearchPoint:
        t0 = time.monotonic()
        point = replace(like, rate=rate, seed=like.seed + len(result.search_loads))
        load = run_load_point(base_url, name, point, api_key=api_key, progress=progress)
        result.search_loads.append(load)
        return _load_point(load, slo, share, time.monotonic() - t0)

    return search_slo_rate(
        measure,
        known=known,
        predicted_rate=predicted,
        share=share,
        slo=slo,
        requests=like.requests,
        bounds=bounds,
        progress=progress,
    )


def check_bench(
    store_path: Path,
    bench_path: Path,
    *,
    slo: dict[str, float] | None = None,
    fit_id: int | None = None,
) -> CheckResult:
    """Set the fit's prediction against a ``vllm bench serve --save-detailed`` run: the model
    replays the run's own send times and lengths, the file's per-request timings are the
    measured side. No load is sent. Stored like a check."""
    from phaseprobe.collect.capacity.replay import read_bench_detailed

    rec = read_bench_detailed(bench_path)
    with Store(store_path) as store:
        fit = load_fit(store, fit_id)
    result = CheckResult(fit_id=fit.analysis_id)
    model = rec.info.get("model_id")
    if isinstance(model, str):
        result.differences = fingerprint_differences(fit, model, None)
    reqs = [SimRequest(t, p, o) for t, p, o in rec.trace]
    run = simulate(reqs, fit.cost, fit.limits, fit.overheads)
    sent = [t for t, _, _ in rec.trace]
    span = sent[-1] - sent[0]
    rate = (len(sent) - 1) / span if span > 0 else float("nan")
    predicted: dict[str, list[float | None]] = {
        "ttft": [o.ttft_s for o in run.outcomes],
        "tpot": [o.tpot_s for o in run.outcomes],
        "e2e": [o.e2e_s for o in run.outcomes],
        "itl": [g for o in run.outcomes for g in o.itl_s],
    }
    measured: dict[str, list[float | None]] = {
        "ttft": list(rec.ttft_s),
        "tpot": list(rec.tpot_s),
        "e2e": list(rec.e2e_s),
        "itl": list(rec.itl_s),
    }
    # failed requests are not in the trace (their lengths are unknown): said in the notes,
    # not as failures among the compared requests
    result.points.append(
        compare_point(rate, sent, measured, predicted, 0, slo, fit.cost.fastest_decode_s())
    )
    rng = fit.fitted_range
    longest = max(p for _, p, _ in rec.trace)
    if longest > rng.get("max_prompt_tokens", longest):
        result.notes.add(
            f"prompts up to {longest} tokens: beyond the fit's longest "
            f"({rng['max_prompt_tokens']}), an extrapolation"
        )
    result.notes.add(
        f"measured side: {bench_path} ({len(rec.trace)} requests"
        + (f"; {rec.failed} failed ones left out of both sides" if rec.failed else "")
        + "); vllm bench's TTFT is from its own send, as phaseprobe's"
    )
    doc = result.to_dict()
    doc["bench"] = {"path": str(bench_path), "info": rec.info, "requests": len(rec.trace)}
    doc["workload"] = {"replayed": str(bench_path), "slo": slo}
    with Store(store_path) as store:
        result.analysis_id = store.add_analysis(CHECK_KIND, f"bench: {bench_path}", doc)
    return result
