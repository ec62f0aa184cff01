import pytest
import requests

from phaseprobe.errors import MetricsUnavailable, UnknownMetric
from phaseprobe.sources.vllm.metrics import ALIASES, MetricsScraper, parse_exposition
from tests.unit.metrics_text import exposition


def test_parses_histogram_parts_counters_and_gauges():
    snap = parse_exposition(
        exposition(
            sums={"request_decode_time_seconds": 1.25}, count=3, prompt_tokens=300, running=1
        )
    )
    assert snap.resolve("decode_time") == "vllm:request_decode_time_seconds"
    assert snap.value("decode_time", "_sum") == 1.25
    assert snap.value("decode_time", "_count") == 3
    assert snap.value("prompt_tokens") == 300
    assert snap.value("requests_running") == 1
    assert snap.labels_of("cache_config_info")[0]["num_gpu_blocks"] == "1000"
    assert snap.has_vllm()


@pytest.mark.parametrize(
    "prefix, itl, kv, suffix",
    [
        ("vllm:", "inter_token_latency_seconds", "kv_cache_usage_perc", "_total"),
        ("vllm:", "time_per_output_token_seconds", "gpu_cache_usage_perc", "_total"),
        ("vllm_", "inter_token_latency_seconds", "gpu_cache_usage_perc", ""),
    ],
)
def test_alias_table_resolves_old_and_new_spellings(prefix, itl, kv, suffix):
    snap = parse_exposition(
        exposition(
            sums={},
            count=0,
            prompt_tokens=7,
            prefix=prefix,
            itl_name=itl,
            kv_name=kv,
            counter_suffix=suffix,
        )
    )
    assert snap.resolve("itl") == prefix + itl
    assert snap.resolve("kv_cache_usage") == prefix + kv
    assert snap.value("prompt_tokens") == 7
    assert snap.value("kv_cache_usage") == pytest.approx(0.01)


def test_unknown_metric_names_what_was_tried_and_the_version():
    snap = parse_exposition(exposition(sums={}, count=0))
    with pytest.raises(UnknownMetric) as err:
        snap.resolve("prefix_cache_hits", vllm_version="0.32.0")
    msg = str(err.value)
    assert "vllm:prefix_cache_hits_total" in msg and "gpu_prefix_cache_hits" in msg
    assert "0.32.0" in msg
    with pytest.raises(UnknownMetric):
        snap.resolve("no_such_canonical")
    assert snap.value("prefix_cache_hits") is None


def test_model_filter_sums_only_that_models_series():
    text = exposition(sums={"request_decode_time_seconds": 2.0}, count=1, model="a")
    other = exposition(sums={"request_decode_time_seconds": 5.0}, count=4, model="b")
    # Two models behind one server: keep the families once, samples of both.
    body = [ln for ln in other.splitlines() if ln.startswith("vllm:request_decode_time_seconds_")]
    merged = text.replace(
        'vllm:request_decode_time_seconds_count{engine="0",model_name="a"} 1',
        'vllm:request_decode_time_seconds_count{engine="0",model_name="a"} 1\n'
        + "\n".join(body[1:]),
    )
    snap = parse_exposition(merged)
    assert snap.value("decode_time", "_sum", model="a") == 2.0
    assert snap.value("decode_time", "_sum", model="b") == 5.0
    assert snap.value("decode_time", "_sum") == 7.0


def test_junk_is_a_typed_error_naming_the_source():
    with pytest.raises(MetricsUnavailable) as err:
        parse_exposition("<html>not metrics</html>\n", source="http://x/metrics")
    assert "http://x/metrics" in str(err.value)


def test_every_alias_kind_is_known():
    assert {kind for kind, _ in ALIASES.values()} == {"histogram", "counter", "gauge"}


class _Resp:
    def __init__(self, status, text):
        self.status_code, self.text = status, text


class _Session:
    def __init__(self, resp=None, exc=None):
        self.resp, self.exc = resp, exc

    def get(self, url, headers=None, timeout=None):
        if self.exc:
            raise self.exc
        return self.resp


def test_scraper_errors_name_the_url():
    for session, reason in (
        (_Session(exc=requests.ConnectionError("refused")), "ConnectionError"),
        (_Session(_Resp(404, "nope")), "HTTP 404"),
        (_Session(_Resp(200, "# only comments\n")), "no vllm: series"),
    ):
        with pytest.raises(MetricsUnavailable) as err:
            MetricsScraper("http://h:1/", session=session).scrape()
        assert "http://h:1/metrics" in str(err.value) and reason in str(err.value)


def test_by_label_sums_per_label_value_and_says_when_not_exported():
    snap = parse_exposition(
        "# TYPE vllm:request_success_total counter\n"
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="a"} 3\n'
        'vllm:request_success_total{engine="1",finished_reason="length",model_name="a"} 2\n'
        'vllm:request_success_total{engine="0",finished_reason="abort",model_name="b"} 1\n'
    )
    assert snap.by_label("request_success", "finished_reason") == {"length": 5.0, "abort": 1.0}
    assert snap.by_label("request_success", "finished_reason", "a") == {"length": 5.0}
    assert snap.by_label("prompt_tokens_by_source", "source") is None
