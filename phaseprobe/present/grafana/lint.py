"""Lint Grafana dashboards against what vLLM actually exports.

For every expression a dashboard holds (panel targets, panels nested in collapsed rows, the
pre-schema-16 ``rows[].panels`` layout, templating queries such as ``label_values(metric, l)``),
list the metrics it references, then:

- **stale**: a vLLM metric that was renamed (``vllm:gpu_prefix_cache_hits_total`` →
  ``vllm:prefix_cache_hits_total``, from :data:`~phaseprobe.sources.vllm.metrics.ALIASES` via
  the query catalog's :func:`~phaseprobe.sources.query_catalog.newest_name`) or removed with the V0
  engine (:data:`REMOVED`, with what to chart instead). Reported even when the metrics source
  still has it: the panel goes blank on the next vLLM upgrade.
- **missing**: with a metrics source (a live ``/metrics`` URL or a saved exposition text), a
  referenced series that the source does not expose. Series Prometheus makes up itself (``up``,
  ``scrape_*``, ``ALERTS``) are not expected in ``/metrics`` and are skipped. Series that only
  some deployments export (:data:`DEPLOYMENT_ONLY`: the NIXL KV connector's, the decode-side
  KV-fetch gauge) are listed apart as not exported by this source, unless the source exports
  another series of the same group: then the deployment has the feature, and a missing one is
  missing.

Names come from the catalog's :func:`~phaseprobe.sources.query_catalog.metric_names`, which already
ignores Grafana's ``$variables``, label matchers and functions.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from phaseprobe.collect.metrics_view import MetricSnapshot
from phaseprobe.collect.prom_query import metric_names, newest_name, spellings
from phaseprobe.errors import DashboardInvalid
from phaseprobe.inputs import DASHBOARD_CAP, read_input_text

__all__ = [
    "DEPLOYMENT_ONLY",
    "deployment_group",
    "REMOVED",
    "SYNTHETIC",
    "ExprRef",
    "LintReport",
    "StaleName",
    "iter_exprs",
    "lint_dashboard",
    "lint_exprs",
    "load_dashboard",
    "referenced_metrics",
]

# vLLM V0 metrics dropped with no same-kind successor (vLLM's metrics design doc lists them),
# keyed by base name (no prefix, no _total); the value says what to chart instead.
REMOVED: dict[str, str] = {
    "gpu_prefix_cache_hit_rate": "increase(vllm:prefix_cache_hits_total) / "
    "increase(vllm:prefix_cache_queries_total)",
    "cpu_prefix_cache_hit_rate": "nothing (CPU swap space is gone in V1)",
    "cpu_cache_usage_perc": "nothing (CPU swap space is gone in V1)",
    "num_requests_swapped": "nothing (swapping is gone in V1)",
    "avg_prompt_throughput_toks_per_s": "rate(vllm:prompt_tokens_total)",
    "avg_generation_throughput_toks_per_s": "rate(vllm:generation_tokens_total)",
    "time_in_queue_requests": "vllm:request_queue_time_seconds (histogram)",
    "model_forward_time_milliseconds": "vllm:request_prefill_time_seconds / "
    "vllm:request_decode_time_seconds",
    "model_execute_time_milliseconds": "vllm:request_prefill_time_seconds / "
    "vllm:request_decode_time_seconds",
}
# Series Prometheus synthesises at scrape or rule time: never in a /metrics text.
SYNTHETIC = frozenset(
    {
        "up",
        "scrape_duration_seconds",
        "scrape_samples_scraped",
        "scrape_samples_post_metric_relabeling",
        "scrape_series_added",
        "ALERTS",
        "ALERTS_FOR_STATE",
    }
)
# Series only some vLLM deployments export, keyed by base name (no prefix, no _total, no
# histogram suffix) → the group that exports them. The NIXL names and kinds are vLLM's source
# (vllm/distributed/kv_transfer/kv_connector/v1/nixl/stats.py, NixlPromMetrics: histograms
# xfer_time_seconds, post_time_seconds, bytes_transferred, num_descriptors; counters
# num_failed_transfers, num_failed_notifications, num_kv_expired_reqs), registered only when
# --kv-transfer-config names the NixlConnector; the CPU build (vLLM 0.32, tests/data) has no
# NIXL. num_requests_kv_fetch_by_stage (gauge, label stage) is absent from vLLM 0.32's page
# even with a KV connector; its defining source was not found to check here.
_NIXL = "the NIXL KV connector (--kv-transfer-config NixlConnector)"
_KV_FETCH = "vLLM after 0.32 with a KV connector, decode side"
DEPLOYMENT_ONLY: dict[str, str] = {
    **{
        name: _NIXL
        for name in (
            "nixl_xfer_time_seconds",
            "nixl_post_time_seconds",
            "nixl_bytes_transferred",
            "nixl_num_descriptors",
            "nixl_num_failed_transfers",
            "nixl_num_failed_notifications",
            "nixl_num_kv_expired_reqs",
        )
    },
    "num_requests_kv_fetch_by_stage": _KV_FETCH,
    # registered only with a speculative config (vLLM 0.32's v1/spec_decode/metrics.py)
    **{
        name: "vLLM started with --speculative-config"
        for name in (
            "spec_decode_num_drafts",
            "spec_decode_num_draft_tokens",
            "spec_decode_num_accepted_tokens",
            "spec_decode_num_accepted_tokens_per_pos",
        )
    },
    # registered only when the server was started with the flag (vLLM 0.32's loggers.py)
    **{
        name: "vLLM 0.32+ started with --kv-cache-metrics"
        for name in (
            "kv_block_lifetime_seconds",
            "kv_block_idle_before_evict_seconds",
            "kv_block_reuse_gap_seconds",
        )
    },
}
_PREFIXES = ("vllm:", "vllm_")
_SUFFIXES = ("_bucket", "_sum", "_count", "_total", "_created")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(.*?)\s*,\s*[\w.]+\s*\)\s*$", re.S)
_QUERY_RESULT = re.compile(r"^\s*query_result\((.*)\)\s*$", re.S)


@dataclass(frozen=True)
class ExprRef:
    where: str  # "panel 'Title' (id 3) target A", "variable model_name"
    expr: str


@dataclass(frozen=True)
class StaleName:
    name: str
    replacement: str  # a metric name, or for REMOVED metrics what to chart instead
    present_in_source: bool | None  # None: no metrics source given


@dataclass
class LintReport:
    file: str
    metrics: dict[str, list[str]]  # metric → where it is referenced
    stale: list[StaleName] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    hints: dict[str, str] = field(default_factory=dict)  # missing name → spelling the source has
    skipped: list[str] = field(default_factory=list)  # synthetic series not checked
    # Referenced series the source lacks because it is not that deployment: name → who exports
    # them (DEPLOYMENT_ONLY). Not a problem: the panels are blank on such a deployment.
    not_exported: dict[str, str] = field(default_factory=dict)
    source: str | None = None
    exprs: int = 0

    @property
    def ok(self) -> bool:
        return not self.stale and not self.missing

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.file,
            "source": self.source,
            "ok": self.ok,
            "exprs": self.exprs,
            "metrics": self.metrics,
            "stale": [asdict(s) for s in self.stale],
            "missing": [{"name": m, "hint": self.hints.get(m)} for m in self.missing],
            "skipped": self.skipped,
            "not_exported": [{"name": n, "exported_by": by} for n, by in self.not_exported.items()],
        }


def load_dashboard(path: str | Path) -> dict[str, Any]:
    """Read a dashboard file; a Grafana API export (``{"dashboard": {...}, "meta": ...}``) is
    unwrapped. Errors name the file."""
    p = Path(path)

    def fail(reason: str) -> DashboardInvalid:  # a FIFO, /dev/zero, a file over the cap
        return DashboardInvalid(str(p), reason)

    try:
        text = read_input_text(p, DASHBOARD_CAP, fail)
    except FileNotFoundError:
        raise DashboardInvalid(str(p), "no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DashboardInvalid(str(p), f"cannot be read ({type(exc).__name__})") from None
    try:
        data = json.loads(text)
    except RecursionError:
        raise DashboardInvalid(str(p), "input nested too deeply") from None
    except json.JSONDecodeError as exc:
        raise DashboardInvalid(
            str(p), f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from None
    if isinstance(data, dict) and isinstance(data.get("dashboard"), dict):
        data = data["dashboard"]
    if not isinstance(data, dict) or not any(k in data for k in ("panels", "rows")):
        raise DashboardInvalid(str(p), "not a Grafana dashboard (no 'panels' or 'rows')")
    return data


def _dicts(value: Any) -> list[dict[str, Any]]:
    """The dict items of a JSON list; anything else (files in the wild are odd) is none."""
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _panel_exprs(panel: Mapping[str, Any], trail: str) -> Iterator[ExprRef]:
    label = f"{trail}panel {panel.get('title', '')!r} (id {panel.get('id', '?')})"
    for target in _dicts(panel.get("targets")):
        if isinstance(target.get("expr"), str) and target["expr"]:
            yield ExprRef(f"{label} target {target.get('refId', '?')}", target["expr"])
    for child in _dicts(panel.get("panels")):  # a collapsed row keeps its panels inside
        yield from _panel_exprs(child, f"row {panel.get('title', '')!r} > ")


def iter_exprs(dashboard: Mapping[str, Any]) -> Iterator[ExprRef]:
    """Every PromQL expression in the dashboard, with where it sits."""
    for panel in _dicts(dashboard.get("panels")):
        yield from _panel_exprs(panel, "")
    for row in _dicts(dashboard.get("rows")):  # schemaVersion < 16 layout
        for panel in _dicts(row.get("panels")):
            yield from _panel_exprs(panel, f"row {row.get('title', '')!r} > ")
    templating = dashboard.get("templating")
    for var in _dicts(templating.get("list") if isinstance(templating, dict) else None):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        if isinstance(query, str) and query.strip():
            yield ExprRef(f"variable {var.get('name', '?')}", query)


def _names(expr: str) -> set[str]:
    """Metrics of one expression; Grafana's templating functions are unwrapped first."""
    m = _LABEL_VALUES.match(expr)
    if m:
        return metric_names(m.group(1))
    if re.match(r"^\s*(label_values\([^,]*\)|label_names\(|metrics\()", expr):
        return set()  # label_values(label), label_names(), metrics(regex): no metric named
    m = _QUERY_RESULT.match(expr)
    return metric_names(m.group(1) if m else expr)


