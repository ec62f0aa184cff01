"""Issue 16, "numbers that cannot be true", roofline part: each case with the input that showed
it, and a property over the analysis layer (no efficiency above 100 % without the flag)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from phaseprobe.analysis import model_math
from phaseprobe.analysis.gpu_peaks import lookup
from phaseprobe.analysis.model_match import compare_with_server, kv_per_token_served
from phaseprobe.analysis.roofline import (
    ModelCost,
    Peaks,
    fmt_duration,
    fmt_efficiency,
    peaks_from_spec,
    roofline,
)
from phaseprobe.calibrate.run import Calibration
from phaseprobe.collect import efficiency as eff_mod
from phaseprobe.collect.efficiency import (
    check_against_server,
    efficiency_report,
    validate_options,
)
from phaseprobe.collect.model_config import model_cost_from_config
from phaseprobe.errors import ConfigError
from phaseprobe.present.cli.console import render_efficiency
from phaseprobe.records import ClientTimeline, Isolation, Run, ServerPhases


@pytest.fixture(autouse=True)
def _model_root(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test's model directories (under pytest's temp dir) are ones the user allowed: a
    server's /v1/models root is read only inside such a directory (issue 33 item 4)."""
    monkeypatch.setenv("PHASEPROBE_MODEL_ROOT", str(tmp_path_factory.getbasetemp()))


# The local vLLM's tiny model (phaseprobe.local.tiny_model), as its config.json says.
TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "dtype": "bfloat16",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 2048,
    "max_position_embeddings": 2048,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
# Llama-2-70B's config.json (the sizing fields).
LLAMA70B = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "torch_dtype": "float16",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
}
# What the local vLLM reports: /v1/models and vllm:cache_config_info (--kv-cache-memory-bytes
# 256M, block 128, 4096 blocks).
CACHE = {
    "block_size": "128",
    "cache_dtype": "auto",
    "kv_cache_memory_bytes": "268435456",
    "kv_cache_size_tokens": "524288",
    "num_gpu_blocks": "4096",
    "sliding_window": "None",
    "is_attention_free": "False",
    "mamba_cache_mode": "none",
}


def _model_dir(tmp_path: Path, name: str, cfg: dict) -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _server_info(root: Path | str) -> dict:
    return {
        "models": [{"id": "tiny-llama", "root": str(root), "max_model_len": 1024}],
        "vllm_version": "0.32.0",
        "cache_config": dict(CACHE),
    }


def _run(
    seq: int, prompt_tokens: int, completion_tokens: int, prefill_s: float, decode_s: float
) -> Run:
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(10_000_000, 20_000_000),
        end_offset_ns=30_000_000,
        http_status=200,
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=0.0,
        prefill_s=prefill_s,
        decode_s=decode_s,
        inference_s=None,
        ttft_s=None,
        e2e_s=None,
        count_deltas={},
        counter_deltas={},
    )
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=True),
    )


def _calibration(bf16_tflop_s: float, fp32_tflop_s: float | None) -> Calibration:
    rates = {"bf16": bf16_tflop_s, **({"fp32": fp32_tflop_s} if fp32_tflop_s else {})}
    return Calibration(
        device="cpu",
        device_name="AMD EPYC",
        mem_bandwidth_best_gb_s=12.89,
        mem_bandwidth_median_gb_s=6.67,
        matmul_best_tflop_s=rates,
        matmul_median_tflop_s=rates,
        measured_at=1.8e9,
        torch_version="2.9",
        interpreter="python",
    )


def test_the_issues_calibration_now_gives_a_roof_the_server_does_not_beat(tmp_path, monkeypatch):
    """Same runs, same bf16 figure, with the fp32 one the CI box measured (0.11 TFLOP/s):
    a CPU's bf16 roof is its fp32 units, 160.9 ms → ~0.8 ms of math, under the 21.3 ms."""
    root = _model_dir(tmp_path, "tiny", TINY)
    monkeypatch.setattr(eff_mod.calibrate, "load", lambda *a, **k: _calibration(0.0009, 0.11))
    runs = [_run(i, 128, 64, 0.0213, 63 * 0.0009) for i in range(3)]
    rep = efficiency_report(runs, _server_info(root), peaks_choice="calibrated", model_config=None)
    assert not rep["bound_beaten"] and rep["warnings"] == []
    assert rep["prefill_bound_s"] == pytest.approx(84_475_904 / 0.11e12)  # 0.77 ms
    assert 0 < rep["prefill_efficiency"] < 1 and 0 < rep["decode_efficiency"] < 1
    assert "fp32 matmul 110 GFLOP/s > bf16's 0.9" in rep["peaks"]


