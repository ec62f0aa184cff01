"""The Grafana "Prefill/decode (KV transfer)" row and its queries (issue 28, item 5).

The nixl_* series exist only with vLLM's NIXL connector, which the CPU build here cannot run:
their names and kinds are checked against vLLM's source as quoted below (NixlPromMetrics in
vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py), not against a live page, and the
lint lists them as not exported by a page without NIXL instead of missing. The queries' values
are checked by ``promtool test rules`` on synthetic series.
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
from phaseprobe.present.grafana.lint import DEPLOYMENT_ONLY, lint_dashboard
from phaseprobe.sources.query_catalog import CATALOG_ONLY, load_catalog
from phaseprobe.sources.vllm.metrics import ALIASES, parse_exposition

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "phaseprobe" / "dashboards" / gb.DASHBOARD_FILE
REAL_METRICS = ROOT / "tests" / "data" / "vllm_0.32.0_metrics.txt"
CATALOG = load_catalog()
PD = [
    "kv_xfer_time_mean",
    "kv_xfer_time_p99",
    "kv_post_time_mean",
    "kv_post_time_p99",
    "kv_transfer_rate",
    "kv_failed_transfer_rate",
    "kv_failed_notification_rate",
    "kv_expired_rate",
    "kv_transfer_bandwidth",
    "kv_bytes_per_transfer",
    "kv_fetch_by_stage",
    "prompt_tokens_by_source_share",
    "pd_recompute_share",
    "prompt_tokens_cached_by_source",
]
# vLLM's NixlPromMetrics, as its source registers them (name → kind; counters get _total).
NIXL_SOURCE = {
    "vllm:nixl_xfer_time_seconds": "histogram",
    "vllm:nixl_post_time_seconds": "histogram",
    "vllm:nixl_bytes_transferred": "histogram",
    "vllm:nixl_num_descriptors": "histogram",
    "vllm:nixl_num_failed_transfers": "counter",
    "vllm:nixl_num_failed_notifications": "counter",
    "vllm:nixl_num_kv_expired_reqs": "counter",
}


def _samples(family: str, kind: str) -> set[str]:
    if kind == "histogram":
        return {family + s for s in ("_bucket", "_sum", "_count")}
    return {family + "_total"} if kind == "counter" else {family}


@pytest.fixture(scope="module")
def pd_panels() -> list[dict[str, Any]]:
    panels = json.loads(SHIPPED.read_text(encoding="utf-8"))["panels"]
    rows = [i for i, p in enumerate(panels) if p["type"] == "row"]
    titles = [panels[i]["title"] for i in rows]
    # the row before vLLM's own measurements (issue 32), which came after it
    at = titles.index(gb.PD_ROW)
    assert titles[at + 1] == gb.SELF_ROW
    return panels[rows[at] + 1 : rows[at + 1]]


def test_the_row_is_last_so_earlier_panel_ids_keep():
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))["panels"]
    at = [row.title for row in gb.PANELS].index(gb.PD_ROW)  # then only rows appended after it
    before = gb.build_dashboard(rows=gb.PANELS[:at])["panels"]
    assert shipped[: len(before)] == before
    with_pd = gb.build_dashboard(rows=gb.PANELS[: at + 1])["panels"]
    assert shipped[: len(with_pd)] == with_pd


def test_the_row_shows_every_pd_query_with_its_help(pd_panels):
    used: list[str] = []
    for panel in pd_panels:
        assert panel["type"] == "timeseries", panel["title"]
        for target in panel["targets"]:
            name = next(
                n for n in PD if CATALOG[n].render(gb.SELECTOR, gb.WINDOW) == target["expr"]
            )
            assert CATALOG[name].help in panel["description"], name
            used.append(name)
    assert sorted(used) == sorted(PD)
    units = {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in pd_panels}
    assert units == {
        "KV transfer time (NIXL)": "s",
        "KV transfer post time (NIXL)": "s",
        "KV transfers and failures (NIXL)": "cps",
        "KV bytes moved (NIXL)": "Bps",
        "KV bytes per transfer (NIXL)": "bytes",
        "Decode-side KV fetches by stage": "short",
        "Prompt tokens by source (where the KV came from)": "percentunit",
        "Recompute share per instance (read the decode instances)": "percentunit",
        "Prefix-cache hit tokens by tier": "suffix: tok/s",
    }
    legends = {p["title"]: [t["legendFormat"] for t in p["targets"]] for p in pd_panels}
    assert legends["Recompute share per instance (read the decode instances)"] == ["{{instance}}"]
    assert legends["Prompt tokens by source (where the KV came from)"] == ["{{source}}"]


def test_queries_name_the_metrics_of_the_issue():
    metrics = set().union(*(CATALOG[n].metrics for n in PD))
    families = {
        m.removesuffix(s)
        for m in metrics
        for s in ("_bucket", "_sum", "_count", "_total")
        if m.endswith(s)
    }
    families |= {m for m in metrics if not m.endswith(("_bucket", "_sum", "_count", "_total"))}
    assert families == {
        "vllm:nixl_xfer_time_seconds",
        "vllm:nixl_post_time_seconds",
        "vllm:nixl_bytes_transferred",
        "vllm:nixl_num_failed_transfers",
        "vllm:nixl_num_failed_notifications",
        "vllm:nixl_num_kv_expired_reqs",
        "vllm:num_requests_kv_fetch_by_stage",
        "vllm:prompt_tokens_by_source",
        "vllm:prompt_tokens_cached_by_source",
    }
    # The bytes histogram is per transfer: a rate of its _sum is bytes/s, _sum/_count bytes.
    assert CATALOG["kv_transfer_bandwidth"].unit == "bytes/s"
    assert CATALOG["kv_bytes_per_transfer"].unit == "bytes"


def test_nixl_names_and_kinds_are_vllms_and_only_deployment_only_names_are_absent_here():
    kinds = {bases[0]: kind for kind, bases in CATALOG_ONLY.values()}
    for family, kind in NIXL_SOURCE.items():
        base = family.removeprefix("vllm:")
        assert DEPLOYMENT_ONLY[base].startswith("the NIXL KV connector"), base
        # Charted: all but the descriptor count (a NIXL internal, not the hand-over's cost).
        assert kinds.get(base) == (None if base == "nixl_num_descriptors" else kind), base
    nixl_used = {m for n in PD for m in CATALOG[n].metrics if m.startswith("vllm:nixl_")}
    assert nixl_used <= set().union(*(_samples(f, k) for f, k in NIXL_SOURCE.items()))
    # Against vLLM 0.32's real page: every P/D metric is there, unless it is deployment-only.
    page = set(load_metrics(str(REAL_METRICS)).samples)
    for name in PD:
        for metric in CATALOG[name].metrics - page:
            base = metric.removeprefix("vllm:")
            for suffix in ("_bucket", "_sum", "_count", "_total"):
                base = base.removesuffix(suffix)
            assert base in DEPLOYMENT_ONLY, (name, metric)
    assert "vllm:prompt_tokens_by_source_total" in page
    assert "vllm:prompt_tokens_cached_by_source_total" in page
    # One alias table: the catalog-only names are not ALIASES' too.
    aliased = {b for _, bases in ALIASES.values() for b in bases}
    assert not aliased & {b for _, bases in CATALOG_ONLY.values() for b in bases}


def test_lint_lists_connector_metrics_apart_unless_the_page_has_the_connector():
    dashboard = json.loads(SHIPPED.read_text(encoding="utf-8"))
    report = lint_dashboard(dashboard, snapshot=load_metrics(str(REAL_METRICS)))
    assert report.ok and not report.missing
    # the real page was taken without --kv-cache-metrics: its residency histograms (issue 32)
    residency = {
        f"vllm:kv_block_{h}_seconds_bucket" for h in ("lifetime", "idle_before_evict", "reuse_gap")
    }
    # nor with --speculative-config: no spec_decode counters (issue 41)
    spec = {
        f"vllm:spec_decode_num_{c}_total"
        for c in ("drafts", "draft_tokens", "accepted_tokens", "accepted_tokens_per_pos")
    }
    assert (
        set(report.not_exported)
        == {m for n in PD for m in CATALOG[n].metrics if m.startswith("vllm:nixl_")}
        | {"vllm:num_requests_kv_fetch_by_stage"}
        | residency
        | spec
    )
    assert report.to_dict()["not_exported"][0]["exported_by"]
    # A page from a NIXL deployment that lacks one of NIXL's series: that one is missing.
    text = REAL_METRICS.read_text(encoding="utf-8") + (
        "# TYPE vllm:nixl_num_failed_transfers counter\n"
        'vllm:nixl_num_failed_transfers_total{engine="0",model_name="tiny-llama"} 0.0\n'
    )
    nixl = lint_dashboard(dashboard, snapshot=parse_exposition(text, source="nixl-page"))
    assert not nixl.ok
    assert "vllm:nixl_xfer_time_seconds_bucket" in nixl.missing
    assert "vllm:nixl_num_failed_transfers_total" not in nixl.missing
    assert set(nixl.not_exported) == {"vllm:num_requests_kv_fetch_by_stage"} | residency | spec


# -- values, by promtool's own PromQL evaluator ------------------------------------------------

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="promtool missing (apt-get install prometheus)"
)
SELECTOR = 'model_name="m"'
DECODE, PREFILL = "d1:8000", "p1:8000"


def _series(name: str, labels: dict[str, str], per_min: float) -> dict[str, str]:
    text = ",".join(
        f'{k}="{v}"' for k, v in sorted({**labels, "model_name": "m", "engine": "0"}.items())
    )
    return {"series": f"{name}{{{text}}}", "values": f"0+{per_min}x20"}


def _input_series() -> list[dict[str, str]]:
    tokens = "vllm:prompt_tokens_by_source_total"
    series = [
        # The decode instance: 300 tokens/min arrive by transfer, 100 are recomputed.
        _series(tokens, {"instance": DECODE, "source": "external_kv_transfer"}, 300),
        _series(tokens, {"instance": DECODE, "source": "local_compute"}, 100),
        _series(tokens, {"instance": DECODE, "source": "local_cache_hit"}, 0),
        # The prefill instance computes all it sees.
        _series(tokens, {"instance": PREFILL, "source": "local_compute"}, 400),
        _series(tokens, {"instance": PREFILL, "source": "external_kv_transfer"}, 0),
        # Another model: never counted.
        {
            "series": f'{tokens}{{model_name="x",instance="{DECODE}",source="local_compute"}}',
            "values": "0+9000x20",
        },
        _series(
            "vllm:prompt_tokens_cached_by_source_total", {"instance": DECODE, "source": "p2p"}, 120
        ),
    ]
    # NIXL on the decode instance: 60 transfers/min, 0.6 s and 6 MiB per minute in total,
    # i.e. 10 ms and ~100 KiB per transfer; all transfer times in (5, 10] ms.
    d = {"instance": DECODE}
    series += [
        _series("vllm:nixl_xfer_time_seconds_count", d, 60),
        _series("vllm:nixl_xfer_time_seconds_sum", d, 0.6),
        _series("vllm:nixl_bytes_transferred_count", d, 60),
        _series("vllm:nixl_bytes_transferred_sum", d, 6 * 2**20),
        _series("vllm:nixl_num_failed_transfers_total", d, 6),
        _series("vllm:nixl_num_kv_expired_reqs_total", {"instance": PREFILL}, 3),
    ]
    for le, per_min in (("0.005", 0), ("0.01", 60), ("+Inf", 60)):
        series.append(_series("vllm:nixl_xfer_time_seconds_bucket", {**d, "le": le}, per_min))
    for stage, n in (("waiting_to_start", 2), ("in_progress", 1)):
        series.append(
            {
                "series": f'vllm:num_requests_kv_fetch_by_stage{{model_name="m",'
                f'instance="{DECODE}",engine="0",stage="{stage}"}}',
                "values": f"{n}x20",
            }
        )
    return series


def _test(name: str, samples: list[tuple[dict[str, str], float]]) -> dict[str, Any]:
    expr = CATALOG[name].render(SELECTOR, "5m")
    return {
        "expr": f"round(1000 * ({expr}))",
        "eval_time": "10m",
        "exp_samples": [
            {
                "labels": "{" + ",".join(f'{k}="{v}"' for k, v in sorted(labels.items())) + "}",
                "value": value,
            }
            for labels, value in samples
        ],
    }


def _cases() -> list[dict[str, Any]]:
    return [
        # local_compute / all per instance: 100 / 400 on the decode side, 1 on the prefill side.
        _test("pd_recompute_share", [({"instance": DECODE}, 250), ({"instance": PREFILL}, 1000)]),
        # Pooled: 300 of 800 transferred, 500 computed, 0 cache hits.
        _test(
            "prompt_tokens_by_source_share",
            [
                ({"source": "external_kv_transfer"}, 375),
                ({"source": "local_compute"}, 625),
                ({"source": "local_cache_hit"}, 0),
            ],
        ),
        _test("prompt_tokens_cached_by_source", [({"source": "p2p"}, 2000)]),  # 2 tok/s
        _test("kv_xfer_time_mean", [({}, 10)]),  # 10 ms
        _test("kv_xfer_time_p99", [({}, 10)]),  # 5 + 0.99 x 5 ms, rounded
        _test("kv_transfer_rate", [({}, 1000)]),
        _test("kv_transfer_bandwidth", [({}, round(1000 * 6 * 2**20 / 60))]),
        _test("kv_bytes_per_transfer", [({}, round(1000 * 6 * 2**20 / 60))]),
        _test("kv_failed_transfer_rate", [({}, 100)]),
        _test("kv_expired_rate", [({}, 50)]),
        _test(
            "kv_fetch_by_stage",
            [({"stage": "waiting_to_start"}, 2000), ({"stage": "in_progress"}, 1000)],
        ),
    ]


def _promtool(tmp_path: Path, cases: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    (tmp_path / "rules.yml").write_text(json.dumps({"groups": []}))
    doc = {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": _input_series(), "promql_expr_test": cases}],
    }
    (tmp_path / "pd_test.yml").write_text(json.dumps(doc, indent=1))
    return subprocess.run(
        [PROMTOOL, "test", "rules", "pd_test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )


@needs_promtool
def test_pd_queries_on_synthetic_series(tmp_path):
    proc = _promtool(tmp_path, _cases())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


@needs_promtool
def test_the_synthetic_check_is_not_vacuous(tmp_path):
    proc = _promtool(tmp_path, [_test("pd_recompute_share", [({"instance": DECODE}, 750)])])
    assert proc.returncode != 0
    assert f'{{instance="{DECODE}"}} 2.5E+02' in proc.stdout + proc.stderr


def test_the_speculation_row_lints_clean_against_a_real_speculating_vllm():
    # a page of the real vLLM 0.32 with n-gram speculation: every spec_decode series is there
    page = ROOT / "tests" / "data" / "vllm032_spec_ngram" / "after.txt"
    dashboard = json.loads(SHIPPED.read_text(encoding="utf-8"))
    report = lint_dashboard(dashboard, snapshot=load_metrics(str(page)))
    assert report.ok and not report.missing
    assert not [m for m in report.not_exported if "spec_decode" in m]
    titles = [p["title"] for p in dashboard["panels"]]
    at = titles.index(gb.SPEC_ROW)
    exprs = [t["expr"] for p in dashboard["panels"][at + 1 :] for t in p.get("targets", [])]
    assert len(exprs) == 3 and all("spec_decode" in e for e in exprs)
