"""Noise diagnosis on synthetic arms built to have one kind of noise, and on plain noise."""

from __future__ import annotations

import json

import numpy as np
import pytest

from phaseprobe.analysis.ab.noise import diagnose_noise


def _lognormal(rng: np.random.Generator, n: int, median: float, cv: float) -> np.ndarray:
    return median * np.exp(rng.normal(0.0, cv, n))


def _runs(values) -> list[tuple[int, float]]:
    return [(i, float(v)) for i, v in enumerate(values)]


def _kinds(d) -> dict[str, list]:
    out: dict[str, list] = {}
    for f in d.findings:
        out.setdefault(f.kind, []).append(f)
    return out


def _drifting(rng: np.random.Generator, n: int = 30) -> np.ndarray:
    # 10 % log-normal noise on a +1 %/run trend: +34 % from first to last of 30 runs
    return _lognormal(rng, n, 0.085, 0.10) * np.exp(0.01 * np.arange(n))


def _two_modes(rng: np.random.Generator, n: int = 20) -> np.ndarray:
    k = round(0.6 * n)  # 60 % near 100 ms, 40 % near 125 ms, 3 % noise in each, mixed in time
    values = np.r_[_lognormal(rng, k, 0.100, 0.03), _lognormal(rng, n - k, 0.125, 0.03)]
    rng.shuffle(values)
    return values


def test_drift_is_found_with_its_slope_and_interval():
    d = diagnose_noise(
        {"eager": _runs(_drifting(np.random.default_rng(3)))},
        metric="client_tpot_s",
        label="client TPOT",
    )
    assert [f.kind for f in d.findings] == ["drift"]
    f = d.findings[0]
    ev = f.evidence
    lo, hi = ev["ci95_pct_per_run"]
    assert f.arm == "eager" and lo < 1.0 < hi and lo > 0
    assert ev["slope_pct_per_run"] == pytest.approx(1.0, abs=0.4)
    assert ev["total_pct"] > ev["scatter_pct"]  # material next to the noise around the trend
    assert f.text.startswith("arm eager drifts +") and "%/run over 30 runs (Theil–Sen" in f.text
    assert d.high and d.summary.endswith("(high): drift in eager")


def test_drift_is_found_in_most_sessions_of_30_runs():
    found = sum(
        any(
            f.kind == "drift"
            for f in diagnose_noise(
                {"A": _runs(_drifting(np.random.default_rng([7, i])))}, metric="m", label="m"
            ).findings
        )
        for i in range(40)
    )
    assert found >= 32  # ≈ 94 % measured over 300 seeds


def test_two_outliers_on_a_drift_are_named_against_the_trend():
    values = _drifting(np.random.default_rng(5))
    values[0] *= 5  # the first run after launch
    values[17] *= 5
    d = diagnose_noise({"compiled": _runs(values)}, metric="m", label="decode")
    kinds = _kinds(d)
    assert set(kinds) == {"drift", "outliers"}  # the outliers do not hide the trend
    out = kinds["outliers"][0]
    assert [r["seq"] for r in out.evidence["runs"]] == [0, 17]
    assert out.evidence["runs"][0]["first_after_launch"] and out.evidence["against"] == "trend"
    assert all(r["robust_z"] > out.evidence["z_cut"] for r in out.evidence["runs"])
    assert out.text.startswith("arm compiled: 2 outlier runs: run 1 (first after launch) ")
    assert "run 18 " in out.text and "on the trend" in out.text


def test_outliers_without_drift_are_quoted_against_the_median():
    values = _lognormal(np.random.default_rng(11), 12, 0.085, 0.05)
    values[6] = 0.412
    d = diagnose_noise({"B": _runs(values)}, metric="m", label="m")
    (f,) = d.findings
    assert f.kind == "outliers" and f.evidence["against"] == "median"
    assert "run 7 412.0 ms vs median" in f.text


def test_two_modes_are_found_with_their_medians_and_counts():
    d = diagnose_noise(
        {"eager": _runs(_two_modes(np.random.default_rng(2)))}, metric="m", label="m"
    )
    assert [f.kind for f in d.findings] == ["modes"]
    f = d.findings[0]
    low, high = f.evidence["modes"]
    assert (low["count"], high["count"]) == (12, 8)
    assert low["median_s"] == pytest.approx(0.100, rel=0.03)
    assert high["median_s"] == pytest.approx(0.125, rel=0.03)
    assert f.evidence["ashman_d"] >= f.evidence["threshold"]
    assert "level_shift_after_run" not in f.evidence  # the modes are mixed in time
    assert f.text.startswith("arm eager has two modes: 12 runs near ")
    assert "8 runs near " in f.text and "Ashman's D" in f.text


