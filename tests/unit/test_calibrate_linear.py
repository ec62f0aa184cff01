"""Calibration the way the server computes (issue 16): F.linear at a layer's shapes in the
served dtype, within a per-dtype time budget; no torch needed (a scripted stand-in)."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace

import pytest

from phaseprobe.calibrate import bench_script
from phaseprobe.calibrate.run import Completed, model_shapes, run_benchmark
from phaseprobe.errors import ConfigError
from tests.unit.test_roofline_bound import TINY


class _Tensor:
    def __init__(self, *shape: int) -> None:
        self.shape = shape

    def to(self, dtype: object) -> _Tensor:
        return self


def fake_torch(seconds_per_call: float) -> SimpleNamespace:
    """torch's surface the script touches; each linear "runs" for ``seconds_per_call``."""
    calls: list[tuple[int, ...]] = []

    def linear(x: _Tensor, w: _Tensor) -> None:
        calls.append((*x.shape, w.shape[0]))
        time.sleep(seconds_per_call)

    gen = SimpleNamespace(manual_seed=lambda seed: gen)
    return SimpleNamespace(
        bfloat16="bf16",
        float16="fp16",
        float32="fp32",
        calls=calls,
        nn=SimpleNamespace(functional=SimpleNamespace(linear=linear)),
        Generator=lambda device: gen,
        randn=lambda *shape, device, generator: _Tensor(*shape),
    )


def test_layer_shapes_are_the_fused_projections():
    assert bench_script.layer_shapes(256, 1024, 2816) == [
        (256, 1024, 1536),
        (256, 1024, 1024),
        (256, 1024, 5632),
        (256, 2816, 1024),
    ]


def test_a_slow_path_stops_at_its_budget_and_says_so():
    """A 49 s calibration came from repeating a 0.9 GFLOP/s bf16 path: the budget caps it."""
    torch = fake_torch(0.05)
    shapes = bench_script.layer_shapes(8, 16, 32) * 3  # 12 shapes
    started = time.monotonic()
    out = bench_script.measure_matmul(torch, "cpu", shapes, "bf16", budget_s=0.3)
    took = time.monotonic() - started
    assert took < 0.3 + 3 * 0.05 + 0.2  # the budget, one warm-up and one call of overshoot
    assert out["budget_exhausted"] is True and len(out["shapes"]) < len(shapes)
    assert out["kernel"] == "torch.nn.functional.linear"
    assert all(s["repeats"] >= 1 for s in out["shapes"])
    m, k, n = out["shape"]
    assert out["flops_per_matmul"] == 2.0 * m * k * n


def test_a_fast_path_measures_every_shape_and_reports_the_best():
    torch = fake_torch(0.0)
    shapes = [(128, 128, 256), (256, 1024, 1024)]
    out = bench_script.measure_matmul(torch, "cpu", shapes, "fp32", budget_s=0.2)
    assert out["budget_exhausted"] is False
    assert [(s["m"], s["k"], s["n"]) for s in out["shapes"]] == shapes
    assert out["best_tflop_s"] == max(s["best_tflop_s"] for s in out["shapes"])
    assert set(torch.calls) == {(128, 128, 256), (256, 1024, 1024)}


def test_model_shapes_of_the_tiny_model(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(TINY))
    # QKV 128 → 4·32 + 2·2·32 = 256, output 128 → 128, gate+up 128 → 512, down 256 → 128.
    assert model_shapes(tmp_path, 128) == [
        (128, 128, 256),
        (128, 128, 128),
        (128, 128, 512),
        (128, 256, 128),
    ]
    with pytest.raises(ConfigError, match="--tokens"):
        model_shapes(tmp_path, 0)


def test_shapes_and_budget_reach_the_script(tmp_path):
    exe = tmp_path / "py"
    exe.write_text("")
    seen: list[list[str]] = []

    def runner(argv, timeout_s):
        seen.append(list(argv))
        return Completed(1, "", "boom")

    with pytest.raises(Exception, match="boom"):
        run_benchmark(
            "cpu", interpreter=str(exe), runner=runner, shapes=[(128, 128, 256)], budget_s=2.5
        )
    assert seen[0][-4:] == ["--shape", "128,128,256", "--budget-s", "2.5"]
    with pytest.raises(ConfigError, match="--budget"):
        run_benchmark("cpu", interpreter=str(exe), runner=runner, budget_s=0)
    assert bench_script._shape("1,2,3") == (1, 2, 3)
    with pytest.raises(ValueError):
        bench_script._shape("1,0,3")
