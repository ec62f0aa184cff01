"""``phaseprobe plan`` end to end on the public-shape configs in tests/data/configs."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from phaseprobe.present import cli

CONFIGS = Path(__file__).resolve().parents[1] / "data" / "configs"
LLAMA3_70B = str(CONFIGS / "llama-3-70b.json")
EMBED_70B = 128_256 * 8192


def _main(argv: Sequence[str]) -> int:
    return cli.main(list(argv))


def _plan_json(capsys, *extra: str) -> dict:
    code = _main(
        [
            "plan",
            "--config",
            LLAMA3_70B,
            "--gpu-mem-gb",
            "80",
            "--gpus",
            "8",
            "--concurrent",
            "32",
            "--json",
            *extra,
        ]
    )
    assert code == 0
    return json.loads(capsys.readouterr().out)


def test_human_output_llama_3_70b_on_8_x_80_gib(capsys):
    code = _main(
        ["plan", "--config", LLAMA3_70B, "--gpu-mem-gb", "80", "--gpus", "8", "--concurrent", "32"]
    )
    out = capsys.readouterr().out
    assert code == 0
    # The figures of test_model_math's hand-computed capacity example.
    for figure in (
        "70,553,706,496",
        "327,680 B",
        "1,404,382 tokens",
        "43,886 tokens",
        "max context per user (32 users)",
        "users per context length",
    ):
        assert figure in out, figure


def test_json_document_has_every_figure(capsys):
    doc = _plan_json(capsys)
    assert doc["params"]["total"] == 70_553_706_496
    assert doc["weights"]["bytes"] == 2 * 70_553_706_496
    assert doc["kv"]["bytes_per_token"] == 327_680
    plan = doc["plan"]
    assert plan["kv_capacity_tokens"] == 1_404_382
    assert plan["max_context_per_user_tokens"] == 43_886
    assert [u["users"] for u in plan["users_at_context"]] == [685, 171, 42, 10]
    # No --context: the plan's per-user context, capped at the model's 8,192.
    assert (doc["context_tokens"], doc["context_from"]) == (8192, "model maximum")
    assert doc["decode_floor"] is None


def test_bandwidth_adds_the_decode_floor(capsys):
    doc = _plan_json(capsys, "--bandwidth-tbs", "3.35", "--context", "4096")
    floors = {f["batch_size"]: f for f in doc["decode_floor"]}
    assert set(floors) == {1, 32}
    weights_read = 2 * (70_553_706_496 - EMBED_70B)  # the input embedding is a lookup
    aggregate = 8 * 3.35e12
    one = floors[1]
    assert one["weight_bytes_read"] == weights_read
    assert one["kv_bytes_read"] == 4096 * 327_680
    assert one["step_floor_s"] == pytest.approx((weights_read + 4096 * 327_680) / aggregate)
    assert floors[32]["kv_bytes_read"] == 32 * 4096 * 327_680
    assert floors[32]["tokens_per_s_ceiling"] == pytest.approx(
        32 * aggregate / (weights_read + 32 * 4096 * 327_680)
    )


def test_kv_dtype_fp8_and_dtype_fp8(capsys):
    doc = _plan_json(capsys, "--kv-dtype", "fp8", "--dtype", "fp8")
    assert doc["kv"]["bytes_per_token"] == 163_840
    assert doc["weights"]["name"] == "fp8" and doc["weights"]["base_dtype"] == "bf16"
    assert doc["weights"]["bytes"] < 0.52 * 2 * 70_553_706_496


def test_moe_and_mla_configs_print(capsys):
    for name in ("mixtral-8x7b", "deepseek-v2-lite"):
        code = _main(
            [
                "plan",
                "--config",
                str(CONFIGS / f"{name}.json"),
                "--gpu-mem-gb",
                "80",
                "--gpus",
                "2",
                "--concurrent",
                "4",
                "--bandwidth-tbs",
                "2",
            ]
        )
        out = capsys.readouterr().out
        assert code == 0 and "active per token" in out and "decode floor" in out


def test_weights_that_do_not_fit_exit_1_with_a_note(capsys):
    code = _main(["plan", "--config", LLAMA3_70B, "--gpu-mem-gb", "80", "--json"])
    captured = capsys.readouterr()
    assert code == 1
    assert json.loads(captured.out)["plan"]["fits"] is False
    assert "no room for KV cache" in captured.err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--config", "/nonexistent/config.json", "--gpu-mem-gb", "80"], "no such file"),
        (["--config", LLAMA3_70B, "--gpu-mem-gb", "80", "--dtype", "fp6"], "fp6"),
    ],
)
def test_expected_errors_are_one_red_line_exit_2(argv, message, capsys):
    assert _main(["plan", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and message in lines[0]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--gpu-mem-gb", "80", "--gpu-util", "1.2"], "--gpu-util: must be in (0, 1], not 1.2"),
        (["--gpu-mem-gb", "-1"], "--gpu-mem-gb: must be in (0, 100000], not -1"),
        (["--gpu-mem-gb", "1e308"], "--gpu-mem-gb: must be in (0, 100000], not 1e308"),
        (["--gpu-mem-gb", "nan"], "--gpu-mem-gb: must be a finite number"),
        (["--gpu-mem-gb", "80", "--bandwidth-tbs", "0"], "--bandwidth-tbs: must be in (0, 1000]"),
        (["--gpu-mem-gb", "80", "--reserve-gb", "-2"], "--reserve-gb: must be in [0, 100000]"),
    ],
)
def test_out_of_range_numbers_are_refused_by_the_command_line(argv, message, capsys):
    # Issue 18: unchecked numbers reached the arithmetic (1e308 GiB, nan); argparse now
    # refuses them with its usage line and exit 2, naming the option and the range.
    with pytest.raises(SystemExit) as exc:
        _main(["plan", "--config", LLAMA3_70B, *argv])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert message in captured.err.strip().splitlines()[-1]


def test_config_directory_is_accepted(tmp_path, capsys):
    (tmp_path / "config.json").write_text(Path(LLAMA3_70B).read_text())
    code = _main(["plan", "--config", str(tmp_path), "--gpu-mem-gb", "80", "--gpus", "4", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["config"] == str(tmp_path / "config.json")


def test_flops_have_their_unit_and_a_short_budget_says_by_how_much(capsys):
    # Issue 16: FLOPs printed as "160.48 B"; "KV budget 0 B" with no word on why.
    code = _main(["plan", "--config", LLAMA3_70B, "--gpu-mem-gb", "40"])
    out = " ".join(capsys.readouterr().out.split())
    assert code == 1  # does not fit
    flops_row = out.split("decode FLOPs")[1].split("│")[1]
    assert flops_row.strip().endswith("GFLOP"), flops_row
    # 70.55 B params in bf16 = 131.42 GiB + 2 GiB reserve against 36 GiB usable.
    assert "none: short by 97.42 GiB" in out
    assert "weights 131.42 GiB + reserve 2.00 GiB > usable 36.00 GiB" in out
    # Nothing fits: the FLOPs are given at a stated context, not "of 0 tokens".
    assert "prefill FLOPs of 0 tokens" not in out and "@ 2,048" in out
