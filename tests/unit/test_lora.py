"""LoRA adapters: the served adapters and their base (a real vLLM 0.32 ``/v1/models`` with three
adapters), ``vllm:lora_requests_info`` from its real ``/metrics``, the request cycle, load vs
warm, the phases per adapter and the cost of a load, the ``adapter_thrash`` rule, the store,
the tiny adapter's files and the probe's ``--adapters``."""

from __future__ import annotations

import argparse
import json
import random
import struct
from pathlib import Path

import pytest

from phaseprobe.analysis.checklist import rule_ids
from phaseprobe.analysis.lora import (
    MIN_RUNS,
    UnknownAdapter,
    adapter_use,
    check_adapters,
    load_kind,
    lora_report,
    lora_state,
    metrics_model,
    schedule,
    served_adapters,
)
from phaseprobe.analysis.rules.base import Evidence
from phaseprobe.analysis.rules.lora import adapter_thrash
from phaseprobe.errors import ConfigError, LocalServerError
from phaseprobe.local.tiny_lora import ATTENTION, MLP, lora_modules_args, make_adapters
from phaseprobe.present.cli import main
from phaseprobe.present.cli.cmd_probe import adapter_names
from phaseprobe.records import (
    AdapterUse,
    ClientTimeline,
    Experiment,
    Isolation,
    Run,
    RunSpec,
    ServerPhases,
)
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store

DATA = Path(__file__).parents[1] / "data" / "vllm032_lora"
MODELS = json.loads((DATA / "models.json").read_text())["data"]
MS = 1_000_000


def test_adapters_and_their_base_from_a_real_models_list() -> None:
    assert served_adapters(MODELS) == {
        "ad-a": "tiny-llama",
        "ad-b": "tiny-llama",
        "ad-c": "tiny-llama",
    }
    # vLLM labels an adapter's request metrics with the base model's name
    assert metrics_model("ad-b", MODELS) == "tiny-llama"
    assert metrics_model("tiny-llama", MODELS) == "tiny-llama"
    assert check_adapters(["ad-a", "ad-c"], MODELS, "E") == {
        "ad-a": "tiny-llama",
        "ad-c": "tiny-llama",
    }


def test_an_adapter_the_server_does_not_serve_names_those_it_does() -> None:
    with pytest.raises(UnknownAdapter) as err:
        check_adapters(["ad-a", "ad-x"], MODELS, "http://h:8000")
    assert isinstance(err.value, ConfigError)  # the CLI's one red line and exit 2
    assert str(err.value) == (
        "LoRA adapter 'ad-x' not served at http://h:8000 (its adapters: ad-a, ad-b, ad-c)"
    )
    assert err.value.names == ("ad-x",)
    # the base model is not an adapter; a server without LoRA says how to serve some
    with pytest.raises(UnknownAdapter, match="its adapters: none: start vLLM with --enable-lora"):
        check_adapters(["tiny-llama"], [m for m in MODELS if not m["parent"]], "E")
    other = [*MODELS, {"id": "ad-z", "parent": "other-base"}]
    with pytest.raises(ConfigError, match="different base models"):
        check_adapters(["ad-a", "ad-z"], other, "E")


def test_lora_requests_info_is_read_at_its_newest_label_set() -> None:
    snap = parse_exposition((DATA / "metrics.txt").read_text())
    state = lora_state(snap)
    assert state is not None
    # four label sets, each stamped when last seen: the newest is the idle engine
    assert state.max_lora == 1 and state.running == () and state.waiting == ()
    assert state.seen_at_s == pytest.approx(1.7959325843612914e09)
    busy = parse_exposition(
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",'
        'waiting_lora_adapters="c"} 20.0\n'
        'vllm:lora_requests_info{max_lora="2",running_lora_adapters="",'
        'waiting_lora_adapters=""} 10.0\n'
    )
    got = lora_state(busy)
    assert got is not None and (got.running, got.waiting) == (("a", "b"), ("c",))
    assert lora_state(parse_exposition("vllm:num_requests_running 0\n")) is None


def test_the_cycle_and_which_runs_load_their_adapter() -> None:
    cycle = schedule(["a", "b", "c"], 2, 8)
    assert cycle == ["a", "a", "b", "b", "c", "c", "a", "a"]
    with pytest.raises(ConfigError):
        schedule([], 2, 3)
    kinds = [load_kind(adapter_use(m, "base", cycle[:i], 1)) for i, m in enumerate(cycle)]
    assert kinds == ["load", "warm"] * 4
    # two slots: a b a keeps a warm; base-model requests take no slot
    assert load_kind(adapter_use("a", "base", ["a", "b"], 2)) == "warm"
    assert load_kind(adapter_use("a", "base", ["a", "b", "c"], 2)) == "load"
    assert load_kind(adapter_use("a", "base", ["a", "base", "base"], 1)) == "warm"
    assert load_kind(adapter_use("a", "base", ["a"], None)) is None  # max_lora not exported


