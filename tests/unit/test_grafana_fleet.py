"""The Grafana "Fleet (per replica)" row and its queries (issue 27, item 6).

The row's panels are catalog queries grouped by the scrape's ``instance`` label; the queries'
values are checked by ``promtool test rules`` (Prometheus's own evaluator, no server) on
synthetic series of three models behind five replicas: shares sum to 1 per model, the imbalance
is the busiest replica's rate over the least busy one's, and the percentiles are per replica.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.collect.metrics_view import load_metrics
from phaseprobe.present.grafana import build as gb
from phaseprobe.present.grafana.lint import lint_dashboard
from phaseprobe.sources.query_catalog import load_catalog

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "phaseprobe" / "dashboards" / gb.DASHBOARD_FILE
REAL_METRICS = ROOT / "tests" / "data" / "vllm_0.32.0_metrics.txt"
CATALOG = load_catalog()
PHASES = [phase for phase, _ in gb.FLEET_PHASES]
QUANTILES = [f"{phase}_p{q}_by_replica" for phase in PHASES for q in (50, 99)]
FLEET = ["request_rate_by_replica", "traffic_share_by_replica", "replica_imbalance", *QUANTILES]


@pytest.fixture(scope="module")
def fleet_panels() -> list[dict[str, Any]]:
    """The panels between the fleet row's header and the next row (or the end)."""
    panels = json.loads(SHIPPED.read_text(encoding="utf-8"))["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    start = next(i for i in rows if panels[i]["title"] == gb.FLEET_ROW)
    end = next((i for i in rows if i > start), len(panels))
    assert not panels[start]["collapsed"]
    return panels[start + 1 : end]


def test_phases_cover_the_issue():
    assert PHASES == ["queue", "prefill", "decode", "ttft", "tpot", "itl"]


def test_the_fleet_queries_ship_with_precise_help():
    for name in FLEET:
        q = CATALOG[name]
        assert q.unit in ({"s"} if name in QUANTILES else {"1/s", "fraction", "ratio"}), name
        assert "replica" in q.help, name
    for name in QUANTILES:
        q = CATALOG[name]
        assert "sum by (le, instance) (rate(" in q.template, name
        assert "[$window]" in q.template and "{$selector}" in q.template, name
        assert q.help.startswith(f"p{name.split('_p')[1][:2]} of "), name
    for name in ("request_rate_by_replica", "traffic_share_by_replica", "replica_imbalance"):
        assert "sum by (model_name, instance) (rate(" in CATALOG[name].template, name
    # The per-replica rate counts what the fleet-wide request_rate counts.
    assert CATALOG["request_rate_by_replica"].metrics == CATALOG["request_rate"].metrics


def test_the_fleet_row_shows_every_fleet_query(fleet_panels):
    used: set[str] = set()
    for panel in fleet_panels:
        assert panel["type"] == "timeseries", panel["title"]
        for target in panel["targets"]:
            name = next(
                n for n in FLEET if CATALOG[n].render(gb.SELECTOR, gb.WINDOW) == target["expr"]
            )
            assert name in panel["description"] and CATALOG[name].help in panel["description"]
            used.add(name)
            # One series per replica (or per model for the imbalance), told apart by legend.
            assert "{{instance}}" in target["legendFormat"] or name == "replica_imbalance"
    assert used == set(FLEET)
    titles = {p["title"]: p for p in fleet_panels}
    for _, title in gb.FLEET_PHASES:
        assert [t["legendFormat"] for t in titles[f"{title} per replica"]["targets"]] == [
            "{{instance}} p50",
            "{{instance}} p99",
        ]
    units = {title: p["fieldConfig"]["defaults"] for title, p in titles.items()}
    share = units["Traffic share per replica"]
    assert share["unit"] == "percentunit" and share["max"] == 1
    imbalance = units["Replica imbalance (busiest / least busy request rate)"]
    assert imbalance["unit"] == gb.IMBALANCE_UNIT and "max" not in imbalance  # 1 and above
    assert units["Requests per replica"]["unit"] == "reqps"
    assert units["Decode time per replica"]["unit"] == "s"


def test_every_fleet_metric_is_in_a_real_vllm_metrics_page():
    snapshot = load_metrics(str(REAL_METRICS))
    for name in FLEET:
        assert CATALOG[name].metrics <= set(snapshot.samples), name
    report = lint_dashboard(json.loads(SHIPPED.read_text(encoding="utf-8")), snapshot=snapshot)
    assert report.ok, (report.stale, report.missing)


# -- values, by promtool's own PromQL evaluator ------------------------------------------------

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="promtool missing (apt-get install prometheus)"
)
SELECTOR = 'model_name=~"m|n|idle"'
WINDOW = "5m"
# (model, instance, engine) → finished requests per minute, a steady rate from t=0.
RATES = {
    ("m", "r1:8000", "0"): 12,
    ("m", "r1:8000", "1"): 6,
    ("m", "r2:8000", "0"): 6,
    ("n", "r3:8000", "0"): 3,
    ("idle", "r4:8000", "0"): 6,
    ("idle", "r5:8000", "0"): 0,
    ("other", "r6:8000", "0"): 60,
}  # outside the selector: never counted
# Histogram buckets per instance: r1's observations all at or below 0.1 s, r2's in (0.5, 1].
BUCKETS = ("0.1", "0.5", "1.0", "+Inf")


