"""``grafana lint``: metrics referenced, missing from a real vLLM /metrics, stale vLLM names."""

from __future__ import annotations

import json
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phaseprobe.collect.metrics_view import load_metrics
from phaseprobe.errors import DashboardInvalid, MetricsUnavailable
from phaseprobe.present.grafana import build as gb
from phaseprobe.present.grafana.lint import (
    iter_exprs,
    lint_dashboard,
    load_dashboard,
    referenced_metrics,
)

DATA = Path(__file__).resolve().parents[1] / "data"
REAL_METRICS = DATA / "vllm_0.32.0_metrics.txt"  # captured once from the real local vLLM
SHIPPED = Path(gb.__file__).resolve().parents[2] / "dashboards" / gb.DASHBOARD_FILE

# Shaped like dashboards in the wild (production-stack's "GPU KV Cache Hit Rate", V0-era
# vLLM examples): a collapsed row hiding panels, old names, a V0-only metric, a templating query.
STALE = {
    "schemaVersion": 39,
    "title": "old vLLM",
    "panels": [
        {
            "id": 1,
            "type": "timeseries",
            "title": "KV cache",
            "targets": [
                {"refId": "A", "expr": 'avg(vllm:gpu_cache_usage_perc{model_name="$model_name"})'}
            ],
        },
        {
            "id": 2,
            "type": "row",
            "title": "Cache",
            "collapsed": True,
            "panels": [
                {
                    "id": 3,
                    "type": "stat",
                    "title": "GPU KV Cache Hit Rate",
                    "targets": [
                        {
                            "refId": "A",
                            "expr": "sum(rate(vllm:gpu_prefix_cache_hits_total[$__rate_interval]))"
                            " / sum(rate(vllm:gpu_prefix_cache_queries_total"
                            "[$__rate_interval]))",
                        }
                    ],
                }
            ],
        },
        {
            "id": 4,
            "type": "timeseries",
            "title": "TPOT",
            "targets": [
                {
                    "refId": "A",
                    "expr": "histogram_quantile(0.99, sum by(le) (rate("
                    "vllm:time_per_output_token_seconds_bucket"
                    "[$__rate_interval])))",
                },
                {"refId": "B", "expr": "vllm:avg_generation_throughput_toks_per_s"},
            ],
        },
    ],
    "templating": {
        "list": [
            {
                "type": "query",
                "name": "model_name",
                "query": {"query": "label_values(vllm:num_requests_running, model_name)"},
            }
        ]
    },
}
EXPECTED_STALE = {
    "vllm:gpu_cache_usage_perc": "vllm:kv_cache_usage_perc",
    "vllm:gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total": "vllm:prefix_cache_queries_total",
    "vllm:time_per_output_token_seconds_bucket": "vllm:inter_token_latency_seconds_bucket",
}


@pytest.fixture(scope="module")
def real():
    return load_metrics(str(REAL_METRICS))


def test_shipped_dashboard_is_clean_against_a_real_vllm_metrics_text(real):
    report = lint_dashboard(load_dashboard(SHIPPED), file=str(SHIPPED), snapshot=real)
    assert report.ok, report.to_dict()
    assert report.missing == [] and report.stale == []
    names = set(report.metrics)
    for needed in (
        "vllm:request_prefill_time_seconds_sum",
        "vllm:request_decode_time_seconds_count",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:kv_cache_usage_perc",
        "vllm:num_requests_waiting",
        "vllm:num_preemptions_total",
    ):
        assert needed in names
    # The templating query is walked too.
    assert any(w.startswith("variable ") for w in report.metrics["vllm:num_requests_running"])


def test_stale_names_are_reported_with_their_replacement(real):
    report = lint_dashboard(STALE, file="old.json", snapshot=real)
    assert not report.ok
    stale = {s.name: s.replacement for s in report.stale}
    for old, new in EXPECTED_STALE.items():
        assert stale[old] == new
        assert old in report.missing  # absent from a current vLLM too
    assert "prompt" not in stale["vllm:avg_generation_throughput_toks_per_s"]
    assert "vllm:generation_tokens_total" in stale["vllm:avg_generation_throughput_toks_per_s"]
    # Found inside the collapsed row.
    assert report.metrics["vllm:gpu_prefix_cache_hits_total"] == [
        "row 'Cache' > panel 'GPU KV Cache Hit Rate' (id 3) target A"
    ]
    assert "vllm:num_requests_running" not in report.missing


def test_stale_bare_histogram_family_and_underscore_spelling():
    dash = {
        "panels": [
            {
                "id": 1,
                "title": "t",
                "targets": [
                    {"refId": "A", "expr": "vllm:time_per_output_token_seconds"},
                    {"refId": "B", "expr": "rate(vllm_gpu_prefix_cache_hits_total[5m])"},
                    {"refId": "C", "expr": "rate(vllm_prefix_cache_hits_total[5m])"},
                ],
            }
        ]
    }
    stale = {s.name: s.replacement for s in lint_dashboard(dash).stale}
    assert stale == {
        "vllm:time_per_output_token_seconds": "vllm:inter_token_latency_seconds",
        "vllm_gpu_prefix_cache_hits_total": "vllm:prefix_cache_hits_total",
    }