# --- 1. efficiency above 100 % -------------------------------------------------------------


def test_prefill_755_percent_becomes_bound_beaten_naming_the_peak(tmp_path, monkeypatch):
    """The issue's line: "prefill bound (compute) 160.9 ms vs 21.3 ms → 755 %", from the
    generic bf16 `a @ b` figure (0.0009 TFLOP/s) and the tiny model, 128-token prompts."""
    root = _model_dir(tmp_path, "tiny", TINY)
    monkeypatch.setattr(eff_mod.calibrate, "load", lambda *a, **k: _calibration(0.0009, None))
    runs = [_run(i, 128, 64, 0.0213, 63 * 0.0009) for i in range(3)]
    rep = efficiency_report(runs, _server_info(root), peaks_choice="calibrated", model_config=None)
    # The issue's calibration is an fp32-less one: its bf16 figure is the roof used.
    assert rep["peaks_dtype"] == "bf16" and "bf16 matmul 0.9 GFLOP/s" in rep["peaks"]
    assert rep["prefill_bound_kind"] == "compute"
    assert rep["prefill_bound_ratio"] > 1  # the bound says slower than measured
    assert rep["prefill_efficiency"] is None  # so no efficiency is given
    assert rep["prefill_bound_beaten"] is True and rep["bound_beaten"] is True
    assert all(r["prefill_efficiency"] is None and r["prefill_bound_beaten"] for r in rep["runs"])
    (warning,) = [w for w in rep["warnings"] if w.startswith("prefill")]
    assert "peak matmul FLOP/s is underestimated" in warning
    assert "calibrated AMD EPYC: bf16 matmul 0.9 GFLOP/s" in warning
    json.dumps(rep)

    console = Console(record=True, width=400)
    render_efficiency(console, rep)
    text = console.export_text()
    assert "%" not in text.split("prefill bound", 1)[1].split("\n", 1)[0]
    assert "bound beaten" in text and "underestimated" in text


def test_prefill_counts_the_lm_head_once_not_per_prompt_token(tmp_path):
    """vLLM computes logits for the sampled position only: for the tiny model the head is
    47 % of the weights, so counting it P times doubled the prefill bound."""
    cost = model_cost_from_config(_model_dir(tmp_path, "tiny", TINY))
    body = 2 * (2 * (128 * 128 + 2 * 128 * 64 + 128 * 128) + 2 * 3 * 128 * 256)  # 589,824
    head = 2 * 2048 * 128  # 524,288
    assert cost.linear_flops_per_token == body + head
    attention = 2 * 2 * 4 * (32 + 32)  # QKᵀ + AV per (query, position), all layers: 1,024
    assert cost.prefill_flops(128) == body * 128 + head + attention * 128 * 129 / 2
    assert cost.prefill_flops(128) == pytest.approx(84_475_904)


# --- 2. a --model-config of another model -------------------------------------------------


def test_70b_config_against_the_tiny_server_is_refused_naming_the_fields(tmp_path):
    root = _model_dir(tmp_path, "tiny", TINY)
    other = _model_dir(tmp_path, "llama70b", LLAMA70B)
    with pytest.raises(ConfigError) as err:
        check_against_server(_server_info(root), str(other))
    text = str(err.value)
    for field in (
        "hidden_size 8192 vs 128",
        "num_hidden_layers 80 vs 2",
        "vocab_size 32,000 vs 2048",
        "parameters 68,976,648,192 vs 819,840",
        "kv_bytes_per_token 327,680 vs 512 (vllm:cache_config_info",
    ):
        assert field in text, text
    # The same check on the report side (dashboard, runs): skipped, never "858 %".
    rep = efficiency_report(
        [_run(0, 128, 64, 0.02, 0.06)],
        _server_info(root),
        peaks_choice="h100-sxm",
        model_config=str(other),
    )
    assert "does not describe the served model" in rep["skipped"]
    forced = check_against_server(_server_info(root), str(other), force=True)
    assert forced and "used anyway" in forced[0]


def test_70b_config_against_a_remote_server_is_refused_from_its_kv_cache_figures(tmp_path):
    """No local root to read: /v1/models' max_model_len and cache_config_info still refute."""
    other = _model_dir(tmp_path, "llama70b", LLAMA70B)
    info = _server_info("/nonexistent/tiny-llama-v1")
    info["models"][0]["max_model_len"] = 8192  # longer than Llama-2's 4096 positions
    mismatches = {m.field for m in compare_with_server(LLAMA70B, info)}
    assert mismatches == {"kv_bytes_per_token", "max_position_embeddings"}
    with pytest.raises(ConfigError, match="kv_bytes_per_token"):
        check_against_server(info, str(other))