def test_two_modes_in_time_order_are_a_level_shift():
    rng = np.random.default_rng(4)
    values = np.r_[_lognormal(rng, 10, 0.100, 0.02), _lognormal(rng, 10, 0.130, 0.02)]
    modes = _kinds(diagnose_noise({"A": _runs(values)}, metric="m", label="m"))["modes"][0]
    assert modes.evidence["level_shift_after_run"] == 10
    assert "level shift after run 10" in modes.text


def test_two_slow_runs_are_outliers_not_a_second_mode():
    values = _lognormal(np.random.default_rng(8), 10, 0.1, 0.03)
    values[[0, 5]] = 0.5
    kinds = _kinds(diagnose_noise({"A": _runs(values)}, metric="m", label="m"))
    assert set(kinds) == {"outliers"} and len(kinds["outliers"][0].evidence["runs"]) == 2


# (runs per arm, noise). Share of these 200 two-arm sessions with a false finding, measured per
# kind: drift 3.5 / 2 / 2.5 %, outliers 1 / 0 / 1 %, modes 1.5 / 1 / 1 % at 20 runs and 5, 15,
# 30 % noise; at 8 runs and 15 %: drift 0.5 %, outliers 1.5 %, modes 2 %.
@pytest.mark.parametrize(("n", "cv"), [(20, 0.05), (20, 0.15), (20, 0.30), (8, 0.15)])
def test_plain_lognormal_noise_rarely_gets_a_finding(n, cv):
    seeds = 200
    counts = {"drift": 0, "outliers": 0, "modes": 0}
    for i in range(seeds):
        rng = np.random.default_rng([n, round(cv * 100), i])
        arms = {arm: _runs(_lognormal(rng, n, 0.1, cv)) for arm in ("A", "B")}
        for kind in {f.kind for f in diagnose_noise(arms, metric="m", label="m").findings}:
            counts[kind] += 1
    assert max(counts.values()) <= 0.05 * seeds, counts


def test_short_arms_give_no_drift_or_modes():
    steep = [0.1 * 1.5**i for i in range(5)]  # +50 %/run, but only 5 runs
    split = [0.1, 0.1, 0.1, 0.2, 0.2]
    d = diagnose_noise({"A": _runs(steep), "B": _runs(split)}, metric="m", label="m")
    assert not any(f.kind in ("drift", "modes") for f in d.findings)


def test_constant_values_do_not_crash():
    d = diagnose_noise(
        {"A": _runs([0.1] * 12), "B": _runs([0.2] * 3), "C": []}, metric="m", label="m"
    )
    assert d.findings == () and d.noise == {"A": 0.0, "B": 0.0, "C": None}
    assert not d.high and d.summary == "noise A 0.0 %, B 0.0 % (low)"


def test_mostly_tied_values_fall_back_to_the_mean_deviation():
    d = diagnose_noise({"A": _runs([0.1] * 9 + [0.5])}, metric="m", label="m")
    (f,) = d.findings  # MAD is 0; one run 5x the rest still stands out
    assert f.kind == "outliers" and f.evidence["runs"][0]["seq"] == 9


def test_bad_values_are_left_out():
    values = list(_lognormal(np.random.default_rng(1), 10, 0.1, 0.02))
    d = diagnose_noise(
        {"A": _runs(values + [float("nan"), 0.0, -1.0, float("inf")])}, metric="m", label="m"
    )
    assert d.findings == () and d.noise["A"] is not None and d.noise["A"] < 0.05


def test_high_noise_without_a_pattern_says_so():
    rng = np.random.default_rng(0)
    arms = {"A": _runs(_lognormal(rng, 20, 0.1, 0.2)), "B": _runs(_lognormal(rng, 20, 0.1, 0.2))}
    d = diagnose_noise(arms, metric="m", label="m")
    assert d.high and not d.findings
    assert d.summary.endswith("is spread evenly: no drift, outliers or second mode found")


def test_noise_threshold_and_units():
    values = _lognormal(np.random.default_rng(6), 12, 250e-6, 0.03)
    values[0] = 2e-3
    d = diagnose_noise(
        {"A": _runs(values)}, metric="m", label="m", high_threshold=0.10, unit_scale=1e6, unit="µs"
    )
    assert not d.high and d.summary.endswith("(low)")  # findings are kept all the same
    assert "run 1 (first after launch) 2000.0 µs vs median 2" in d.findings[0].text


def test_to_dict_is_json():
    values = _drifting(np.random.default_rng(5))
    values[0] *= 5
    arms = {"A": _runs(values), "B": _runs(_two_modes(np.random.default_rng(2), 30))}
    d = diagnose_noise(arms, metric="client_tpot_s", label="client TPOT")
    assert {f.kind for f in d.findings} == {"drift", "outliers", "modes"}
    back = json.loads(json.dumps(d.to_dict(), allow_nan=False))
    assert back["metric"] == "client_tpot_s" and back["high"] is True
    assert [f["kind"] for f in back["findings"]] == [f.kind for f in d.findings]
    assert back["summary"] == d.summary
