"""``phaseprobe alerts build | lint | runbook``: bucket choice, bad input as one error line,
lint of stale names, a runbook for every alert."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from phaseprobe.analysis.alerts import ALERT_NAMES, VLLM_032_BUCKETS, choose_bucket
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli.entry import main

METRICS = Path(__file__).parents[1] / "data" / "vllm_0.32.0_metrics.txt"


def test_a_threshold_between_buckets_is_counted_at_the_bound_below_and_named():
    choice = choose_bucket(
        "time_to_first_token_seconds", 0.3, VLLM_032_BUCKETS["time_to_first_token_seconds"]
    )
    assert (choice.used_s, choice.next_s, choice.exact) == (0.25, 0.5, False)
    assert 'le="0.25"' in choice.text and "0.5" in choice.text


def test_an_slo_finer_than_the_buckets_names_the_first_one():
    with pytest.raises(ConfigError, match=r"finer than its buckets.*le=0\.01"):
        choose_bucket(
            "inter_token_latency_seconds", 0.005, VLLM_032_BUCKETS["inter_token_latency_seconds"]
        )


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_build_json_names_the_bucket_and_what_is_left_out(capsys):
    code, out, _ = _run(["alerts", "build", "--slo", "ttft=300ms", "--json"], capsys)
    doc = json.loads(out)
    assert code == 0
    assert doc["buckets"][0]["used_s"] == 0.25
    assert {"VllmTtftSloBurn", "VllmEngineStalled"} <= set(doc["alerts"])
    assert "VllmTpotSloBurn" not in doc["alerts"]
    assert {x["what"] for x in doc["left_out"]} == {
        "span loss",
        "VllmTpotSloBurn",
        "VllmAboveModelCapacity",
    }


@pytest.mark.parametrize(
    "argv,words",
    [
        (["--slo", "tpot=1ms"], "finer than its buckets"),
        (["--slo", "ttft=fast"], "not a duration"),
        (["--slo", "e2e=1"], "not one of"),
        (["--selector", 'job="vllm"}) or vector(1'], "not PromQL label matchers"),
        (["--metrics", str(METRICS), "--selector", 'model_name="nope"'], "matches no vLLM series"),
        (["--stall-for", "10"], "at least 30 s"),
        (["--scrape-interval", "5", "--stall-for", "9"], "at least 10 s"),
        (["--capacity-rate", "0"], "positive number of requests per second"),
        (["--capacity", "--slo", "ttft=1"], "needs --workload PROMPT:OUTPUT"),
        (["--capacity", "--workload", "128:x", "--slo", "ttft=1"], "two positive token counts"),
        (["--workload", "128:64"], "--workload goes with --capacity"),
    ],
)
def test_bad_input_is_one_error_line(argv, words, capsys):
    code, _, err = _run(["alerts", "build", *argv], capsys)
    assert code == 2
    assert words in err and "Traceback" not in err


def test_a_selector_on_prometheus_labels_is_noted_not_refused(capsys):
    argv = [
        "alerts",
        "build",
        "--metrics",
        str(METRICS),
        "--selector",
        'job="vllm",model_name="tiny-llama"',
    ]
    code, _, err = _run(argv, capsys)
    assert code == 0
    assert "job" in err and "not checked" in err


def test_existing_rule_names_clash(tmp_path, capsys):
    first = tmp_path / "old.yml"
    assert main(["alerts", "build", "--out", str(first)]) == 0
    code, _, err = _run(["alerts", "build", "--existing", str(first)], capsys)
    assert code == 2 and "clash" in err and "old.yml" in err


def test_lint_reports_stale_names_and_is_clean_on_its_own_rules(tmp_path, capsys):
    own = tmp_path / "own.yml"
    assert main(["alerts", "build", "--slo", "ttft=1,tpot=0.05", "--out", str(own)]) == 0
    capsys.readouterr()
    # every name the rules read is vLLM 0.32's; the NIXL counter is only not exported by a
    # server without the connector, which is not a problem
    code, out, _ = _run(["alerts", "lint", str(own), "--metrics", str(METRICS), "--json"], capsys)
    doc = json.loads(out)
    assert code == 0, doc
    assert "vllm:nixl_num_failed_transfers_total" in {
        n["name"] for n in doc["files"][0]["not_exported"]
    }
    old = tmp_path / "old.yml"
    old.write_text(
        "groups:\n- name: g\n  rules:\n  - alert: Full\n    expr: vllm:gpu_cache_usage_perc > 0.9\n"
        "  - record: r\n    expr: rate(vllm:time_per_output_token_seconds_sum[5m])\n"
    )
    code, out, _ = _run(["alerts", "lint", str(old), "--json"], capsys)
    doc = json.loads(out)
    assert code == 1
    stale = {s["name"]: s["replacement"] for s in doc["files"][0]["stale"]}
    assert stale["vllm:gpu_cache_usage_perc"] == "vllm:kv_cache_usage_perc"
    assert stale["vllm:time_per_output_token_seconds_sum"] == "vllm:inter_token_latency_seconds_sum"


def test_lint_refuses_a_file_that_is_not_rules(tmp_path, capsys):
    bad = tmp_path / "x.yml"
    bad.write_text("a: [1, 2\n")
    code, _, err = _run(["alerts", "lint", str(bad)], capsys)
    assert code == 2 and "not valid YAML" in err


@pytest.mark.parametrize("alert", ALERT_NAMES)
def test_every_alert_has_a_runbook_with_a_command_to_run_first(alert, capsys):
    code, out, _ = _run(["alerts", "runbook", alert], capsys)
    assert code == 0
    assert out.startswith(f"# {alert}")
    assert "**Run first.**" in out and "phaseprobe" in out


def test_a_faster_scrape_allows_a_shorter_stall_and_waits_four_scrapes(capsys, tmp_path):
    out_file = tmp_path / "rules.yml"
    argv = ["alerts", "build", "--scrape-interval", "2", "--stall-for", "6", "--out", str(out_file)]
    code, _, err = _run(argv, capsys)
    assert code == 0, err
    import yaml

    rules = [r for g in yaml.safe_load(out_file.read_text())["groups"] for r in g["rules"]]
    [stalled] = [r for r in rules if r.get("alert") == "VllmEngineStalled"]
    assert stalled["for"] == "8s"
    assert "increase(vllm:estimated_flops_per_gpu_total" in stalled["expr"].replace(" ", "")
    assert "changes(vllm:kv_cache_usage_perc" in stalled["expr"].replace(" ", "")
    assert "[6s]" in stalled["expr"]


def test_capacity_takes_the_rate_from_the_stored_fit_and_names_it(capsys, tmp_path):
    from tests.unit.test_live_headroom import _store_with_fit

    store = tmp_path / "s.sqlite"
    argv = ["alerts", "build", "--capacity", "--workload", "128:32", "--store", str(store)]
    code, _, err = _run([*argv, "--slo", "ttft=0.5,tpot=0.05"], capsys)
    assert code == 2 and "no experiment store" in err  # nothing fitted yet
    _store_with_fit(store)
    code, _, err = _run(argv, capsys)
    assert code == 2 and "needs --slo" in err
    out_file = tmp_path / "rules.yml"
    code, _, err = _run([*argv, "--slo", "ttft=0.5,tpot=0.05", "--out", str(out_file)], capsys)
    assert code == 0, err
    import yaml

    rules = [r for g in yaml.safe_load(out_file.read_text())["groups"] for r in g["rules"]]
    [alert] = [r for r in rules if r.get("alert") == "VllmAboveModelCapacity"]
    rate = float(alert["expr"].rsplit(">", 1)[1])
    assert rate > 0
    # the description names where the threshold came from
    assert "capacity fit #1 for 128 → 32-token requests" in alert["annotations"]["description"]
    # the same rate as the model's own answer for that workload and SLO
    from phaseprobe.collect.capacity.alert_rate import largest_slo_rate

    expected, _ = largest_slo_rate(store, 128, 32, 0.5, 0.05)
    assert rate == pytest.approx(expected, rel=1e-5)