def test_stale_names_are_reported_without_a_metrics_source():
    report = lint_dashboard(STALE)
    assert {s.name for s in report.stale} >= set(EXPECTED_STALE)
    assert report.missing == [] and report.source is None
    assert all(s.present_in_source is None for s in report.stale)


def test_missing_metric_gets_a_hint_when_only_the_spelling_differs(real):
    dash = {
        "panels": [
            {
                "id": 1,
                "title": "e2e",
                "targets": [
                    {"refId": "A", "expr": "rate(vllm_e2e_request_latency_seconds_sum[5m]) + up"},
                    {"refId": "B", "expr": "vllm:made_up_metric"},
                ],
            }
        ]
    }
    report = lint_dashboard(dash, snapshot=real)
    assert set(report.missing) == {"vllm_e2e_request_latency_seconds_sum", "vllm:made_up_metric"}
    assert report.hints == {
        "vllm_e2e_request_latency_seconds_sum": "vllm:e2e_request_latency_seconds_sum"
    }
    assert report.skipped == ["up"] and report.stale == []


def test_old_rows_layout_api_export_wrapper_and_template_functions(tmp_path):
    dash = {
        "rows": [
            {
                "title": "R",
                "panels": [
                    {
                        "id": 7,
                        "title": "q",
                        "targets": [{"refId": "A", "expr": "vllm:num_requests_waiting"}],
                    }
                ],
            }
        ],
        "templating": {
            "list": [
                {"type": "query", "name": "a", "query": "label_values(model_name)"},
                {
                    "type": "query",
                    "name": "b",
                    "query": "query_result(topk(3, vllm:num_requests_running))",
                },
                {"type": "custom", "name": "c", "query": "1,2,3"},
                {"type": "query", "name": "d", "query": "metrics(vllm:.*)"},
            ]
        },
    }
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"dashboard": dash, "meta": {"slug": "x"}}))
    loaded = load_dashboard(path)
    assert [r.where for r in iter_exprs(loaded)] == [
        "row 'R' > panel 'q' (id 7) target A",
        "variable a",
        "variable b",
        "variable d",
    ]
    assert set(referenced_metrics(loaded)) == {
        "vllm:num_requests_waiting",
        "vllm:num_requests_running",
    }


@pytest.mark.parametrize(
    "content, reason",
    [
        ("{not json", "not valid JSON (line 1"),
        ("[1, 2]", "not a Grafana dashboard"),
        ('{"title": "no panels"}', "not a Grafana dashboard"),
        (b"\xff\xfe\x00garbage", "cannot be read"),
    ],
)
def test_corrupt_dashboard_files_name_the_file(tmp_path, content, reason):
    path = tmp_path / "bad.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    with pytest.raises(DashboardInvalid, match=re.escape(reason)) as info:
        load_dashboard(path)
    assert str(path) in str(info.value)


def test_absent_dashboard_file(tmp_path):
    with pytest.raises(DashboardInvalid, match="no such file") as info:
        load_dashboard(tmp_path / "nope.json")
    assert "nope.json" in str(info.value)


def test_metrics_source_errors_name_the_file_or_url(tmp_path):
    with pytest.raises(MetricsUnavailable, match="nope.txt"):
        load_metrics(str(tmp_path / "nope.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    with pytest.raises(MetricsUnavailable, match="no samples"):
        load_metrics(str(empty))
    with pytest.raises(MetricsUnavailable, match="127.0.0.1:9/metrics"):
        load_metrics("http://127.0.0.1:9")


class _MetricsHandler(BaseHTTPRequestHandler):
    def do_GET(self):
        data = REAL_METRICS.read_bytes() if self.path == "/metrics" else b""
        self.send_response(200 if data else 404)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


def test_live_metrics_url_with_or_without_the_metrics_path():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _MetricsHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        base = f"http://127.0.0.1:{server.server_address[1]}"
        for url in (base, base + "/metrics", base + "/metrics/"):
            snap = load_metrics(url)
            assert snap.source == base + "/metrics"
            assert lint_dashboard(load_dashboard(SHIPPED), snapshot=snap).ok
        # a password in the URL never comes back in the report or --json (the source is
        # kept redacted from the scrape on), nor in the error when it holds a '/' (which
        # makes the URL unusable: urlsplit then sees no userinfo at all)
        port = server.server_address[1]
        snap = load_metrics(f"http://user:s3cr3t@127.0.0.1:{port}")
        report = lint_dashboard(load_dashboard(SHIPPED), snapshot=snap)
        assert "s3cr3t" not in json.dumps(report.to_dict()) and "s3cr3t" not in snap.source
        assert snap.source == f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(MetricsUnavailable) as err:
            load_metrics(f"http://user:se/cr3t@127.0.0.1:{port}")
        assert "cr3t" not in str(err.value) and f"127.0.0.1:{port}" in str(err.value)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "panels",
                    "rows",
                    "targets",
                    "expr",
                    "templating",
                    "list",
                    "query",
                    "type",
                    "title",
                    "id",
                    "refId",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(_json)
def test_arbitrary_json_only_ever_raises_the_typed_error(tmp_path_factory, doc):
    path = tmp_path_factory.mktemp("fuzz") / "d.json"
    path.write_text(json.dumps(doc))
    try:
        dash = load_dashboard(path)
    except DashboardInvalid:
        return
    lint_dashboard(dash)  # must not raise
