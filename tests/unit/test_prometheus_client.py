"""The Prometheus client layer and ``phaseprobe query`` against a stub HTTP API on 127.0.0.1."""

from __future__ import annotations

import argparse
import json
import math
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from rich.console import Console

from phaseprobe.errors import (
    ConfigError,
    EmptyResult,
    PrometheusError,
    PrometheusHTTPError,
    PrometheusUnreachable,
    PromQLError,
)
from phaseprobe.present.cli.cmd_query import cmd_query, register
from phaseprobe.present.cli.time_arg import parse_time
from phaseprobe.sources.prometheus import PHASE_QUERIES, PrometheusClient, phase_means
from phaseprobe.sources.query_catalog import load_catalog
from phaseprobe.testing.prometheus_server import PrometheusServer, scrape_config
from tests.prometheus_stub import Reply, Stub

TOKEN = "s3cret-token-value"
PARSE_ERROR = 'invalid parameter "query": 1:5: parse error: unclosed left parenthesis'


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.close()


def _vector(*items: tuple[dict[str, str], str], t: float = 1700000000.5) -> Reply:
    return Reply(
        body={
            "status": "success",
            "data": {
                "resultType": "vector",
                "result": [{"metric": labels, "value": [t, value]} for labels, value in items],
            },
        }
    )


def _names(*names: str) -> Callable[[dict[str, list[str]]], Reply]:
    return lambda params: Reply(body={"status": "success", "data": list(names)})


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _client(url: str, **kw: Any) -> PrometheusClient:
    kw.setdefault("environ", {})
    kw.setdefault("retries", 0)
    return PrometheusClient(url, **kw)


# -- errors ------------------------------------------------------------------------------------


def test_closed_port_is_unreachable_and_quick():
    url = f"http://127.0.0.1:{_closed_port()}"
    started = time.monotonic()
    with pytest.raises(PrometheusUnreachable) as info:
        PrometheusClient(url, environ={}).instant_query("up")
    assert time.monotonic() - started < 5
    assert url in str(info.value) and "Connection refused" in str(info.value)
    assert info.value.url == url


def test_bad_promql_quotes_the_server(stub):
    stub.routes["/api/v1/query"] = lambda p: Reply(
        400, {"status": "error", "errorType": "bad_data", "error": PARSE_ERROR}
    )
    with pytest.raises(PromQLError) as info:
        _client(stub.url).instant_query("sum(up")
    assert info.value.server_message == PARSE_ERROR
    assert PARSE_ERROR in str(info.value) and stub.url in str(info.value)
    assert info.value.expr == "sum(up"
    with pytest.raises(PromQLError) as info:  # a multi-line catalog query: still one line
        _client(stub.url).instant_query("sum(a)\n  /\nsum(up")
    assert "\n" not in str(info.value) and "sum(a) / sum(up" in str(info.value)


def test_execution_error_is_a_promql_error(stub):
    stub.routes["/api/v1/query"] = lambda p: Reply(
        422,
        {
            "status": "error",
            "errorType": "execution",
            "error": "found duplicate series for the match group",
        },
    )
    with pytest.raises(PromQLError, match="duplicate series"):
        _client(stub.url).instant_query("a / on() b")