def test_the_served_models_own_config_and_tensor_parallel_shards_pass(tmp_path):
    root = _model_dir(tmp_path, "tiny", TINY)
    assert check_against_server(_server_info(root), str(root)) == []
    copy = _model_dir(tmp_path, "copy", TINY)
    assert check_against_server(_server_info(root), str(copy / "config.json")) == []
    # TP=8 on a 70B: each worker holds 1/8 of the KV heads.
    kv70 = 2 * 80 * 8 * 128 * 2
    cache = {
        **CACHE,
        "kv_cache_memory_bytes": str(kv70 // 8 * 100_000),
        "kv_cache_size_tokens": "100000",
    }
    assert kv_per_token_served(cache) == kv70 / 8
    info = {
        "models": [{"id": "llama", "root": "meta-llama/Llama-2-70b-hf", "max_model_len": 4096}],
        "cache_config": cache,
    }
    assert compare_with_server(LLAMA70B, info) == []
    # A sliding-window model's pages are not one quotient: no KV verdict either way.
    assert kv_per_token_served({**cache, "sliding_window": "4096"}) is None


# --- 3. tiny values printed as zero -------------------------------------------------------


def test_h200_on_the_tiny_model_prints_nanoseconds_not_zero(tmp_path):
    """`--peaks h200` on the tiny model printed "0.000 ms/token → 0.0 %"."""
    root = _model_dir(tmp_path, "tiny", TINY)
    runs = [_run(i, 128, 64, 0.0213, 63 * 0.0009) for i in range(3)]
    rep = efficiency_report(runs, _server_info(root), peaks_choice="h200", model_config=None)
    # Weights read per step (no input embedding), bf16: 1,115,392 bytes; KV 512 B × 160 tokens.
    step_bytes = (2 * 49152 + 2 * 98304 + 262144 + 2 * 2 * 128 + 128) * 2 + 512 * (128 + 32)
    assert rep["decode_bound_s_per_token"] == pytest.approx(step_bytes / 4.8e12)  # 249 ns
    assert 0 < rep["decode_efficiency"] < 0.001
    console = Console(record=True, width=400)
    render_efficiency(console, rep)
    line = console.export_text()
    assert "0.000 ms" not in line and " 0.0 %" not in line
    assert "decode bound 249 ns/token vs measured 900 µs/token → efficiency 0.028 %" in line


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.1609, "161 ms"),
        (0.0213, "21.3 ms"),
        (2.49e-7, "249 ns"),
        (9e-4, "900 µs"),
        (2.5e-9, "2.50 ns"),
        (3e-12, "0.003 ns"),
        (0.0009996, "1.00 ms"),
        (12.3, "12.3 s"),
        (None, "—"),
    ],
)
def test_one_duration_formatter_never_rounds_to_zero(seconds, text):
    assert fmt_duration(seconds) == text


@pytest.mark.parametrize(
    ("ratio", "text"),
    [
        (0.5, "50.0 %"),
        (0.04, "4.0 %"),
        (0.000277, "0.028 %"),
        (8.1e-6, "0.00081 %"),
        (1.0, "100.0 %"),
        (None, "—"),
    ],
)
def test_efficiency_formatter_keeps_small_values_visible(ratio, text):
    assert fmt_efficiency(ratio) == text


@given(st.floats(min_value=1e-15, max_value=1e4, allow_nan=False))
def test_fmt_duration_and_efficiency_of_a_positive_value_are_never_zero(v):
    assert float(fmt_duration(v).split()[0]) > 0
    assert float(fmt_efficiency(v).split()[0]) > 0


# --- 4. options checked before the runs ---------------------------------------------------


def test_peaks_and_model_config_are_validated_without_a_server(tmp_path, monkeypatch):
    with pytest.raises(ConfigError, match="--peaks: unknown GPU 'h300'"):
        validate_options("h300", None)
    with pytest.raises(ConfigError, match="ambiguous"):
        validate_options("h100", None)
    with pytest.raises(ConfigError, match="no such file"):
        validate_options(None, str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ConfigError, match="hidden_size"):
        validate_options(None, str(bad))
    monkeypatch.setattr(eff_mod.calibrate, "load", lambda *a, **k: None)
    with pytest.raises(ConfigError, match="run `phaseprobe calibrate` first"):
        validate_options("calibrated", None)
    validate_options("h200", str(_model_dir(tmp_path, "tiny", TINY)))  # fine


