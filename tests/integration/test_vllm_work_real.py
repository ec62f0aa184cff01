"""Issue 32 on the real local vLLM (started with --enable-mfu-metrics --kv-cache-metrics):
`probe --json` shows vLLM's own FLOP and byte deltas beside phaseprobe's with their ratio, and
each isolated run's prompt tokens by source; the per-request-metrics path is not taken on 0.32
and the notes say so."""

from __future__ import annotations

import json

import pytest

from phaseprobe.analysis.vllm_work import DISAGREEMENT, model_work
from phaseprobe.collect.model_config import model_cost_from_config
from phaseprobe.present.cli import main

pytestmark = pytest.mark.integration


def test_probe_json_sets_vllms_work_beside_phaseprobes(local_vllm, tmp_path, capsys):
    code = main(
        [
            "probe",
            "--endpoint",
            local_vllm.base_url,
            "--runs",
            "3",
            "--warmup",
            "1",
            "--max-tokens",
            "64",
            "--prompt-tokens",
            "170",
            "--no-gpu",
            "--no-spans",
            "--store",
            str(tmp_path / "s.sqlite"),
            "--json",
        ]
    )
    doc = json.loads(capsys.readouterr().out)
    assert code == 0
    runs = [r for r in doc["runs"] if r["isolated"]]
    assert runs, doc["runs"]
    work = doc["efficiency"]["work"]
    assert "skipped" not in work, work
    root = next(m["root"] for m in doc["server"]["models"])
    cost = model_cost_from_config(root)
    by_seq = {w["seq"]: w for w in work["runs"]}
    for r in runs:
        deltas, w = r["server"]["counter_deltas"], by_seq[r["seq"]]
        # vLLM's side is the run's own counter deltas, phaseprobe's the config arithmetic
        assert deltas["vllm_flops"] > 0 and deltas["vllm_read_bytes"] > 0
        assert w["vllm_flops"] == deltas["vllm_flops"]
        cached = int(deltas.get("prefix_cache_hits", 0))
        assert (w["model_flops"], w["model_read_bytes"], w["model_write_bytes"]) == pytest.approx(
            model_work(cost, r["prompt_tokens"], r["completion_tokens"], cached)
        )
        assert w["flops_ratio"] == pytest.approx(w["vllm_flops"] / w["model_flops"])
        # prompt tokens by source add up to the prompt (unique prompts: computed, not cached)
        sources = {
            k.split(".", 1)[1]: v
            for k, v in deltas.items()
            if k.startswith("prompt_tokens_by_source.")
        }
        assert sum(sources.values()) == r["prompt_tokens"]
        assert sources["local_cache_hit"] == cached
        assert sources["external_kv_transfer"] == 0
    ratio = work["flops_ratio"]
    named = [f for f in work["findings"] if f.startswith("flops")]
    assert bool(named) == (abs(ratio - 1) > DISAGREEMENT), (ratio, work["findings"])
    print(
        f"vLLM/phaseprobe over {len(runs)} runs: FLOPs ×{ratio:.3f}, read "
        f"×{work['read_bytes_ratio']:.3f}, written ×{work['write_bytes_ratio']:.3f}; "
        f"{work['findings']}"
    )
    assert any("per-request metrics in the response: not read" in n for n in doc["notes"])