def test_empty_result_shows_the_selector(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names()
    stub.routes["/api/v1/query"] = lambda p: _vector()
    client = _client(stub.url)
    query = load_catalog()["avg_decode_time"]
    with pytest.raises(EmptyResult) as info:
        client.run(query, selector='{model_name="nope"}')
    assert 'model_name="nope"' in str(info.value) and stub.url in str(info.value)
    assert info.value.query == "avg_decode_time"
    assert client.run(query, selector='model_name="nope"', allow_empty=True).empty
    with pytest.raises(EmptyResult, match="no selector"):
        client.run(query)


def test_token_from_env_is_sent_and_never_shown(stub):
    stub.routes["/api/v1/query"] = lambda p: Reply(
        401, {"status": "error", "error": "unauthorized"}
    )
    client = _client(stub.url, environ={"PHASEPROBE_PROM_TOKEN": TOKEN})
    with pytest.raises(PrometheusHTTPError) as info:
        client.instant_query("up")
    assert stub.seen[-1].headers["Authorization"] == f"Bearer {TOKEN}"
    assert info.value.status == 401
    assert "PHASEPROBE_PROM_TOKEN" in str(info.value) and "refused" in str(info.value)
    assert TOKEN not in str(info.value) and TOKEN not in repr(client)


def test_token_env_name_is_overridable_and_missing_token_is_hinted(stub):
    stub.routes["/api/v1/query"] = lambda p: _vector(({}, "1"))
    _client(stub.url, token_env="MY_PROM", environ={"MY_PROM": "t2"}).instant_query("up")
    assert stub.seen[-1].headers["Authorization"] == "Bearer t2"
    _client(stub.url, environ={}).instant_query("up")
    assert "Authorization" not in stub.seen[-1].headers
    stub.routes["/api/v1/query"] = lambda p: Reply(403, "forbidden", "text/plain")
    with pytest.raises(PrometheusHTTPError, match=r"set \$PHASEPROBE_PROM_TOKEN"):
        _client(stub.url).instant_query("up")


def test_credentials_in_the_url_are_not_shown():
    url = f"http://user:pw@127.0.0.1:{_closed_port()}"
    with pytest.raises(PrometheusUnreachable) as info:
        _client(url).instant_query("up")
    assert "pw" not in str(info.value) and "127.0.0.1" in str(info.value)


def test_not_a_prometheus(stub):
    stub.routes["/api/v1/query"] = lambda p: Reply(200, "<html>login</html>", "text/html")
    with pytest.raises(PrometheusUnreachable, match="Prometheus API JSON"):
        _client(stub.url).instant_query("up")
    stub.routes.clear()  # vLLM's URL given by mistake: no /api/v1
    with pytest.raises(PrometheusUnreachable, match="404"):
        _client(stub.url).instant_query("up")


def test_server_error_after_a_retry(stub):
    stub.routes["/api/v1/query"] = lambda p: Reply(
        503, {"status": "error", "errorType": "unavailable", "error": "query queue full"}
    )
    with pytest.raises(PrometheusHTTPError, match="HTTP 503: query queue full"):
        _client(stub.url, retries=1).instant_query("up")
    assert len(stub.seen) == 2


def test_tls_failure_is_unreachable(stub):
    """https:// to a plain-HTTP server: the handshake fails; said so, URL named."""
    url = stub.url.replace("http://", "https://")
    with pytest.raises(PrometheusUnreachable, match="TLS") as info:
        _client(url).instant_query("up")
    assert url in str(info.value)


def test_tls_verify_option_reaches_the_session(tmp_path):
    assert _client("https://x", verify=False)._session.verify is False
    assert _client("https://x", verify=str(tmp_path / "ca.pem"))._session.verify == str(
        tmp_path / "ca.pem"
    )
    assert _client("https://x")._session.verify is True


def test_every_error_is_a_prometheus_error():
    for cls in (PrometheusUnreachable, PrometheusHTTPError, PromQLError, EmptyResult):
        assert issubclass(cls, PrometheusError)


# -- results and version detection --------------------------------------------------------------


def test_vector_scalar_and_nan(stub):
    stub.routes["/api/v1/query"] = lambda p: _vector(
        ({"model_name": "m"}, "0.25"), ({"model_name": "n"}, "NaN")
    )
    samples = _client(stub.url).instant_query("x", at=1700000000.123)
    assert stub.seen[-1].params["time"] == ["1700000000.123"]
    assert samples[0].labels == {"model_name": "m"} and samples[0].value == 0.25
    assert math.isnan(samples[1].value) and samples[1].to_dict()["value"] is None
    stub.routes["/api/v1/query"] = lambda p: Reply(
        body={"status": "success", "data": {"resultType": "scalar", "result": [1700000000, "+Inf"]}}
    )
    (scalar,) = _client(stub.url).instant_query("1/0")
    assert scalar.labels == {} and scalar.to_dict()["value"] == "+Inf"


def test_range_query_keeps_milliseconds(stub):
    stub.routes["/api/v1/query_range"] = lambda p: Reply(
        body={
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [
                    {"metric": {"a": "b"}, "values": [[1700000000, "1"], [1700000001, "2"]]}
                ],
            },
        }
    )
    (series,) = _client(stub.url).range_query("x", 1700000000.25, 1700000010.75, "1s")
    params = stub.seen[-1].params
    assert params["start"] == ["1700000000.250"] and params["end"] == ["1700000010.750"]
    assert params["step"] == ["1s"]
    assert series.points == ((1700000000.0, 1.0), (1700000001.0, 2.0))


