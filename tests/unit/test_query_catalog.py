"""The shipped PromQL catalog: headers, rendering, version-aware names, promtool validity."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from phaseprobe.errors import ConfigError
from phaseprobe.sources.query_catalog import (
    UNITS,
    Query,
    load_catalog,
    metric_names,
    newest_name,
    resolve_names,
    spellings,
)

ROOT = Path(__file__).resolve().parents[2]
CATALOG = load_catalog()
REQUIRED = {
    "avg_prefill_time",
    "avg_decode_time",
    "avg_queue_time",
    "avg_inference_time",
    *(f"{m}_{s}" for m in ("ttft", "itl", "e2e") for s in ("p50", "p90", "p99", "mean")),
    "decode_share",
    "prompt_token_throughput",
    "generation_token_throughput",
    "requests_running",
    "requests_waiting",
    "kv_cache_usage",
    "prefix_cache_hit_rate",
    "preemption_rate",
    "request_success_by_reason",
}
# What an old vLLM (V0 era, before the renames) exports, once with each prefix spelling.
OLD_COLON = {
    "vllm:time_per_output_token_seconds_bucket",
    "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count",
    "vllm:gpu_cache_usage_perc",
    "vllm:gpu_prefix_cache_hits_total",
    "vllm:gpu_prefix_cache_queries_total",
    "vllm:request_decode_time_seconds_sum",
    "vllm:request_decode_time_seconds_count",
}
OLD_UNDERSCORE = {n.replace("vllm:", "vllm_") for n in OLD_COLON}
RENAMED = {
    "vllm:inter_token_latency_seconds_bucket",
    "vllm:inter_token_latency_seconds_sum",
    "vllm:inter_token_latency_seconds_count",
    "vllm:kv_cache_usage_perc",
    "vllm:prefix_cache_hits_total",
    "vllm:prefix_cache_queries_total",
}


def test_required_queries_ship_with_help_and_unit():
    assert REQUIRED <= set(CATALOG), REQUIRED - set(CATALOG)
    for q in CATALOG.values():
        assert q.help and len(q.help) > 10, q.name
        assert q.unit in UNITS, (q.name, q.unit)
        assert set(re.findall(r"\$(\w+)", q.template)) <= {"selector", "window"}, q.name


def test_queries_are_package_data_in_the_wheel():
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "queries/*.promql" in data["tool"]["setuptools"]["package-data"]["phaseprobe"]
    files = sorted(p.stem for p in (ROOT / "phaseprobe" / "queries").glob("*.promql"))
    assert files == sorted(CATALOG)


def test_every_referenced_metric_is_a_newest_vllm_name():
    """Files use the newest names, and ALIASES knows each, so rewriting covers every query."""
    for q in CATALOG.values():
        assert q.metrics, q.name
        for name in q.metrics:
            assert newest_name(name) == name, (q.name, name)


@pytest.mark.parametrize(
    "selector", ["", 'model_name="m"', '{model_name="m"}', ' instance=~"a.*", model_name!="x" ']
)
def test_render_with_and_without_selector(selector):
    inner = selector.strip().strip("{}").strip()
    for q in CATALOG.values():
        expr = q.render(selector, "90s")
        assert "$" not in expr
        assert "{{" not in expr and "}}" not in expr
        for name in q.metrics:
            assert f"{name}{{{inner}}}" in expr, (q.name, expr)
        if "[" in q.template:
            assert "[90s]" in expr


def test_seed_query_renders_exactly():
    expr = CATALOG["avg_decode_time"].render('model_name="m"', "5m")
    assert " ".join(expr.split()) == (
        'sum(increase(vllm:request_decode_time_seconds_sum{model_name="m"}[5m])) / '
        'sum(increase(vllm:request_decode_time_seconds_count{model_name="m"}[5m]))'
    )


@pytest.mark.parametrize("window", ["5", "5 m", "m5", "5m;drop", "", "1.5m"])
def test_bad_window_is_a_config_error(window):
    with pytest.raises(ConfigError, match="duration"):
        CATALOG["avg_decode_time"].render("", window)


def test_dashboard_variables_are_windows():
    assert "[$__rate_interval]" in CATALOG["ttft_p99"].render(
        'model_name=~"$model"', "$__rate_interval"
    )


@pytest.mark.parametrize("present", [OLD_COLON, OLD_UNDERSCORE])
def test_old_names_are_rewritten(present):
    names = resolve_names(present | {"vllm:unrelated_total"})
    rendered = " ".join(q.render('model_name="m"', "5m", names) for q in CATALOG.values())
    for old in present:
        assert re.search(re.escape(old) + r"\{", rendered), old
    for new in RENAMED:
        assert new + "{" not in rendered, new
    # Names whose old spelling is absent keep the newest one (and return nothing).
    assert "vllm:request_prefill_time_seconds_sum{" in rendered


def test_newest_spelling_wins_when_both_exist():
    names = resolve_names({"vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"})
    assert names["vllm:kv_cache_usage_perc"] == "vllm:kv_cache_usage_perc"


def test_counters_without_total_and_family_level_keys():
    names = resolve_names({"vllm_num_preemptions"})
    assert "vllm_num_preemptions{" in CATALOG["preemption_rate"].render(names=names)
    family = {"vllm:inter_token_latency_seconds": "vllm:time_per_output_token_seconds"}
    assert "vllm:time_per_output_token_seconds_bucket{" in CATALOG["itl_p50"].render(names=family)


def test_spellings_and_newest_name():
    assert spellings("vllm:kv_cache_usage_perc")[:2] == (
        "vllm:kv_cache_usage_perc",
        "vllm_kv_cache_usage_perc",
    )
    assert "vllm:gpu_prefix_cache_hits_total" in spellings("vllm:prefix_cache_hits_total")
    assert newest_name("vllm_gpu_prefix_cache_hits") == "vllm:prefix_cache_hits_total"
    assert (
        newest_name("vllm:time_per_output_token_seconds_sum")
        == "vllm:inter_token_latency_seconds_sum"
    )
    assert newest_name("node_cpu_seconds_total") is None


def test_metric_names_skips_labels_functions_and_variables():
    expr = (
        'histogram_quantile(0.99, sum by (le, instance) (rate(vllm:a_bucket{le!="1e5", '
        'model_name=~"$model"}[$__rate_interval]))) / on(instance) group_left(job) '
        "max without (engine) (vllm_b{}) offset 5m and bool up # comment vllm:c"
    )
    assert metric_names(expr) == {"vllm:a_bucket", "vllm_b", "up"}
    assert metric_names('sum(rate(x_total{a="sum(y)"}[5m:1m])) * 1e3') == {"x_total"}


def _write(folder: Path, name: str, text: str) -> None:
    (folder / f"{name}.promql").write_text(text)


def test_user_directory_and_header_errors(tmp_path):
    _write(tmp_path, "mine", "# help: my query\n# unit: s\n# note: why\nsum(x{$selector})\n")
    (tmp_path / "README.md").write_text("not a query")
    assert load_catalog(tmp_path) == {"mine": Query("mine", "my query", "s", "sum(x{$selector})")}
    _write(tmp_path, "nounit", "# help: h\nsum(x)\n")
    with pytest.raises(ConfigError, match=r"nounit\.promql.*unit"):
        load_catalog(tmp_path)
    (tmp_path / "nounit.promql").unlink()
    _write(tmp_path, "placeholder", "# help: h\n# unit: s\nsum(x{$model})\n")
    with pytest.raises(ConfigError, match=r"placeholder\.promql.*model"):
        load_catalog(tmp_path)
    with pytest.raises(ConfigError, match="does not exist"):
        load_catalog(tmp_path / "nope")


# -- promtool: every rendered query parses as PromQL -------------------------------------------

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
needs_promtool = pytest.mark.skipif(
    not Path(PROMTOOL).exists(), reason="promtool missing (apt-get install prometheus)"
)


def _check_rules(tmp_path: Path, exprs: dict[str, str]) -> subprocess.CompletedProcess[str]:
    rules = {
        "groups": [
            {
                "name": "phaseprobe",
                "rules": [
                    {"record": f"phaseprobe:{name}", "expr": expr} for name, expr in exprs.items()
                ],
            }
        ]
    }
    path = tmp_path / "rules.yml"
    path.write_text(json.dumps(rules, indent=1))  # JSON is YAML
    return subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )


@needs_promtool
def test_every_rendered_query_passes_promtool(tmp_path):
    variants = {
        "plain": ("", "5m", None),
        "selector": ('model_name="m", instance=~"10\\\\..*"', "30s", None),
        "old": ('{model_name="m"}', "1h", resolve_names(OLD_COLON)),
        "underscore": ("", "2m", resolve_names(OLD_UNDERSCORE)),
    }
    exprs = {
        f"{q.name}:{label}": q.render(sel, win, names)
        for q in CATALOG.values()
        for label, (sel, win, names) in variants.items()
    }
    proc = _check_rules(tmp_path, exprs)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{len(exprs)} rules found" in proc.stdout


@needs_promtool
def test_promtool_check_catches_a_broken_query(tmp_path):
    """The check above is not vacuous: a broken expression fails it."""
    proc = _check_rules(tmp_path, {"broken": "sum(rate(vllm:x_total{}[5m])"})
    assert proc.returncode != 0
    assert "parse error" in (proc.stdout + proc.stderr)