def _run(seq: int, adapter: str | None, prev: list[str], ttft_ms: float, prefill_ms: float) -> Run:
    client = ClientTimeline(
        sent_wall_ns=0,
        event_offsets_ns=(int(ttft_ms * MS), int((ttft_ms + 100) * MS)),
        end_offset_ns=int((ttft_ms + 101) * MS),
        http_status=200,
        prompt_tokens=128,
        completion_tokens=16,
        finish_reason="length",
        complete=True,
    )
    server = ServerPhases(
        queue_s=1e-5,
        prefill_s=prefill_ms / 1e3,
        decode_s=0.1,
        inference_s=prefill_ms / 1e3 + 0.1,
        ttft_s=(prefill_ms + 1) / 1e3,
        e2e_s=(prefill_ms + 101) / 1e3,
        count_deltas={},
        counter_deltas={},
    )
    use = adapter_use(adapter, "base", prev, 1) if adapter is not None else None
    return Run(
        seq=seq,
        status="ok",
        prompt="p",
        client=client,
        server=server,
        isolation=Isolation(verified=True, isolated=True),
        adapter=use,
    )


def _cycle(n: int, load_extra_ms: float, seed: int = 1, noise_ms: float = 6) -> tuple[Run, ...]:
    """n runs over a, b, c two in a row (a warm-up of a before), TTFT 60 ± ``noise_ms`` and
    prefill 20 ms less, a load adding ``load_extra_ms`` to both."""
    rng = random.Random(seed)
    cycle = schedule(["a", "b", "c"], 2, n + 1)
    runs = []
    for seq in range(n):
        i = seq + 1
        extra = (
            load_extra_ms if load_kind(adapter_use(cycle[i], "base", cycle[:i], 1)) == "load" else 0
        )
        ttft = 60 + rng.uniform(-noise_ms, noise_ms) + extra
        runs.append(_run(seq, cycle[i], cycle[:i], ttft, ttft - 20))
    return tuple(runs)


def test_phases_per_adapter_and_a_load_that_costs() -> None:
    rep = lora_report(_cycle(20, load_extra_ms=40))
    assert rep.used and rep.max_loras == 1 and (rep.loads, rep.warm, rep.unknown) == (10, 10, 0)
    assert [a.adapter for a in rep.adapters] == ["a", "b", "c"]
    assert [a.runs for a in rep.adapters] == [7, 7, 6] and sum(a.loads for a in rep.adapters) == 10
    assert rep.ttft is not None and rep.ttft.costs and not rep.ttft.thin
    assert rep.ttft.extra_s == pytest.approx(0.040, abs=0.008)
    assert rep.prefill is not None and rep.prefill.costs
    doc = rep.to_dict()
    assert doc["load_cost_ttft"]["verdict"] == "regression" and doc["load_cost_ttft"]["load_costs"]
    assert doc["by_adapter"][0]["adapter"] == "a"
    assert any("a load costs it" in line for line in rep.lines())


def test_a_load_that_costs_nothing_is_not_called_a_cost() -> None:
    rep = lora_report(_cycle(20, load_extra_ms=0))
    assert rep.ttft is not None and not rep.ttft.thin and not rep.ttft.costs
    assert "no measurable load cost" in rep.ttft.text()


def test_too_few_runs_are_too_thin_and_conclude_nothing() -> None:
    rep = lora_report(_cycle(2 * MIN_RUNS - 2, load_extra_ms=40))
    assert rep.ttft is not None and rep.ttft.thin and not rep.ttft.costs
    assert "too thin" in rep.ttft.text() and rep.ttft.to_dict()["verdict"] == "too thin"


def test_no_adapter_no_report() -> None:
    rep = lora_report((_run(0, None, [], 60, 40),))
    assert not rep.used and rep.to_dict() == {"used": False} and rep.lines() == []


def test_the_thrash_rule_fails_passes_and_says_too_thin_with_its_numbers() -> None:
    assert "adapter_thrash" in rule_ids()
    fail = adapter_thrash(Evidence(runs=_cycle(20, load_extra_ms=40)))
    assert fail.status == "fail", fail.summary
    assert fail.summary.startswith("adapter thrash: 10 of 20 adapter runs loaded their adapter")
    assert fail.numbers["ttft"]["load_costs"] and fail.numbers["load_share"] == 0.5
    assert fail.numbers["ttft"]["p_value"] < 0.05 and fail.recommendation
    ok = adapter_thrash(Evidence(runs=_cycle(20, load_extra_ms=0)))
    assert ok.status == "pass" and "detectable at this noise" in ok.summary
    # no cost seen where none below ~60 % could have been: too thin, not a pass
    noisy = adapter_thrash(Evidence(runs=_cycle(20, load_extra_ms=0, noise_ms=40)))
    assert noisy.status == "skipped" and noisy.summary.startswith("too thin:"), noisy.summary
    assert noisy.numbers["ttft"]["load_costs"] is False and "a pass needs 50%" in noisy.summary
    thin = adapter_thrash(Evidence(runs=_cycle(6, load_extra_ms=40)))
    assert thin.status == "skipped" and thin.summary.startswith("too thin:")
    none = adapter_thrash(Evidence(runs=(_run(0, None, [], 60, 40),)))
    assert none.status == "skipped" and "--adapters" in none.next_command