def _series(name: str, labels: dict[str, str], per_min: int) -> dict[str, str]:
    text = ",".join(f'{k}="{v}"' for k, v in sorted({**labels, "job": "vllm"}.items()))
    return {"series": f"{name}{{{text}}}", "values": f"0+{per_min}x20"}


def _input_series() -> list[dict[str, str]]:
    series = [
        _series(
            "vllm:e2e_request_latency_seconds_count",
            {"model_name": m, "instance": i, "engine": e},
            n,
        )
        for (m, i, e), n in RATES.items()
    ]
    for name in QUANTILES[::2]:  # one family per phase
        (bucket,) = CATALOG[name].metrics
        for instance, first in (("r1:8000", 0), ("r2:8000", 2)):
            for k, le in enumerate(BUCKETS):
                labels = {"model_name": "m", "instance": instance, "engine": "0", "le": le}
                series.append(_series(bucket, labels, 6 if k >= first else 0))
    return series


def _round(expr: str) -> str:
    """Thousandths as integers: exact to compare, whatever the float arithmetic left."""
    return f"round(1000 * ({expr}))"


def _test(expr: str, samples: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
    return {
        "expr": _round(expr),
        "eval_time": "10m",
        "exp_samples": [
            {
                "labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}",
                "value": value,
            }
            for labels, value in samples
        ],
    }


def _render(name: str) -> str:
    return CATALOG[name].render(SELECTOR, WINDOW)


def _cases() -> list[dict[str, Any]]:
    m1, m2 = {"model_name": "m", "instance": "r1:8000"}, {"model_name": "m", "instance": "r2:8000"}
    n3 = {"model_name": "n", "instance": "r3:8000"}
    i4 = {"model_name": "idle", "instance": "r4:8000"}
    i5 = {"model_name": "idle", "instance": "r5:8000"}
    cases = [
        # r1: 18/min over two engines = 0.3/s, r2 0.1/s, r3 0.05/s, r4 0.1/s, r5 idle.
        _test(
            _render("request_rate_by_replica"), [(m1, 300), (m2, 100), (n3, 50), (i4, 100), (i5, 0)]
        ),
        _test(
            _render("traffic_share_by_replica"),
            [(m1, 750), (m2, 250), (n3, 1000), (i4, 1000), (i5, 0)],
        ),
        # Every model's replicas' shares sum to 1.
        _test(
            f"sum by (model_name) ({_render('traffic_share_by_replica')})",
            [
                ({"model_name": "m"}, 1000),
                ({"model_name": "n"}, 1000),
                ({"model_name": "idle"}, 1000),
            ],
        ),
        # 0.3 / 0.1 = 3; one replica alone is even; an idle replica makes it +Inf.
        _test(
            _render("replica_imbalance"),
            [
                ({"model_name": "m"}, 3000),
                ({"model_name": "n"}, 1000),
                ({"model_name": "idle"}, float("inf")),
            ],
        ),
        # The fleet-wide request_rate is the sum of the per-replica rates.
        _test(f"{_render('request_rate')} - sum({_render('request_rate_by_replica')})", [({}, 0)]),
    ]
    for name in QUANTILES:
        # Interpolated within the bucket: r1 in [0, 0.1], r2 in (0.5, 1].
        p = 0.5 if name.split("_p")[1].startswith("50") else 0.99
        cases.append(
            _test(
                _render(name),
                [
                    ({"instance": "r1:8000"}, round(100 * p)),
                    ({"instance": "r2:8000"}, round(500 + 500 * p)),
                ],
            )
        )
    return cases


@needs_promtool
def test_share_imbalance_and_percentiles_on_synthetic_series(tmp_path):
    (tmp_path / "rules.yml").write_text(json.dumps({"groups": []}))
    doc = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": _input_series(), "promql_expr_test": _cases()}
        ],
    }
    # JSON is YAML, except that YAML spells infinity .inf
    text = json.dumps(doc, indent=1).replace("Infinity", ".inf")
    (tmp_path / "fleet_test.yml").write_text(text)
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", "fleet_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@needs_promtool
def test_the_synthetic_check_is_not_vacuous(tmp_path):
    """A wrong expectation fails the same harness."""
    (tmp_path / "rules.yml").write_text(json.dumps({"groups": []}))
    case = _test(_render("replica_imbalance"), [({"model_name": "m"}, 2000)])
    doc = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _input_series(), "promql_expr_test": [case]}],
    }
    (tmp_path / "fleet_test.yml").write_text(json.dumps(doc, indent=1))
    proc = subprocess.run(
        [PROMTOOL, "test", "rules", "fleet_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode != 0
    assert '{model_name="m"} 3E+03' in proc.stdout + proc.stderr  # what it really is
