"""The KV hand-over against its bound: bytes a request must move, effective bandwidth of a
measured P/D run against a link, and ``plan --kv-transfer``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from phaseprobe.analysis.pd import transfer_bound as kvt
from phaseprobe.errors import ConfigError
from phaseprobe.present import cli
from phaseprobe.records import Isolation, PdLegs, Run
from phaseprobe.sources.model_config import read_model_config

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
LLAMA2_70B = str(CONFIGS / "llama-2-70b.json")  # FP16, 80 layers, 8 KV heads, head dim 128

# The local tiny model (phaseprobe/local/tiny_model.py): 2 layers, 2 KV heads of 32, bf16.
TINY = {
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "torch_dtype": "bfloat16",
}

PERCENT_OVER_100 = re.compile(r"\b(1\d\d|[2-9]\d\d|\d{4,})(\.\d+)? ?%")


def _legs(**kw) -> PdLegs:
    base = dict(
        prefill_queue_s=3e-5,
        prefill_s=0.0197,
        hand_over_s=4e-5,
        decode_kv_wait_s=4e-5,
        decode_prompt_s=0.016,
        decode_s=0.0555,
        tokens_transferred=384.0,
        tokens_computed=90.0,
        tokens_cached=0.0,
        kv="transferred",
        kv_reason="384 of 474 prompt tokens came from the KV connector",
        prefill_isolated=True,
        decode_isolated=True,
    )
    base.update(kw)
    return PdLegs(**base)  # type: ignore[arg-type]


def _run(seq: int, pd: PdLegs | None, status: str = "ok") -> Run:
    return Run(
        seq=seq,
        status=status,
        prompt="p",  # type: ignore[arg-type]
        client=None,
        server=None,
        isolation=Isolation(True, True),
        pd=pd,
    )


# --- bytes ---------------------------------------------------------------------------------


def test_tiny_model_bytes_match_the_example_connectors_files():
    per_token, how = kvt.kv_shape_bytes(TINY)
    # research/fleet_pd.md: each layer file for 384 tokens is 98,392 B = 384 × 256 B + 88 B
    # header; 2 layers: 512 B per token.
    assert per_token == 512
    assert how == "2 (K, V) × 2 layers × 2 KV heads × 32 dim × 2 B"
    assert kvt.kv_bytes(per_token, 384) == 196_608 == 2 * (98_392 - 88)


def test_llama_70b_fp16_is_320_kib_per_token():
    cfg, _ = read_model_config(LLAMA2_70B)
    per_token, how = kvt.kv_shape_bytes(cfg)
    assert per_token == 2 * 80 * 8 * 128 * 2 == 327_680 == 320 * 1024
    assert how == "2 (K, V) × 80 layers × 8 KV heads × 128 dim × 2 B"
    assert kvt.kv_shape_bytes(cfg, "fp8")[0] == 163_840
    assert kvt.kv_bytes(per_token, 4096) == 1_342_177_280


def test_block_aligned_tokens_as_measured():
    assert kvt.block_aligned_tokens(474, 128) == 384
    assert kvt.block_aligned_tokens(397, 128) == 384
    assert kvt.block_aligned_tokens(129, 128) == 128
    assert kvt.block_aligned_tokens(128, 128) == 0
    assert kvt.block_aligned_tokens(0, 128) == 0
    with pytest.raises(ConfigError):
        kvt.block_aligned_tokens(10, 0)


def test_negative_figures_refused():
    with pytest.raises(ConfigError):
        kvt.kv_bytes(512, -1)


# --- links ---------------------------------------------------------------------------------


def test_link_table_is_one_direction_in_decimal_units():
    assert kvt.link("nvlink4").bytes_per_s == 450e9  # 900 GB/s bidirectional / 2
    assert kvt.link("nvlink3").bytes_per_s == 300e9
    assert kvt.link("pcie5").gb_s == pytest.approx(63.0, abs=0.05)
    assert kvt.link("pcie4").gb_s == pytest.approx(31.5, abs=0.05)
    assert kvt.link("ib-ndr").bytes_per_s == 50e9
    assert kvt.link("ib-hdr").bytes_per_s == 25e9
    assert [kvt.link(k).gb_s for k in ("eth100", "eth200", "eth400")] == [12.5, 25.0, 50.0]
    assert all(lk.source and lk.direction for lk in kvt.LINKS)
    with pytest.raises(ConfigError, match="nvlink4"):
        kvt.link("nvlink9")


def test_copy_link_is_half_the_stream_copy_rate():
    lk = kvt.copy_link(10.0, "Test CPU")
    assert lk.key == "copy" and lk.bytes_per_s == 5e9
    assert "/ 2" in lk.direction
    with pytest.raises(ConfigError):
        kvt.copy_link(0.0, "Test CPU")


def test_plan_transfer_over_nvlink4():
    p = kvt.plan_transfer(327_680, 4096, kvt.link("nvlink4"))
    assert p.bytes == 1_342_177_280
    assert p.seconds == pytest.approx(1_342_177_280 / 450e9)
    assert "327,680 B (320 KiB/token)" in p.sentence and "2.98 ms" in p.sentence
    assert p.to_dict()["link"]["key"] == "nvlink4"


# --- a measured run against a link --------------------------------------------------------


def test_effective_bandwidth_against_the_calibrated_copy():
    run = kvt.kv_path_run(_legs(), 512, [kvt.copy_link(10.0, "Test CPU")], seq=1)
    path = 4e-5 + 0.016
    assert run.bytes == 196_608
    assert run.kv_path_s == pytest.approx(path)
    assert run.effective_bytes_per_s == pytest.approx(196_608 / path)
    (c,) = run.comparisons
    assert not c.bound_wrong
    assert c.bound_s == pytest.approx(196_608 / 5e9)
    assert c.share == pytest.approx((196_608 / path) / 5e9)
    s = run.sentence
    assert "384 tokens' KV = 196,608 B" in s and "12.3 MB/s effective, at least" in s
    assert "0.2% of memory copy on Test CPU" in s
    assert "computed 90 tokens itself" in s
    d = run.to_dict()
    assert d["comparisons"][0]["share"] == pytest.approx(c.share)
    json.dumps(d)


def test_a_time_under_the_bound_is_a_wrong_bound_not_over_100_percent():
    # 384 tokens of Llama-70B KV (125.8 MB) cannot cross 100 GbE (12.5 GB/s) in 1 ms.
    legs = _legs(hand_over_s=0.0005, decode_prompt_s=0.0005)
    run = kvt.kv_path_run(legs, 327_680, [kvt.link("eth100"), kvt.link("nvlink4")])
    eth, nvl = run.comparisons
    assert eth.bound_wrong and eth.share is None
    assert eth.bound_s == pytest.approx(125_829_120 / 12.5e9)
    assert "that bound is wrong" in eth.sentence and "10.1 ms" in eth.sentence
    assert not nvl.bound_wrong and nvl.share == pytest.approx((125_829_120 / 450e9) / 0.001)
    assert not PERCENT_OVER_100.search(run.sentence), run.sentence
    assert eth.to_dict()["share"] is None and eth.to_dict()["bound_wrong"] is True


def test_runs_without_a_transfer_are_explained_not_measured():
    recomputed = kvt.kv_path_run(
        _legs(
            tokens_transferred=0.0,
            tokens_computed=475.0,
            kv="recomputed",
            kv_reason="computed 475 of 475 prompt tokens locally: its KV never arrived",
        ),
        512,
    )
    assert recomputed.effective_bytes_per_s is None and recomputed.bytes is None
    assert "no KV crossed: recomputed" in recomputed.sentence
    busy = kvt.kv_path_run(_legs(decode_isolated=False, kv="unknown", kv_reason="pooled"), 512)
    assert busy.effective_bytes_per_s is None and "not judged" in busy.note
    untimed = kvt.kv_path_run(_legs(hand_over_s=None, decode_prompt_s=None), 512)
    assert untimed.bytes == 196_608 and untimed.effective_bytes_per_s is None


def test_kv_path_report_over_runs():
    runs = [
        _run(1, _legs(decode_prompt_s=0.016)),
        _run(2, _legs(decode_prompt_s=0.020)),
        _run(3, _legs(decode_prompt_s=0.018)),
        _run(4, _legs(tokens_transferred=0.0, kv="recomputed", kv_reason="r")),
        _run(5, None),
        _run(6, _legs(), status="error"),
    ]
    rep = kvt.kv_path_report(runs, TINY, [kvt.copy_link(10.0, "Test CPU")])
    assert [r.seq for r in rep.runs] == [1, 2, 3, 4]
    assert len(rep.measured) == 3 and rep.bytes_per_token == 512
    assert rep.median_bytes == 196_608
    assert rep.median_kv_path_s == pytest.approx(0.018 + 4e-5)
    (c,) = rep.comparisons
    assert c.share == pytest.approx((196_608 / 5e9) / (0.018 + 4e-5))
    assert "median over 3 of 4 runs" in rep.sentence and "512 B/token" in rep.sentence
    doc = rep.to_dict()
    assert doc["measured_runs"] == 3 and len(doc["runs"]) == 4
    json.dumps(doc)
    empty = kvt.kv_path_report([], TINY)
    assert empty.median_effective_bytes_per_s is None and "no P/D runs" in empty.sentence


# --- plan --kv-transfer --------------------------------------------------------------------


def _plan(*extra: str) -> list[str]:
    return ["plan", "--config", LLAMA2_70B, "--gpu-mem-gb", "80", "--gpus", "8", *extra]


def test_plan_text_prints_320_kib_per_token_and_the_time_per_link(capsys):
    assert cli.main(_plan("--kv-transfer", "4096", "--link", "nvlink4", "--link", "pcie5")) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "320 KiB/token (327,680 B = 2 (K, V) × 80 layers × 8 KV heads × 128 dim × 2 B)" in out
    assert "× 4,096 tokens = 1,342,177,280 B (1.25 GiB)" in out
    assert "nvlink4: NVLink 4" in out and "2.98 ms" in out
    assert "pcie5: PCIe Gen5 x16" in out and "21.3 ms" in out
    assert "ib-ndr" not in out


def test_plan_json_kv_transfer_all_links_and_blocks(capsys):
    assert cli.main(_plan("--kv-transfer", "474", "--kv-block-size", "128", "--json")) == 0
    kv = json.loads(capsys.readouterr().out)["kv_transfer"]
    assert kv["bytes_per_token"] == 327_680
    assert (kv["prompt_tokens"], kv["block_size"], kv["tokens"]) == (474, 128, 384)
    assert kv["bytes"] == 384 * 327_680
    assert [p["link"]["key"] for p in kv["links"]] == list(kvt.link_keys())
    ndr = next(p for p in kv["links"] if p["link"]["key"] == "ib-ndr")
    assert ndr["seconds"] == pytest.approx(384 * 327_680 / 50e9)


def test_plan_without_kv_transfer_has_none(capsys):
    assert cli.main(_plan("--json")) == 0
    assert json.loads(capsys.readouterr().out)["kv_transfer"] is None
    assert cli.main(_plan("--link", "nvlink4")) == 2
    assert "need --kv-transfer" in capsys.readouterr().err


def test_plan_link_copy_uses_the_calibration(capsys, monkeypatch, tmp_path):
    from phaseprobe.calibrate import Calibration, save

    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))
    assert cli.main(_plan("--kv-transfer", "100", "--link", "copy")) == 2
    assert "run `phaseprobe calibrate` first" in capsys.readouterr().err
    save(
        Calibration("cpu", "Test CPU", 10.0, 9.0, {"fp32": 0.1}, {"fp32": 0.1}, 0.0, "2", "python")
    )
    assert cli.main(_plan("--kv-transfer", "100", "--link", "copy", "--json")) == 0
    (p,) = json.loads(capsys.readouterr().out)["kv_transfer"]["links"]
    assert p["link"]["bytes_per_s"] == 5e9
    assert p["seconds"] == pytest.approx(100 * 327_680 / 5e9)
