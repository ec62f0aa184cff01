"""The generated phase dashboard: in sync with queries/, structurally sound, phase-focused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.errors import ConfigError
from phaseprobe.present.grafana import build as gb
from phaseprobe.sources.query_catalog import UNITS, Query, load_catalog

SHIPPED = Path(gb.__file__).resolve().parents[2] / "dashboards" / gb.DASHBOARD_FILE


@pytest.fixture(scope="module")
def dashboard():
    return json.loads(SHIPPED.read_text(encoding="utf-8"))


def _leaf_panels(dash):
    for panel in dash["panels"]:
        yield panel
        yield from panel.get("panels", [])


def _targets(dash):
    for panel in _leaf_panels(dash):
        for target in panel.get("targets", []):
            yield panel, target


def test_regenerating_gives_the_shipped_file_byte_for_byte():
    # Fails when a .promql file or the layout changed without `phaseprobe grafana build
    # --out phaseprobe/dashboards/vllm-phases.json`.
    assert gb.dashboard_json(gb.build_dashboard()) == SHIPPED.read_text(encoding="utf-8")


def test_top_level_dashboard_dir_is_the_packaged_one():
    top = Path(__file__).resolve().parents[2] / "dashboards" / gb.DASHBOARD_FILE
    assert top.resolve() == SHIPPED


def test_schema_uid_and_datasource_variables(dashboard):
    assert dashboard["schemaVersion"] >= 39
    assert dashboard["uid"] == gb.DASHBOARD_UID and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["DS_PROMETHEUS"]["type"] == "datasource"
    assert variables["DS_PROMETHEUS"]["query"] == "prometheus"
    for name in ("model_name", "instance"):
        var = variables[name]
        assert var["type"] == "query" and var["multi"] and var["includeAll"]
        assert var["allValue"] == ".*"  # the selector is =~, so All must be a regex
        assert var["datasource"] == {"type": "prometheus", "uid": "${DS_PROMETHEUS}"}
        assert var["query"]["query"].startswith("label_values(vllm:num_requests_running")
        assert var["query"]["query"].endswith(f", {name})")
    assert [i["name"] for i in dashboard["__inputs"]] == ["DS_PROMETHEUS"]


def test_panel_ids_are_unique_and_the_grid_has_no_overlap(dashboard):
    panels = list(_leaf_panels(dashboard))
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in panels:
        g = p["gridPos"]
        assert set(g) == {"h", "w", "x", "y"}
        assert g["w"] > 0 and g["h"] > 0 and g["x"] >= 0 and g["y"] >= 0
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not (cells & mine), f"panel {p['title']!r} overlaps another"
        cells |= mine


def test_every_target_expr_is_a_catalog_query_with_the_dashboard_selector(dashboard):
    catalog = load_catalog()
    rendered = {q.render(selector=gb.SELECTOR, window=gb.WINDOW): q for q in catalog.values()}
    targets = list(_targets(dashboard))
    assert len(targets) > 20
    for panel, target in targets:
        assert target["expr"] in rendered, f"{panel['title']}: expr not from queries/"
        query = rendered[target["expr"]]
        assert query.name in panel["description"] and query.help in panel["description"]
        assert target["datasource"] == panel["datasource"] == gb.DATASOURCE
    refids = [
        [t["refId"] for t in p["targets"]] for p in _leaf_panels(dashboard) if p.get("targets")
    ]
    assert all(len(r) == len(set(r)) for r in refids)


def test_phase_panels_use_increase_ratios_not_rate_of_sum(dashboard):
    by_title = {p["title"]: p for p in _leaf_panels(dashboard)}
    phase = by_title["Prefill vs decode time per request"]
    exprs = [t["expr"] for t in phase["targets"]]
    assert any("request_prefill_time_seconds_sum" in e for e in exprs)
    assert any("request_decode_time_seconds_sum" in e for e in exprs)
    for expr in exprs:
        assert "increase(" in expr and "_count" in expr and "rate(" not in expr
        assert "[$__rate_interval]" in expr
        assert 'model_name=~"$model_name",instance=~"$instance"' in expr
    for title in (
        "Time to first token",
        "Inter-token latency",
        "Decode share of request time",
        "Running / waiting requests",
        "KV-cache usage",
        "Token throughput",
        "Preemptions",
        "Queue and inference time per request",
    ):
        assert title in by_title


def test_units_are_grafana_units(dashboard):
    by_title = {p["title"]: p for p in _leaf_panels(dashboard) if p["type"] != "row"}
    assert by_title["Prefill vs decode time per request"]["fieldConfig"]["defaults"]["unit"] == "s"
    assert by_title["KV-cache usage"]["fieldConfig"]["defaults"]["unit"] == "percentunit"
    assert by_title["Decode share of request time"]["fieldConfig"]["defaults"]["max"] == 1
    assert {p["type"] for p in by_title.values()} == {"timeseries", "stat"}
    # Every unit the catalog may use has a mapping, so a new query never ships unit-less.
    assert set(UNITS) <= set(gb.GRAFANA_UNITS)


def test_missing_query_or_unknown_unit_is_a_clear_error():
    catalog = load_catalog()
    del catalog["avg_decode_time"]
    with pytest.raises(ConfigError, match="avg_decode_time"):
        gb.build_dashboard(catalog)
    catalog = load_catalog()
    q = catalog["ttft_p50"]
    catalog["ttft_p50"] = Query(q.name, q.help, "furlongs", q.template)
    with pytest.raises(ConfigError, match="furlongs"):
        gb.build_dashboard(catalog)
