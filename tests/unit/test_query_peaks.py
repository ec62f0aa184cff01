"""Issue 32 item 1: `query --peaks GPU` turns vLLM's per-GPU achieved FLOP/s and bytes/s
(`--enable-mfu-metrics`) into MFU and MBU against the GPU's datasheet peak, and says when a
value beats the peak (the bound is wrong, never "more than 100 %" taken at face value)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from phaseprobe.analysis.gpu_peaks import lookup
from phaseprobe.present.cli import main
from tests.prometheus_stub import Reply, Stub

NAMES = (
    "vllm:estimated_flops_per_gpu_total",
    "vllm:estimated_read_bytes_per_gpu_total",
    "vllm:estimated_write_bytes_per_gpu_total",
)


@pytest.fixture
def prom() -> Iterator[Stub]:
    s = Stub()
    s.routes["/api/v1/label/__name__/values"] = lambda p: Reply(
        body={"status": "success", "data": list(NAMES)}
    )
    yield s
    s.close()


def _answer(flops: str, nbytes: str):
    def answer(params: dict[str, list[str]]) -> Reply:
        q = params["query"][0]
        value = flops if "flops" in q else nbytes
        return Reply(
            body={
                "status": "success",
                "data": {
                    "resultType": "vector",
                    "result": [
                        {"metric": {"instance": "gpu-node:8000"}, "value": [1700000000.0, value]}
                    ],
                },
            }
        )

    return answer


def test_mfu_and_mbu_against_the_datasheet(prom, capsys):
    h100 = lookup("h100-sxm")
    flops = 0.25 * h100.dense_flops_per_s("bf16")
    nbytes = 0.5 * h100.mem_bandwidth_bytes_per_s
    prom.routes["/api/v1/query"] = _answer(repr(flops), repr(nbytes))
    code = main(
        [
            "query",
            "achieved_flops_per_gpu",
            "achieved_mem_bandwidth_per_gpu",
            "--prom",
            prom.url,
            "--peaks",
            "h100-sxm",
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    mfu, mbu = (q["of_peak"] for q in doc["queries"])
    assert (mfu["measure"], mbu["measure"]) == ("MFU", "MBU")
    assert mfu["result"][0]["value"] == pytest.approx(0.25)
    assert mbu["result"][0]["value"] == pytest.approx(0.5)
    assert not mfu["beats_peak"] and mfu["peak"] == h100.dense_flops_per_s("bf16")
    # text: a row per instance under each query
    prom.routes["/api/v1/query"] = _answer(repr(flops), repr(nbytes))
    main(["query", "achieved_flops_per_gpu", "--prom", prom.url, "--peaks", "h100-sxm"])
    text = " ".join(capsys.readouterr().out.split())
    assert "MFU (" in text and "25.0 %" in text


def test_a_rate_above_the_peak_says_the_bound_is_wrong(prom, capsys):
    a100 = lookup("a100-80gb-sxm")
    prom.routes["/api/v1/query"] = _answer(repr(1.5 * a100.dense_flops_per_s("bf16")), "1")
    code = main(["query", "achieved_flops_per_gpu", "--prom", prom.url, "--peaks", "a100-80gb-sxm"])
    out = capsys.readouterr()
    assert code == 0
    assert "beats the" in out.err and "that bound is wrong" in out.err


def test_an_unknown_gpu_is_refused_before_any_request(prom, capsys):
    code = main(["query", "achieved_flops_per_gpu", "--prom", prom.url, "--peaks", "h999"])
    assert code == 2 and "unknown GPU 'h999'" in capsys.readouterr().err
    assert not prom.seen
