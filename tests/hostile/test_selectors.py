"""Selectors are PromQL label matchers, never spliced (issue 33 item 7).

Every option that takes a selector (``query --selector``, ``probe --prom-selector``,
``check --prom-selector`` with and without ``--live``) goes through one parser
(:func:`phaseprobe.sources.query_catalog.bare_selector`) and is refused before any request when
it is not label matchers; the default selector built from the served model's name quotes the
name as a PromQL string (:func:`~phaseprobe.sources.query_catalog.promql_string`), so a model
named ``a"b`` is asked for as ``model_name="a\\"b"``. The Prometheus here is a stub that records
every query; promtool (Prometheus' own parser) checks what was sent when it is installed.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import main
from phaseprobe.sources.query_catalog import bare_selector, promql_string
from phaseprobe.testing.sse_server import Script, SseServer
from tests.hostile.cases import probe_argv
from tests.prometheus_stub import Reply, Stub

INJECTIONS = [
    'a="b"}) or vector(1) or (x{',
    '{a="b"} or vector(1) {c="d"}',
    'job="vllm"} or up{',
    "a=b",
    'a="b" c="d"',
    'a="b\nc"',  # a raw newline ends no PromQL string
    'a="b",,',
]
PROMTOOL = shutil.which("promtool")
QUICK = Script(n_tokens=3, first_delay_s=0.005, gap_s=0.001)


@pytest.fixture
def prom() -> Iterator[Stub]:
    """A Prometheus that holds vLLM's names and answers every query with no series."""
    stub = Stub()
    names = ["vllm:e2e_request_latency_seconds_count", "vllm:kv_cache_usage_perc"]
    stub.routes["/api/v1/label/__name__/values"] = lambda _: Reply(
        body={"status": "success", "data": names}
    )
    stub.routes["/api/v1/query"] = lambda _: Reply()
    yield stub
    stub.close()


def _run(argv: list[str], capsys: Any) -> tuple[int, str, str]:
    code = main(argv)
    got = capsys.readouterr()
    assert "Traceback" not in got.err
    return code, got.out, got.err


def _refused(code: int, err: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:"), err
    assert "is not PromQL label matchers" in err and "stops being one at character" in err


# -- refused before any request, on every command that takes one ------------------------------


@pytest.mark.parametrize("selector", INJECTIONS)
def test_probe_refuses_a_prom_selector_before_any_request(selector, prom, tmp_path, capsys):
    with SseServer(QUICK) as srv:
        argv = probe_argv(
            srv.base_url, tmp_path / "s.sqlite", "--prom-wait", "0.2", "--prom", prom.url
        )
        code, _, err = _run([*argv, "--prom-selector", selector], capsys)
        sent = list(srv.requests)
    _refused(code, err)
    assert sent == [] and prom.seen == []


@pytest.mark.parametrize("selector", INJECTIONS)
def test_check_live_refuses_a_prom_selector_before_the_window(selector, prom, tmp_path, capsys):
    argv = ["check", "--live", "--prom", prom.url, "--window", "1"]
    argv += ["--store", str(tmp_path / "none.sqlite"), "--prom-selector", selector]
    code, _, err = _run(argv, capsys)
    _refused(code, err)
    assert prom.seen == []


@pytest.mark.parametrize("selector", INJECTIONS)
def test_check_refuses_a_prom_selector_before_asking_prometheus(
    selector, prom, experiment_store, capsys
):
    argv = ["check", "--store", experiment_store, "--prom", prom.url, "--prom-selector", selector]
    code, _, err = _run(argv, capsys)
    _refused(code, err)
    assert prom.seen == []


def test_check_sends_the_parsed_matchers(prom, experiment_store, capsys):
    argv = ["check", "--store", experiment_store, "--prom", prom.url, "--json"]
    code, _, _ = _run([*argv, "--prom-selector", '{job="vllm", instance=~"a\\".*"}'], capsys)
    queries = [q for q in prom.queries() if "kv_cache_usage" in q]
    assert code in (0, 1) and queries, prom.queries()
    assert all('{job="vllm", instance=~"a\\".*"}' in q for q in queries), queries


# -- the default selector: the served model's name, quoted ------------------------------------


def _promtool_parses(queries: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    import json

    rules = {"groups": [{"name": "g", "rules": [{"record": "r", "expr": q} for q in queries]}]}
    path = tmp_path / "rules.yml"
    # JSON is YAML (non-ASCII kept raw: YAML refuses JSON's surrogate-pair escapes)
    path.write_text(json.dumps(rules, ensure_ascii=False), encoding="utf-8")
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, "check", "rules", str(path)], capture_output=True, text=True, timeout=30
    )


