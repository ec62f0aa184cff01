"""The generated rules under Prometheus' own rule engine: ``promtool check rules`` on the file,
and ``promtool test rules`` with input series for every alert. Each alert fires on its series
and stays silent on a healthy (and an idle) series beside it: ``exp_alerts`` must match
exactly, so an alert that fires for the healthy instance too fails as surely as one that never
fires. promtool is Debian's (the test command installs the prometheus package)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from phaseprobe.analysis.alerts import ALERT_NAMES
from phaseprobe.present.cli.entry import main

PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool not installed (apt prometheus)")

SEL = 'job="vllm"'
V = {"job": "vllm", "model_name": "m", "engine": "0"}


def _series(name: str, values: str, **labels: str) -> dict[str, str]:
    all_labels = {**V, **labels}
    inner = ", ".join(f'{k}="{v}"' for k, v in all_labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def _alert(name: str, **labels: str) -> dict[str, Any]:
    return {"exp_labels": {"alertname": name, **labels}}


@pytest.fixture(scope="module")
def rules(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("alerts") / "rules.yml"
    code = main(
        [
            "alerts",
            "build",
            "--slo",
            "ttft=1,tpot=0.05",
            "--selector",
            SEL,
            "--capacity-rate",
            "2",
            "--out",
            str(out),
        ]  # fmt: skip
    )
    assert code == 0
    return out


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_promtool_check_rules_accepts_both_formats(rules: Path, tmp_path: Path):
    done = _promtool("check", "rules", str(rules))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout
    # The PrometheusRule's spec is a rule file's content: promtool checks it as one.
    op = tmp_path / "op.yml"
    assert main(["alerts", "build", "--format", "operator", "--out", str(op)]) == 0
    doc = yaml.safe_load(op.read_text())
    assert doc["kind"] == "PrometheusRule"
    spec = tmp_path / "spec.yml"
    spec.write_text(yaml.safe_dump(doc["spec"]))
    done = _promtool("check", "rules", str(spec))
    assert done.returncode == 0, done.stdout + done.stderr


def _without_annotations(rules: Path, dest: Path) -> Path:
    """The same rules with annotations dropped: promtool compares annotations exactly, and the
    alert logic (expr, for, labels) is what these cases test. The annotations' templates are
    rendered in test_annotations_render."""
    doc = yaml.safe_load(rules.read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    dest.write_text(yaml.safe_dump(doc, sort_keys=False, width=1 << 20))
    return dest


def _cases() -> list[dict[str, Any]]:
    flat = "100x600"
    stalled = {
        "interval": "15s",
        "input_series": [
            # bad: 2 running, every counter still, KV usage and FLOPs frozen too
            _series("vllm:num_requests_running", "2x60", instance="bad"),
            _series("vllm:generation_tokens_total", flat, instance="bad"),
            _series("vllm:prompt_tokens_total", flat, instance="bad"),
            _series("vllm:iteration_tokens_total_count", flat, instance="bad"),
            _series("vllm:estimated_flops_per_gpu_total", flat, instance="bad"),
            _series("vllm:kv_cache_usage_perc", "0.25x60", instance="bad"),
            # decoding: generation tokens move
            _series("vllm:num_requests_running", "2x60", instance="good"),
            _series("vllm:generation_tokens_total", "0+50x60", instance="good"),
            _series("vllm:prompt_tokens_total", flat, instance="good"),
            _series("vllm:iteration_tokens_total_count", "0+10x60", instance="good"),
            # a long chunked prefill as vLLM 0.32 shows it: no token and no step counted
            # until the first token, but the FLOP counter moves every step...
            _series("vllm:num_requests_running", "1x60", instance="prefill"),
            _series("vllm:generation_tokens_total", flat, instance="prefill"),
            _series("vllm:prompt_tokens_total", flat, instance="prefill"),
            _series("vllm:iteration_tokens_total_count", flat, instance="prefill"),
            _series("vllm:estimated_flops_per_gpu_total", "0+1e6x60", instance="prefill"),
            # ...and without --enable-mfu-metrics, each chunk claims KV blocks
            _series("vllm:num_requests_running", "1x60", instance="prefill_kv"),
            _series("vllm:generation_tokens_total", flat, instance="prefill_kv"),
            _series("vllm:prompt_tokens_total", flat, instance="prefill_kv"),
            _series("vllm:kv_cache_usage_perc", "0+0.001x60", instance="prefill_kv"),
            # idle: nothing running
            _series("vllm:num_requests_running", "0x60", instance="idle"),
            _series("vllm:generation_tokens_total", flat, instance="idle"),
            _series("vllm:prompt_tokens_total", flat, instance="idle"),
            # stalled but outside the selector (another job): must not fire
            _series("vllm:num_requests_running", "2x60", instance="other", job="other"),
            _series("vllm:generation_tokens_total", flat, instance="other", job="other"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "5m",
                "alertname": "VllmEngineStalled",
                "exp_alerts": [
                    _alert(
                        "VllmEngineStalled",
                        severity="critical",
                        instance="bad",
                        model_name="m",
                        engine="0",
                    )
                ],
            }
        ],
    }
    queue = {
        "interval": "15s",
        "input_series": [
            _series("vllm:num_requests_waiting", "0+1x120", instance="bad"),
            _series("vllm:num_requests_running", "8x120", instance="bad"),
            _series("vllm:num_requests_waiting", "5x120", instance="steady"),
            _series("vllm:num_requests_running", "8x120", instance="steady"),
            _series("vllm:num_requests_waiting", "3x120", instance="stuck"),
            _series("vllm:num_requests_running", "0x120", instance="stuck"),
            _series("vllm:num_requests_waiting", "0x120", instance="idle"),
            _series("vllm:num_requests_running", "0x120", instance="idle"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "25m",
                "alertname": "VllmQueueGrowing",
                "exp_alerts": [
                    _alert("VllmQueueGrowing", severity="warning", instance="bad", model_name="m")
                ],
            },
            {
                "eval_time": "25m",
                "alertname": "VllmWaitingNothingRunning",
                "exp_alerts": [
                    _alert(
                        "VllmWaitingNothingRunning",
                        severity="critical",
                        instance="stuck",
                        model_name="m",
                    )
                ],
            },
        ],
    }
    kv = {
        "interval": "15s",
        "input_series": [
            _series("vllm:kv_cache_usage_perc", "0.95x120", instance="bad"),
            _series("vllm:num_preemptions_total", "0+1x120", instance="bad"),
            # a full cache without preemptions is vLLM working as designed
            _series("vllm:kv_cache_usage_perc", "0.97x120", instance="full"),
            _series("vllm:num_preemptions_total", "3x120", instance="full"),
            _series("vllm:kv_cache_usage_perc", "0.4x120", instance="good"),
            _series("vllm:num_preemptions_total", "0x120", instance="good"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "15m",
                "alertname": "VllmKvPressure",
                "exp_alerts": [
                    _alert("VllmKvPressure", severity="warning", instance="bad", model_name="m")
                ],
            }
        ],
    }
    tpot = "vllm:request_time_per_output_token_seconds"
    straggler = {
        "interval": "15s",
        "input_series": [
            *(
                s
                for inst, per_token in (("a", "0.5"), ("b", "0.5"), ("slow", "2"))
                for s in (
                    _series(f"{tpot}_count", "0+10x120", instance=inst),
                    _series(f"{tpot}_sum", f"0+{per_token}x120", instance=inst),
                )
            ),
            # two replicas of another model, 20 % apart: not a straggler at factor 1.5
            *(
                s
                for inst, per_token in (("c", "0.5"), ("d", "0.6"))
                for s in (
                    _series(f"{tpot}_count", "0+10x120", instance=inst, model_name="m2"),
                    _series(f"{tpot}_sum", f"0+{per_token}x120", instance=inst, model_name="m2"),
                )
            ),
            # one replica alone is never a straggler
            _series(f"{tpot}_count", "0+10x120", instance="e", model_name="m3"),
            _series(f"{tpot}_sum", "0+9x120", instance="e", model_name="m3"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "20m",
                "alertname": "VllmStragglerReplica",
                "exp_alerts": [
                    _alert(
                        "VllmStragglerReplica", severity="warning", instance="slow", model_name="m"
                    )
                ],
            }
        ],
        "promql_expr_test": [
            {
                # rounded: rate()'s extrapolation leaves 0.19999999999999998
                "expr": 'round(instance_model_name:vllm_tpot_seconds:mean_5m{instance="slow"}, '
                "0.001)",
                "eval_time": "20m",
                "exp_samples": [{"labels": '{instance="slow", model_name="m"}', "value": 0.2}],
            }
        ],
    }
    source = "vllm:prompt_tokens_by_source_total"
    pd = {
        "interval": "15s",
        "input_series": [
            _series(source, "0+90x240", instance="bad", source="local_compute"),
            _series(source, "0+10x240", instance="bad", source="external_kv_transfer"),
            _series(source, "0+5x240", instance="good", source="local_compute"),
            _series(source, "0+95x240", instance="good", source="external_kv_transfer"),
            # an aggregated instance computes all its prompts and receives no KV
            _series(source, "0+100x240", instance="agg", source="local_compute"),
            _series(source, "0x240", instance="agg", source="external_kv_transfer"),
            _series("vllm:nixl_num_failed_transfers_total", "0+1x240", instance="bad"),
            _series("vllm:nixl_num_failed_transfers_total", "0x240", instance="good"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "30m",
                "alertname": "VllmPdRecomputeShareHigh",
                "exp_alerts": [
                    _alert(
                        "VllmPdRecomputeShareHigh",
                        severity="warning",
                        instance="bad",
                        model_name="m",
                    )
                ],
            },
            {
                "eval_time": "30m",
                "alertname": "VllmPdKvTransferFailures",
                "exp_alerts": [
                    _alert(
                        "VllmPdKvTransferFailures",
                        severity="warning",
                        instance="bad",
                        model_name="m",
                    )
                ],
            },
        ],
    }
    # --capacity-rate 2: 3 requests/s finished (45 per 15 s scrape) is above it, 1/s is not
    capacity = {
        "interval": "15s",
        "input_series": [
            _series("vllm:request_success_total", "0+45x120", instance="busy"),
            _series("vllm:request_success_total", "0+15x120", instance="calm"),
        ],
        "alert_rule_test": [
            {
                "eval_time": "20m",
                "alertname": "VllmAboveModelCapacity",
                "exp_alerts": [
                    _alert(
                        "VllmAboveModelCapacity",
                        severity="warning",
                        instance="busy",
                        model_name="m",
                    )  # fmt: skip
                ],
            }
        ],
    }
    return [stalled, queue, kv, straggler, capacity, pd, _burn_case()]


def _burn_case() -> dict[str, Any]:
    """7 hours of traffic: model "bad" misses every SLO for half its requests (a 50x burn of a
    1 % budget), "good" meets them, "idle" has no request. vLLM writes le="1.0"; model "p3"
    has le="1", as Prometheus 3 stores it."""
    n = "x1700"  # 1700 samples at 15 s: just over 7 h
    ttft = "vllm:time_to_first_token_seconds"
    tpot = "vllm:request_time_per_output_token_seconds"
    done = "vllm:request_success_total"
    series = []
    for model, good_per_step, le in (("bad", 5, "1.0"), ("good", 10, "1.0"), ("p3", 5, "1")):
        series += [
            _series(f"{ttft}_count", f"0+10{n}", model_name=model),
            _series(f"{ttft}_bucket", f"0+{good_per_step}{n}", model_name=model, le=le),
            _series(f"{tpot}_count", f"0+10{n}", model_name=model),
            _series(f"{tpot}_bucket", f"0+{good_per_step}{n}", model_name=model, le="0.05"),
            _series(done, f"0+{10 - good_per_step}{n}", model_name=model, finished_reason="error"),
            _series(done, f"0+{good_per_step}{n}", model_name=model, finished_reason="stop"),
        ]
    series += [
        _series(f"{ttft}_count", f"0{n}", model_name="idle"),
        _series(f"{ttft}_bucket", f"0{n}", model_name="idle", le="1.0"),
        _series(done, f"0{n}", model_name="idle", finished_reason="stop"),
    ]
    tests = []
    for alert, slo, models in (
        ("VllmTtftSloBurn", "ttft", ("bad", "p3")),
        ("VllmTpotSloBurn", "tpot", ("bad", "p3")),
        ("VllmErrorSloBurn", "error", ("bad", "p3")),
    ):
        expected = [
            _alert(alert, severity=severity, slo=slo, window=window, model_name=model)
            for model in models
            for severity, window in (("critical", "1h/5m"), ("warning", "6h/30m"))
        ]
        tests.append({"eval_time": "7h", "alertname": alert, "exp_alerts": expected})
    return {
        "interval": "15s",
        "input_series": series,
        "alert_rule_test": tests,
        "promql_expr_test": [
            {
                "expr": 'round(model_name:vllm_ttft_slo_bad_ratio:rate1h{model_name="bad"}, 0.001)',
                "eval_time": "7h",
                "exp_samples": [{"labels": '{model_name="bad"}', "value": 0.5}],
            }
        ],
    }


def _run_tests(tmp_path: Path, rule_file: Path, cases: list[dict[str, Any]]) -> str:
    spec = {"rule_files": [str(rule_file)], "evaluation_interval": "30s", "tests": cases}
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_every_alert_fires_on_its_series_and_not_on_healthy_ones(rules: Path, tmp_path: Path):
    cases = _cases()
    tested = {t["alertname"] for case in cases for t in case.get("alert_rule_test", [])}
    assert tested == set(ALERT_NAMES)  # a new alert needs its case here
    _run_tests(tmp_path, _without_annotations(rules, tmp_path / "bare.yml"), cases)


def test_the_cases_fail_on_wrong_rules(rules: Path, tmp_path: Path):
    """The cases bite: the stalled alert with 'unless' turned into 'and' (fires only when the
    counters move) fails its case."""
    broken = _without_annotations(rules, tmp_path / "bare.yml")
    text = broken.read_text()
    assert ") > 0 unless on (" in text
    broken.write_text(text.replace(") > 0 unless on (", ") > 0 and on (", 1))
    spec = {"rule_files": [str(broken)], "evaluation_interval": "30s", "tests": _cases()[:1]}
    test_file = tmp_path / "test.yml"
    test_file.write_text(yaml.safe_dump(spec, sort_keys=False))
    done = _promtool("test", "rules", str(test_file))
    assert done.returncode != 0
    assert "VllmEngineStalled" in done.stdout + done.stderr


def test_annotations_render(rules: Path, tmp_path: Path):
    case = _cases()[0]
    [test] = case["alert_rule_test"]
    test["exp_alerts"][0]["exp_annotations"] = {
        "summary": "bad engine 0: requests running, no token produced for 120s",
        "description": "2 request(s) running while vLLM's token, engine-step, finished and "
        "FLOP counters and its KV usage stood still for 120s (then 60s more). /health may still "
        "answer 200: the engine core is hung (a long prefill moves the FLOP counter and KV "
        "usage).",
        "runbook_url": "playbooks/runbooks/VllmEngineStalled.md",
    }
    _run_tests(tmp_path, rules, [case])