def test_a_rare_load_that_costs_warns() -> None:
    # a then b five times each, one load each: 2 of 10 load; then 10 more warm runs of b
    runs = [_run(i, "a", ["a"] * (i + 1), 60 + i % 3, 40) for i in range(5)]
    runs += [
        _run(5 + i, "b", ["a"] + ["b"] * i, 100 + i % 3 if i == 0 else 60 + i % 3, 40)
        for i in range(15)
    ]
    runs[0] = _run(0, "a", ["b"], 101, 40)
    loads = [_run(20 + i, "c", ["b"], 102 + i, 40) for i in range(4)]
    v = adapter_thrash(Evidence(runs=(*runs, *loads)))
    assert v.numbers["loads"] == 6 and v.numbers["warm"] == 18
    assert v.status == "fail" and v.numbers["load_share"] == 0.25  # a quarter is thrash
    more_warm = [_run(30 + i, "b", ["b"], 60 + i % 3, 40) for i in range(8)]
    w = adapter_thrash(Evidence(runs=(*runs, *loads, *more_warm)))
    assert w.status == "warn" and w.numbers["load_share"] < 0.25


def test_the_store_keeps_each_runs_adapter(tmp_path: Path) -> None:
    runs = _cycle(4, load_extra_ms=0)
    with Store(tmp_path / "s.db") as store:
        spec = RunSpec(endpoint="http://h", model="base", prompt="", max_tokens=16)
        eid = store.create_experiment(
            Experiment(name="p", kind="probe", spec=spec, server_info={}, created_wall_ns=0)
        )
        for r in (*runs, _run(4, None, [], 60, 40)):
            store.add_run(eid, r)
        back = store.runs(eid)
    assert [r.adapter for r in back] == [*(r.adapter for r in runs), None]
    assert back[1].adapter == AdapterUse("b", "base", 1, ("a",))
    assert back[1].to_dict()["adapter"] == {
        "name": "b",
        "base": "base",
        "max_loras": 1,
        "recent": ["a"],
    }


def test_the_tiny_adapter_is_peft_safetensors_of_the_models_shapes(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 32, "intermediate_size": 256, "num_hidden_layers": 2}  # fmt: skip
    (model / "config.json").write_text(json.dumps(config))
    made = make_adapters(model, tmp_path / "ad", ["x", "y"], targets=ATTENTION + MLP)
    raw = (made["x"] / "adapter_model.safetensors").read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8 : 8 + n])
    assert (8 + n) % 8 == 0
    tensors = {k: v for k, v in header.items() if k != "__metadata__"}
    assert len(tensors) == 2 * 7 * 2  # layers × projections × (A, B)
    k_b = tensors["base_model.model.model.layers.1.self_attn.k_proj.lora_B.weight"]
    assert k_b["dtype"] == "F32" and k_b["shape"] == [64, 8]  # 2 KV heads × 32
    down_a = tensors["base_model.model.model.layers.0.mlp.down_proj.lora_A.weight"]
    assert down_a["shape"] == [8, 256]
    end = max(v["data_offsets"][1] for v in tensors.values())
    assert len(raw) == 8 + n + end  # the data is exactly the tensors'
    cfg = json.loads((made["x"] / "adapter_config.json").read_text())
    assert (
        cfg["peft_type"] == "LORA"
        and cfg["r"] == 8
        and cfg["target_modules"] == list(ATTENTION + MLP)
    )
    # seeds differ per adapter; the same seed gives the same bytes
    assert raw != (made["y"] / "adapter_model.safetensors").read_bytes()
    again = make_adapters(model, tmp_path / "again", ["x"], targets=ATTENTION + MLP)
    assert (again["x"] / "adapter_model.safetensors").read_bytes() == raw
    assert not (tmp_path / "ad" / "x.tmp").exists()
    args = lora_modules_args(made, max_loras=1)
    assert args[:4] == ["--enable-lora", "--max-loras", "1", "--max-lora-rank"]
    assert f"x={made['x']}" in args
    with pytest.raises(LocalServerError, match="adapter targets"):
        make_adapters(model, tmp_path / "bad", ["z"], targets=("lm_head",))


def test_the_probe_option_names_distinct_adapters(capsys: pytest.CaptureFixture[str]) -> None:
    assert adapter_names("a, b,a,,c") == ("a", "b", "c")
    with pytest.raises(argparse.ArgumentTypeError):
        adapter_names(" , ")
    # a P/D probe sends its legs itself: refused at once, not ignored
    argv = ["probe", "--prefill", "http://127.0.0.1:9", "--decode", "http://127.0.0.1:10"]
    assert main([*argv, "--adapters", "a"]) == 2
    assert "--adapters cannot be combined with --prefill/--decode" in capsys.readouterr().err
