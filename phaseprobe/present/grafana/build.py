"""Generate the Grafana dashboard ``dashboards/vllm-phases.json`` from the query catalog.

Every panel target's ``expr`` is a catalog query (``phaseprobe/queries/*.promql``) rendered with
the dashboard's variables as selector and ``$__rate_interval`` as window, so the dashboard and
``phaseprobe query`` never disagree; a unit test regenerates the file and compares. Panel
descriptions are the queries' ``# help:`` lines, units come from their ``# unit:`` lines.

The layout puts phases first. Per-request phase time is ``increase(_sum)/increase(_count)``
(the catalog's ``avg_*_time``), not vLLM's own dashboard's ``rate(_sum)``: that one plots
seconds of phase per second of wall time, which grows with load instead of with latency.

Datasource: panels point at ``${DS_PROMETHEUS}``, which is both a datasource *variable* (so the
dashboard works as posted through the API and the datasource can be switched) and an
``__inputs`` entry (so Grafana's UI import asks for it).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from phaseprobe.collect.prom_query import Query, load_catalog
from phaseprobe.errors import ConfigError

__all__ = [
    "DASHBOARD_FILE",
    "DASHBOARD_UID",
    "FLEET_PHASES",
    "FLEET_ROW",
    "GRAFANA_UNITS",
    "PD_ROW",
    "SELF_ROW",
    "SPEC_ROW",
    "PANELS",
    "SCHEMA_VERSION",
    "SELECTOR",
    "WINDOW",
    "PanelSpec",
    "Target",
    "build_dashboard",
    "dashboard_json",
]

SCHEMA_VERSION = 39  # Grafana 10.4/11.x; newer Grafana migrates it forward on load
DASHBOARD_UID = "phaseprobe-vllm-phases"
DASHBOARD_FILE = "vllm-phases.json"
DS_VAR = "DS_PROMETHEUS"
DATASOURCE = {"type": "prometheus", "uid": "${" + DS_VAR + "}"}
# Multi-value variables expand to a regex alternation, hence =~ (and ".*" for All).
SELECTOR = 'model_name=~"$model_name",instance=~"$instance"'
WINDOW = "$__rate_interval"  # at least four scrape intervals: rate() never sees < 2 samples
_VARIABLE_METRIC = "vllm:num_requests_running"  # a gauge every vLLM version exports

# The catalog's `# unit:` vocabulary → Grafana unit ids (a new catalog unit must be added here;
# the build refuses to guess). "suffix:" is Grafana's custom-unit syntax.
GRAFANA_UNITS: dict[str, str] = {
    "s": "s",
    "ratio": "percentunit",
    "fraction": "percentunit",
    "tokens/s": "suffix: tok/s",
    "tokens": "suffix: tok",
    "requests": "short",
    "1/s": "cps",
    "bytes": "bytes",
    "bytes/s": "Bps",
    "flop/s": "flops",
}

GRID_WIDTH = 24
FLEET_ROW = "Fleet (per replica)"
SPEC_ROW = "Speculative decoding"
# Phase → panel title of the fleet row's per-replica p50/p99 panels ({phase}_p50_by_replica).
FLEET_PHASES: tuple[tuple[str, str], ...] = (
    ("queue", "Queue time"),
    ("prefill", "Prefill time"),
    ("decode", "Decode time"),
    ("ttft", "Time to first token"),
    ("tpot", "Time per output token (per request)"),
    ("itl", "Inter-token latency"),
)
PD_ROW = "Prefill/decode (KV transfer)"
SELF_ROW = "vLLM's own measurements (FLOPs, bytes, KV residency)"
IMBALANCE_UNIT = "suffix:×"  # max/min is 1 or more: the catalog's "ratio" would read as %
PanelType = Literal["timeseries", "stat"]


@dataclass(frozen=True)
class Target:
    query: str  # catalog query name
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    targets: tuple[Target, ...]
    kind: PanelType = "timeseries"
    width: int = 8
    height: int = 8
    unit: str | None = None  # Grafana unit overriding the catalog's, when the panel knows more


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[PanelSpec, ...]


def _t(query: str, legend: str) -> Target:
    return Target(query, legend)


def _stat(title: str, query: str) -> PanelSpec:
    return PanelSpec(title, (_t(query, title),), kind="stat", width=6, height=4)


PANELS: tuple[Row, ...] = (
    Row(
        "Phases per request",
        (
            _stat("Avg prefill / request", "avg_prefill_time"),
            _stat("Avg decode / request", "avg_decode_time"),
            _stat("Decode share of request time", "decode_share"),
            _stat("Avg queue / request", "avg_queue_time"),
            PanelSpec(
                "Prefill vs decode time per request",
                (_t("avg_prefill_time", "prefill"), _t("avg_decode_time", "decode")),
                width=12,
            ),
            PanelSpec(
                "Queue and inference time per request",
                (
                    _t("avg_queue_time", "queue"),
                    _t("avg_inference_time", "inference (prefill + decode)"),
                    _t("e2e_mean", "end-to-end"),
                ),
                width=12,
            ),
            PanelSpec(
                "Decode share of request time",
                (_t("decode_share", "decode share"),),
                width=24,
                height=6,
            ),
        ),
    ),
    # The fleet view of what `phaseprobe watch` shows per request from vLLM's spans: the same
    # phases, from the histograms every instance exports (bucketed, so interpolated).
    Row(
        "Phase percentiles and shares (fleet view of `phaseprobe watch`)",
        (
            PanelSpec(
                "Queue time per request",
                (_t("queue_p50", "p50"), _t("queue_p90", "p90"), _t("queue_p99", "p99")),
            ),
            PanelSpec(
                "Prefill time per request",
                (_t("prefill_p50", "p50"), _t("prefill_p90", "p90"), _t("prefill_p99", "p99")),
            ),
            PanelSpec(
                "Decode time per request",
                (_t("decode_p50", "p50"), _t("decode_p90", "p90"), _t("decode_p99", "p99")),
            ),
            PanelSpec(
                "Phase share of request time",
                (
                    _t("queue_share", "queue"),
                    _t("prefill_share", "prefill"),
                    _t("decode_share", "decode"),
                ),
                width=24,
                height=6,
            ),
        ),
    ),
    Row(
        "Latency quantiles",
        (
            PanelSpec(
                "Time to first token",
                (
                    _t("ttft_p50", "p50"),
                    _t("ttft_p90", "p90"),
                    _t("ttft_p99", "p99"),
                    _t("ttft_mean", "mean"),
                ),
            ),
            PanelSpec(
                "Inter-token latency",
                (
                    _t("itl_p50", "p50"),
                    _t("itl_p90", "p90"),
                    _t("itl_p99", "p99"),
                    _t("itl_mean", "mean"),
                ),
            ),
            PanelSpec(
                "End-to-end latency",
                (
                    _t("e2e_p50", "p50"),
                    _t("e2e_p90", "p90"),
                    _t("e2e_p99", "p99"),
                    _t("e2e_mean", "mean"),
                ),
            ),
        ),
    ),
    Row(
        "Load, queue and KV cache",
        (
            PanelSpec(
                "Running / waiting requests",
                (_t("requests_running", "running"), _t("requests_waiting", "waiting")),
            ),
            PanelSpec("KV-cache usage", (_t("kv_cache_usage", "{{instance}}"),)),
            PanelSpec("Preemptions", (_t("preemption_rate", "preemptions/s"),)),
        ),
    ),
    Row(
        "Throughput and cache",
        (
            PanelSpec(
                "Token throughput",
                (
                    _t("prompt_token_throughput", "prompt (prefill)"),
                    _t("generation_token_throughput", "generation (decode)"),
                ),
            ),
            PanelSpec(
                "Finished requests by reason",
                (_t("request_success_by_reason", "{{finished_reason}}"), _t("request_rate", "all")),
                unit="reqps",
            ),
            PanelSpec("Prefix-cache hit rate", (_t("prefix_cache_hit_rate", "hit rate"),)),
        ),
    ),
    # One series per replica. vLLM labels its series only with model_name and engine, so the
    # replica is the scrape's `instance` label: Prometheus sets it on every target, Kubernetes
    # pods included (pod IP:port), while `pod` exists only where relabeling adds it. The
    # catalog's placeholders are $selector and $window alone, so the grouping label is fixed.
    Row(
        FLEET_ROW,
        (
            PanelSpec(
                "Requests per replica",
                (_t("request_rate_by_replica", "{{instance}}"),),
                unit="reqps",
            ),
            PanelSpec(
                "Traffic share per replica",
                (_t("traffic_share_by_replica", "{{instance}} ({{model_name}})"),),
            ),
            PanelSpec(
                "Replica imbalance (busiest / least busy request rate)",
                (_t("replica_imbalance", "{{model_name}}"),),
                unit=IMBALANCE_UNIT,
            ),
            *(
                PanelSpec(
                    f"{title} per replica",
                    (
                        _t(f"{phase}_p50_by_replica", "{{instance}} p50"),
                        _t(f"{phase}_p99_by_replica", "{{instance}} p99"),
                    ),
                )
                for phase, title in FLEET_PHASES
            ),
        ),
    ),
    # Disaggregated prefill/decode (issue 28): the KV cache's hand-over from the prefill to the
    # decode instance. The nixl_* series exist only with vLLM's NIXL connector and are pooled
    # over requests (not per request); prompt tokens by source exist on every vLLM >= 0.32 and
    # tell, on the decode instances, whether the KV arrived or the prompt was recomputed. Last,
    # so the panel ids of the rows above stay as they were.
    Row(
        PD_ROW,
        (
            PanelSpec(
                "KV transfer time (NIXL)",
                (_t("kv_xfer_time_mean", "mean"), _t("kv_xfer_time_p99", "p99")),
            ),
            PanelSpec(
                "KV transfer post time (NIXL)",
                (_t("kv_post_time_mean", "mean"), _t("kv_post_time_p99", "p99")),
            ),
            PanelSpec(
                "KV transfers and failures (NIXL)",
                (
                    _t("kv_transfer_rate", "transfers/s"),
                    _t("kv_failed_transfer_rate", "failed transfers/s"),
                    _t("kv_failed_notification_rate", "failed notifications/s"),
                    _t("kv_expired_rate", "KV expired before fetch (prefill side)/s"),
                ),
            ),
            PanelSpec("KV bytes moved (NIXL)", (_t("kv_transfer_bandwidth", "bytes/s"),)),
            PanelSpec("KV bytes per transfer (NIXL)", (_t("kv_bytes_per_transfer", "mean"),)),
            PanelSpec("Decode-side KV fetches by stage", (_t("kv_fetch_by_stage", "{{stage}}"),)),
            PanelSpec(
                "Prompt tokens by source (where the KV came from)",
                (_t("prompt_tokens_by_source_share", "{{source}}"),),
            ),
            PanelSpec(
                "Recompute share per instance (read the decode instances)",
                (_t("pd_recompute_share", "{{instance}}"),),
            ),
            PanelSpec(
                "Prefix-cache hit tokens by tier",
                (_t("prompt_tokens_cached_by_source", "{{source}}"),),
            ),
        ),
    ),
    # What vLLM measures about itself (issue 32): its own FLOP and byte estimate per GPU
    # (--enable-mfu-metrics), KV block residency (--kv-cache-metrics) and why requests wait.
    # Last, so the panel ids of the rows above stay as they were.
    Row(
        SELF_ROW,
        (
            PanelSpec(
                "Achieved FLOP/s per GPU (vLLM's estimate; ÷ peak = MFU)",
                (_t("achieved_flops_per_gpu", "{{instance}}"),),
            ),
            PanelSpec(
                "Achieved memory bytes/s per GPU (vLLM's estimate; ÷ bandwidth = MBU)",
                (_t("achieved_mem_bandwidth_per_gpu", "{{instance}}"),),
            ),
            PanelSpec("KV block residency (median)", (_t("kv_block_residency", "{{what}}"),)),
            PanelSpec(
                "Requests waiting by reason", (_t("requests_waiting_by_reason", "{{reason}}"),)
            ),
        ),
    ),
    # Speculative decoding (issue 41): exported only with --speculative-config. Acceptance
    # against the break-even is phaseprobe's check (it needs step costs Prometheus has not);
    # these say whether acceptance holds or collapses. Last, so earlier panel ids stay.
    Row(
        SPEC_ROW,
        (
            PanelSpec(
                "Acceptance rate (accepted / draft tokens)", (_t("spec_acceptance_rate", "rate"),)
            ),
            PanelSpec(
                "Mean accepted length (tokens per drafted step)",
                (_t("spec_mean_accepted_length", "mean"),),
            ),
            PanelSpec(
                "Acceptance by draft position (accepted / drafts)",
                (_t("spec_acceptance_by_position", "position {{position}}"),),
            ),
        ),
    ),
)


def _query(catalog: Mapping[str, Query], name: str, where: str) -> Query:
    if name not in catalog:
        raise ConfigError(
            f"dashboard panel {where!r} needs query {name!r}, which is not in the "
            f"catalog (have: {', '.join(sorted(catalog))})"
        )
    return catalog[name]


def _unit(spec: PanelSpec, queries: Sequence[Query]) -> str:
    if spec.unit is not None:
        return spec.unit
    units = {q.unit for q in queries}
    if len(units) != 1:
        raise ConfigError(f"panel {spec.title!r} mixes units {sorted(units)}: give it one")
    unit = units.pop()
    if unit not in GRAFANA_UNITS:
        raise ConfigError(
            f"query unit {unit!r} (panel {spec.title!r}) has no Grafana unit in GRAFANA_UNITS"
        )
    return GRAFANA_UNITS[unit]


def _description(spec: PanelSpec, queries: Sequence[Query]) -> str:
    if len(queries) == 1:
        return f"{queries[0].help} (query: {queries[0].name})"
    return "\n".join(
        f"{t.legend}: {q.help} (query: {q.name})" for t, q in zip(spec.targets, queries)
    )


def _field_config(kind: PanelType, unit: str) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit, "min": 0, "color": {"mode": "palette-classic"}}
    if unit == "percentunit":
        defaults["max"] = 1
    if kind == "timeseries":
        defaults["custom"] = {
            "drawStyle": "line",
            "lineWidth": 1,
            "fillOpacity": 10,
            "showPoints": "never",
            "spanNulls": False,
        }
    else:
        defaults["color"] = {"mode": "thresholds"}
        defaults["thresholds"] = {"mode": "absolute", "steps": [{"color": "blue", "value": None}]}
    return {"defaults": defaults, "overrides": []}


def _options(kind: PanelType) -> dict[str, Any]:
    if kind == "timeseries":
        return {
            "legend": {
                "displayMode": "list",
                "placement": "bottom",
                "showLegend": True,
                "calcs": [],
            },
            "tooltip": {"mode": "multi", "sort": "none"},
        }
    return {
        "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
        "colorMode": "value",
        "graphMode": "area",
        "justifyMode": "auto",
        "orientation": "auto",
        "textMode": "auto",
    }


def _panel(
    spec: PanelSpec, catalog: Mapping[str, Query], panel_id: int, grid: dict[str, int]
) -> dict[str, Any]:
    queries = [_query(catalog, t.query, spec.title) for t in spec.targets]
    targets = [
        {
            "refId": chr(ord("A") + i),
            "datasource": dict(DATASOURCE),
            "editorMode": "code",
            "expr": q.render(selector=SELECTOR, window=WINDOW),
            # Range queries for stats too: their sparkline needs the series.
            "legendFormat": t.legend,
            "range": True,
            "instant": False,
        }
        for i, (t, q) in enumerate(zip(spec.targets, queries))
    ]
    return {
        "id": panel_id,
        "type": spec.kind,
        "title": spec.title,
        "description": _description(spec, queries),
        "datasource": dict(DATASOURCE),
        "gridPos": grid,
        "fieldConfig": _field_config(spec.kind, _unit(spec, queries)),
        "options": _options(spec.kind),
        "targets": targets,
    }


def _panels(catalog: Mapping[str, Query], rows: Sequence[Row]) -> list[dict[str, Any]]:
    panels: list[dict[str, Any]] = []
    y = 0
    panel_id = 1
    for row in rows:
        panels.append(
            {
                "id": panel_id,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": GRID_WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        panel_id += 1
        y += 1
        x, line_height = 0, 0
        for spec in row.panels:
            if x + spec.width > GRID_WIDTH:  # wrap: the next line starts below the tallest
                x, y, line_height = 0, y + line_height, 0
            grid = {"h": spec.height, "w": spec.width, "x": x, "y": y}
            panels.append(_panel(spec, catalog, panel_id, grid))
            panel_id += 1
            x += spec.width
            line_height = max(line_height, spec.height)
        y += line_height
    return panels


def _query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": dict(DATASOURCE),
        "definition": query,
        "query": {
            "query": query,
            "refId": "PrometheusVariableQueryEditor-VariableQuery",
            "qryType": 1,
        },
        "refresh": 2,
        "includeAll": True,
        "multi": True,
        "allValue": ".*",
        "current": {},
        "options": [],
        "regex": "",
        "sort": 1,
        "hide": 0,
    }


def _templating() -> dict[str, Any]:
    return {
        "list": [
            {
                "type": "datasource",
                "name": DS_VAR,
                "label": "Prometheus",
                "query": "prometheus",
                "current": {},
                "options": [],
                "regex": "",
                "refresh": 1,
                "hide": 0,
            },
            _query_variable("model_name", "Model", f"label_values({_VARIABLE_METRIC}, model_name)"),
            # Chained on the model so the instance list only shows replicas serving it.
            _query_variable(
                "instance",
                "Instance",
                f'label_values({_VARIABLE_METRIC}{{model_name=~"$model_name"}}, instance)',
            ),
        ]
    }


def build_dashboard(
    catalog: Mapping[str, Query] | None = None, rows: Sequence[Row] = PANELS
) -> dict[str, Any]:
    """The dashboard as a JSON-ready dict (deterministic: same catalog, same output)."""
    catalog = load_catalog() if catalog is None else catalog
    return {
        "__inputs": [
            {
                "name": DS_VAR,
                "label": "Prometheus",
                "description": "Prometheus scraping vLLM's /metrics",
                "type": "datasource",
                "pluginId": "prometheus",
                "pluginName": "Prometheus",
            }
        ],
        "__requires": [
            {"type": "grafana", "id": "grafana", "name": "Grafana", "version": "10.4.0"},
            {"type": "datasource", "id": "prometheus", "name": "Prometheus", "version": "1.0.0"},
        ],
        "uid": DASHBOARD_UID,
        "title": "vLLM phases (phaseprobe)",
        "description": "Where the time of a vLLM request goes: queue, prefill, decode, per "
        "request, fleet-wide and per replica, and the KV hand-over of "
        "prefill/decode deployments. Generated by `phaseprobe grafana "
        "build` from phaseprobe's query catalog.",
        "tags": ["vllm", "phaseprobe", "latency"],
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,  # shared crosshair: phases line up in time across panels
        "timezone": "browser",
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "fiscalYearStartMonth": 0,
        "liveNow": False,
        "links": [],
        "annotations": {
            "list": [
                {
                    "builtIn": 1,
                    "datasource": {"type": "grafana", "uid": "-- Grafana --"},
                    "enable": True,
                    "hide": True,
                    "iconColor": "rgba(0, 211, 255, 1)",
                    "name": "Annotations & Alerts",
                    "type": "dashboard",
                }
            ]
        },
        "templating": _templating(),
        "panels": _panels(catalog, rows),
    }


def dashboard_json(dashboard: Mapping[str, Any]) -> str:
    """The file text: stable formatting so regenerating gives byte-identical output."""
    return json.dumps(dashboard, indent=2, ensure_ascii=False) + "\n"