@pytest.mark.parametrize(
    ("model", "quoted"),
    [
        ('a"b', 'model_name="a\\"b"'),
        ("a\\b", 'model_name="a\\\\b"'),
        ('m"} or vector(1) or up{x="', 'model_name="m\\"} or vector(1) or up{x=\\""'),
        ("tab\there", 'model_name="tab\\there"'),
    ],
    ids=["quote", "backslash", "injection", "tab"],
)
def test_a_model_name_is_quoted_into_the_default_selector(model, quoted, prom, tmp_path, capsys):
    with SseServer(QUICK, model=model) as srv:
        argv = probe_argv(
            srv.base_url, tmp_path / "s.sqlite", "--prom-wait", "0.2", "--prom", prom.url, "--json"
        )
        code, _, err = _run(argv, capsys)
        posts = [r for r in srv.requests if r.method == "POST"]
    assert code == 0 and len(posts) == 1, err
    queries = [q for q in prom.queries() if "model_name" in q]
    assert queries and all(quoted in q for q in queries), queries
    if PROMTOOL:  # Prometheus' own parser reads every query phaseprobe sent
        checked = _promtool_parses(queries, tmp_path)
        assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize(
    "value", ["m", 'a"b', "a\\b", "x\ny", "cr\rlf", "\x00\x01\x7f", "é😀", "", "\\\"'`"]
)
def test_promql_string_round_trips_through_the_matcher_parser(value):
    matcher = f"model_name={promql_string(value)}"
    assert bare_selector(matcher) == matcher
    assert "\n" not in matcher and "\r" not in matcher


def test_promql_string_escapes_what_ends_a_string():
    assert promql_string('a"b\\c\nd') == '"a\\"b\\\\c\\nd"'
    assert promql_string("\x01") == '"\\x01"'


def test_a_lone_surrogate_is_refused_not_sent():
    with pytest.raises(ConfigError, match="lone surrogate"):
        promql_string("a\udc80b")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool missing (apt-get install prometheus)")
def test_promtool_reads_every_escape(tmp_path):
    values = ['a"b', "a\\b", "x\ny", "\x00\x01\x7f", "é😀", "\\\"'`"]
    checked = _promtool_parses([f"up{{model_name={promql_string(v)}}}" for v in values], tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    spliced = _promtool_parses(['up{model_name="a"b"}'], tmp_path)  # the check can fail
    assert spliced.returncode != 0 and "parse error" in spliced.stdout + spliced.stderr


@pytest.mark.parametrize(
    "model", ['a"b', "a\\b", "new\nline"], ids=["quote", "backslash", "newline"]
)
def test_a_quoted_model_name_is_read_back_from_metrics(model, tmp_path, capsys):
    """The served model's name comes back in ``/metrics`` labels, escaped as the exposition
    format says: the direct scrape reads it and attributes the run (server phases, isolation),
    as it does for a plain name."""
    import json

    with SseServer(QUICK, model=model, metrics=True) as srv:
        code, out, err = _run(probe_argv(srv.base_url, tmp_path / "s.sqlite", "--json"), capsys)
    assert code == 0, err
    run = json.loads(out)["runs"][0]
    assert run["status"] == "ok" and run["server"] is not None, run