def referenced_metrics(dashboard: Mapping[str, Any]) -> dict[str, list[str]]:
    """Metric name → places referencing it, sorted by name."""
    return _referenced(iter_exprs(dashboard))


def _referenced(refs: Iterable[ExprRef]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for ref in refs:
        for name in _names(ref.expr):
            found.setdefault(name, []).append(ref.where)
    return dict(sorted(found.items()))


def _base(name: str) -> str:
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            name = name[len(prefix) :]
            break
    for suffix in _SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


def deployment_group(name: str) -> str | None:
    """Who exports a sample only some deployments have (``vllm:nixl_xfer_time_seconds_sum``
    → the NIXL connector): :data:`DEPLOYMENT_ONLY` by the sample's base name; None for the
    rest."""
    return DEPLOYMENT_ONLY.get(_base(name))


def _stale(name: str, available: set[str] | None) -> StaleName | None:
    if not name.startswith(_PREFIXES):
        return None
    present = None if available is None else name in available
    # A bare histogram family (no _sum/_count/_bucket) is not a sample name the alias table
    # knows: look it up through its _count and give the replacement back without it.
    for suffix in ("", "_count"):
        newest = newest_name(name + suffix)
        if newest is None or _base(newest) == _base(name):
            continue  # unknown, or the same metric respelled (vllm_ vs vllm:), not renamed
        # Prefer the spelling the source really has (a vllm_ exporter, say).
        candidates = [s for s in spellings(newest) if _base(s) == _base(newest)]
        have = [s for s in candidates if available is not None and s in available]
        return StaleName(name, (have[0] if have else newest).removesuffix(suffix), present)
    base = _base(name)
    if base in REMOVED:
        return StaleName(name, REMOVED[base], present)
    return None


def lint_dashboard(
    dashboard: Mapping[str, Any],
    *,
    file: str = "<dashboard>",
    snapshot: MetricSnapshot | None = None,
) -> LintReport:
    """Stale names always; missing ones when a metrics snapshot is given."""
    return lint_exprs(list(iter_exprs(dashboard)), file=file, snapshot=snapshot)


def lint_exprs(
    refs: Sequence[ExprRef], *, file: str, snapshot: MetricSnapshot | None = None
) -> LintReport:
    """:func:`lint_dashboard` over expressions from anywhere (``alerts lint``'s rule files)."""
    metrics = _referenced(refs)
    available = None if snapshot is None else set(snapshot.samples)
    report = LintReport(
        file=file,
        metrics=metrics,
        exprs=len(refs),
        source=None if snapshot is None else snapshot.source,
    )
    # Deployment groups the source does export something of: their absences are real.
    present_groups = {
        DEPLOYMENT_ONLY[_base(n)] for n in available or () if _base(n) in DEPLOYMENT_ONLY
    }
    for name in metrics:
        stale = _stale(name, available)
        if stale is not None:
            report.stale.append(stale)
        if available is None or name in available:
            continue
        if name in SYNTHETIC:
            report.skipped.append(name)
            continue
        group = deployment_group(name)
        if group is not None and group not in present_groups:
            report.not_exported[name] = group
            continue
        report.missing.append(name)
        other = [s for s in spellings(name) if s in available and _base(s) == _base(name)]
        if other and stale is None:  # same metric, other spelling (vllm_ vs vllm:, _total)
            report.hints[name] = other[0]
    return report