def test_old_vllm_names_are_detected_and_used(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names(
        "vllm:time_per_output_token_seconds_bucket",
        "vllm:time_per_output_token_seconds_sum",
        "vllm:time_per_output_token_seconds_count",
        "vllm:gpu_cache_usage_perc",
    )
    stub.routes["/api/v1/query"] = lambda p: _vector(({}, "0.02"))
    client = _client(stub.url)
    result = client.run(load_catalog()["itl_p90"], selector='model_name="m"', window="1m")
    sent = stub.seen[-1].params["query"][0]
    assert 'vllm:time_per_output_token_seconds_bucket{model_name="m"}[1m]' in sent
    assert result.expr == sent and result.samples[0].value == 0.02
    names_call = next(s for s in stub.seen if s.path.startswith("/api/v1/label"))
    assert names_call.params["match[]"] == ['{__name__=~"vllm[:_].+"}']
    client.run(load_catalog()["kv_cache_usage"])
    assert "vllm:gpu_cache_usage_perc{}" in stub.seen[-1].params["query"][0]
    # detected once per client
    assert sum(s.path.startswith("/api/v1/label") for s in stub.seen) == 1


def test_phase_means_fits_the_window_to_the_baseline_scrape(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names("vllm_e2e_request_latency_seconds_count")

    def answer(params: dict[str, list[str]]) -> Reply:
        q = params["query"][0]
        if q.startswith("max(timestamp("):
            return _vector(({}, "1000.25"))
        return _vector(({}, "NaN" if "queue" in q else "0.5"))

    stub.routes["/api/v1/query"] = answer
    means = phase_means(
        _client(stub.url), first_sent=1000.9, end=1010.0, selector='{model_name="m"}'
    )
    baseline = next(s for s in stub.seen if s.params.get("query", [""])[0].startswith("max("))
    assert baseline.params["query"] == [
        'max(timestamp(vllm_e2e_request_latency_seconds_count{model_name="m"}))'
    ]
    assert baseline.params["time"] == ["1000.900"]
    sent = [s.params["query"][0] for s in stub.seen if "increase" in s.params.get("query", [""])[0]]
    assert all("[9751ms]" in q and 'model_name="m"' in q for q in sent)
    assert set(means) == set(PHASE_QUERIES)
    assert means["avg_queue_time"] is None and means["avg_decode_time"] == 0.5
    stub.routes["/api/v1/query"] = lambda p: _vector()
    with pytest.raises(EmptyResult, match="before the experiment"):
        phase_means(_client(stub.url), first_sent=1.0, end=2.0)


# -- the CLI command -----------------------------------------------------------------------------


def _run_cli(argv: list[str]) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="phaseprobe")
    register(parser.add_subparsers(dest="command"))
    out, err = Console(record=True, width=200), Console(record=True, width=200, stderr=True)
    code = cmd_query(parser.parse_args(["query", *argv]), out, err)
    return code, out.export_text(), err.export_text()


def test_cli_list():
    code, text, _ = _run_cli(["--list", "--json"])
    doc = json.loads(text)
    assert code == 0
    assert {q["name"] for q in doc["queries"]} == set(load_catalog())
    code, text, _ = _run_cli(["--list"])
    assert "avg_decode_time" in text and "tokens/s" in text


def test_cli_json_instant_and_partial_empty(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names("vllm:request_decode_time_seconds_sum")

    def answer(params: dict[str, list[str]]) -> Reply:
        q = params["query"][0]
        return _vector(({}, "0.178")) if "decode" in q else _vector()

    stub.routes["/api/v1/query"] = answer
    code, text, _ = _run_cli(
        [
            "avg_decode_time",
            "avg_prefill_time",
            "--prom",
            stub.url,
            "--selector",
            '{model_name="m"}',
            "--json",
        ]
    )
    doc = json.loads(text)
    assert code == 1  # one of the two had no data
    decode, prefill = doc["queries"]
    assert decode["result"][0]["value"] == 0.178 and decode["unit"] == "s"
    assert 'model_name="m"' in decode["expr"]
    assert prefill["result"] == [] and 'model_name="m"' in prefill["error"]
    code, text, err = _run_cli(["avg_decode_time", "avg_prefill_time", "--prom", stub.url])
    assert "178.00 ms" in text and "no data" in err


def test_cli_text_keeps_brackets_of_regex_selectors(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names()
    stub.routes["/api/v1/query"] = lambda p: _vector(({"instance": "[a-z]"}, "1"))
    code, text, _ = _run_cli(
        ["requests_running", "--prom", stub.url, "--selector", 'instance=~"[a-z]+"', "--show-expr"]
    )
    assert code == 0
    assert 'instance=~"[a-z]+"' in text and "instance=[a-z]" in text


def test_cli_single_empty_query_is_an_error(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names()
    stub.routes["/api/v1/query"] = lambda p: _vector()
    with pytest.raises(EmptyResult):
        _run_cli(["ttft_p99", "--prom", stub.url])


def test_cli_range(stub):
    stub.routes["/api/v1/label/__name__/values"] = _names()
    stub.routes["/api/v1/query_range"] = lambda p: Reply(
        body={
            "status": "success",
            "data": {
                "resultType": "matrix",
                "result": [{"metric": {}, "values": [[1, "0.5"], [2, "NaN"]]}],
            },
        }
    )
    code, text, _ = _run_cli(
        ["decode_share", "--prom", stub.url, "--range", "now-10m", "now", "--step", "30s", "--json"]
    )
    assert code == 0
    assert json.loads(text)["queries"][0]["result"][0]["points"] == [[1.0, 0.5], [2.0, None]]
    params = stub.seen[-1].params
    assert params["step"] == ["30s"]
    assert float(params["end"][0]) - float(params["start"][0]) == pytest.approx(600, abs=1)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["avg_decode_time"], "--prom"),
        ([], "name one or more"),
        (["nope", "--prom", "http://127.0.0.1:1"], "unknown query nope"),
        (["ttft_p50", "--prom", "http://127.0.0.1:1", "--window", "5 minutes"], "duration"),
        (["ttft_p50", "--prom", "http://127.0.0.1:1", "--step", "1s"], "--range"),
        (
            ["ttft_p50", "--prom", "http://127.0.0.1:1", "--token-env", "PHASEPROBE_NO_SUCH_VAR"],
            "not set",
        ),
    ],
)
def test_cli_usage_errors(argv, match):
    with pytest.raises(ConfigError, match=match):
        _run_cli(argv)


def test_parse_time():
    assert parse_time("now", now=1000.0) == 1000.0
    assert parse_time("now-1h30m", now=10000.0) == 10000.0 - 5400
    assert parse_time("1700000000.5") == 1700000000.5
    assert parse_time("2023-11-14T22:13:20Z") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20") == 1700000000.0  # no zone: UTC
    with pytest.raises(ConfigError):
        parse_time("yesterday")


# -- the test Prometheus -----------------------------------------------------------------------


def test_scrape_config_groups_targets_by_scheme_and_path():
    config = scrape_config(
        ["http://127.0.0.1:8000", "127.0.0.1:8001", "https://h:9000/custom/metrics"], interval_s=0.5
    )
    jobs = {(j["scheme"], j["metrics_path"]): j for j in config["scrape_configs"]}
    assert jobs[("http", "/metrics")]["static_configs"] == [
        {"targets": ["127.0.0.1:8000", "127.0.0.1:8001"]}
    ]
    assert jobs[("https", "/custom/metrics")]["scrape_interval"] == "500ms"


def test_missing_prometheus_binary_says_how_to_install(tmp_path):
    server = PrometheusServer(["127.0.0.1:1"], binary=tmp_path / "no-such-prometheus-binary")
    with pytest.raises(PrometheusError, match="apt-get install prometheus"):
        server.start()
    assert server.pid is None


@pytest.mark.skipif(
    not __import__("pathlib").Path("/usr/bin/prometheus").exists(),
    reason="prometheus missing (apt-get install prometheus)",
)
def test_real_prometheus_starts_and_stops_cleanly():
    from phaseprobe.local.process import process_group_alive

    with PrometheusServer(["127.0.0.1:1"]) as server:
        pid, workdir = server.pid, server.workdir
        assert pid is not None and workdir is not None and workdir.exists()
        client = PrometheusClient(server.url, environ={})
        assert client.instant_query("1")[0].value == 1.0
        assert client.names_map() == {}  # no vLLM scraped: newest names stay
    assert not process_group_alive(pid)
    assert not workdir.exists()