# --- the property -------------------------------------------------------------------------

_pos = st.floats(min_value=1e-9, max_value=1e3, allow_nan=False, allow_infinity=False)
_rate = st.floats(min_value=1e3, max_value=1e16, allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(
    p=st.integers(1, 200_000),
    n=st.integers(1, 10_000),
    prefill=_pos | st.none(),
    decode=_pos | st.none(),
    weights=st.floats(1e3, 1e13),
    kv=st.floats(0, 1e7),
    linear=st.floats(1e3, 1e13),
    attn=st.floats(0, 1e9),
    bw=_rate | st.none(),
    fl=_rate | st.none(),
)
def test_no_efficiency_above_100_percent_without_the_bound_beaten_flag(
    p, n, prefill, decode, weights, kv, linear, attn, bw, fl
):
    cost = ModelCost(weights, kv, linear, attn, lm_head_flops_per_token=linear / 3)
    r = roofline(p, n, prefill, decode, cost, Peaks(bw, fl, "prop"))
    for phase in ("decode", "prefill"):
        e = getattr(r, f"{phase}_efficiency")
        ratio = getattr(r, f"{phase}_bound_ratio")
        beaten = getattr(r, f"{phase}_bound_beaten")
        assert e is None or 0 < e <= 1
        assert beaten == (ratio is not None and ratio > 1)
        if beaten:
            assert e is None and any(n.startswith(phase) and "underestimated" in n for n in r.notes)
    assert r.to_dict()["bound_beaten"] == (r.decode_bound_beaten or r.prefill_bound_beaten)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(_pos, _pos), min_size=1, max_size=6),
    st.sampled_from(["h200", "l4", "a10g", "mi300x"]),
)
def test_report_medians_never_exceed_100_percent_without_the_flag(tmp_path_factory, times, gpu):
    root = tmp_path_factory.getbasetemp() / "tiny-prop"
    if not root.exists():
        root.mkdir()
        (root / "config.json").write_text(json.dumps(TINY))
    runs = [_run(i, 128, 64, pf, dc) for i, (pf, dc) in enumerate(times)]
    rep = efficiency_report(runs, _server_info(root), peaks_choice=gpu, model_config=None)
    for phase in ("decode", "prefill"):
        e = rep[f"{phase}_efficiency"]
        assert e is None or e <= 1
        if any(r[f"{phase}_bound_beaten"] for r in rep["runs"]):
            assert rep[f"{phase}_bound_beaten"] and e is None
            assert any(w.startswith(phase) for w in rep["warnings"])


def test_peaks_origin_names_the_dtype_and_the_table_row():
    assert peaks_from_spec(lookup("h200")).origin == "datasheet H200 (bf16 dense)"
    assert model_math.canonical_dtype("bfloat16") == "bf16"


def test_dashboard_frame_carries_the_flag_and_no_efficiency_above_100_percent(
    tmp_path, monkeypatch
):
    import pandas as pd

    from phaseprobe.present.dashboard.phases_bound import bound_frame

    root = _model_dir(tmp_path, "tiny", TINY)
    monkeypatch.setattr(eff_mod.calibrate, "load", lambda *a, **k: _calibration(0.0009, None))
    rep = efficiency_report(
        [_run(0, 128, 64, 0.0213, 63 * 0.0009)],
        _server_info(root),
        peaks_choice="calibrated",
        model_config=None,
    )
    frame = bound_frame(rep)
    prefill = frame[frame["phase"] == "prefill"].iloc[0]
    assert bool(prefill["bound beaten"]) and pd.isna(prefill["efficiency"])
    assert (frame["efficiency"].dropna() <= 1).all()


def test_the_served_models_own_config_is_never_second_guessed(tmp_path):
    """The root's config.json is what the server loaded: even where the KV quotient differs
    (a layout this arithmetic does not model), it is used, not refused."""
    root = _model_dir(tmp_path, "tiny", TINY)
    info = _server_info(root)
    info["cache_config"] = {**CACHE, "kv_cache_size_tokens": "1000"}  # 268 KB/token "served"
    assert eff_mod.model_config_mismatches(root, info) == []
    rep = efficiency_report(
        [_run(0, 128, 64, 0.02, 0.06)], info, peaks_choice="h200", model_config=None
    )
    assert "skipped" not in rep
