"""The datasheet table: lookups by user names and device names, and its own consistency."""

from __future__ import annotations

import pytest

from phaseprobe.analysis.gpu_peaks import GPUS, known_names, lookup, match_device, normalize
from phaseprobe.errors import ConfigError

REQUIRED = (
    "H100 SXM",
    "H100 PCIe",
    "H200",
    "A100 40GB SXM",
    "A100 80GB SXM",
    "L40S",
    "L4",
    "A10G",
    "MI300X",
    "B200",
)


def test_every_required_accelerator_is_there_with_a_source():
    assert set(REQUIRED) <= set(known_names())
    for spec in GPUS:
        assert spec.mem_bandwidth_gb_s > 0 and spec.memory_gb > 0
        assert "http" in spec.source, spec.name
        if spec.bf16_dense_tflop_s is not None and spec.fp8_dense_tflop_s is not None:
            assert spec.fp8_dense_tflop_s == pytest.approx(2 * spec.bf16_dense_tflop_s, rel=0.02)


@pytest.mark.parametrize(
    ("name", "bandwidth_gb_s", "bf16_dense"),
    [
        ("H100 SXM", 3350, 989.5),  # datasheet 1,979 TFLOPS "with sparsity" → half
        ("H100 PCIe", 2000, 756.5),
        ("H200", 4800, 989.5),
        ("A100 40GB SXM", 1555, 312),
        ("A100 80GB SXM", 2039, 312),
        ("L40S", 864, 362.05),
        ("L4", 300, 121),
        ("MI300X", 5300, 1307.4),
        ("B200", 7700, 2250),
    ],
)
def test_dense_figures(name, bandwidth_gb_s, bf16_dense):
    spec = lookup(name)
    assert spec.mem_bandwidth_gb_s == bandwidth_gb_s
    assert spec.bf16_dense_tflop_s == bf16_dense
    assert spec.mem_bandwidth_bytes_per_s == pytest.approx(bandwidth_gb_s * 1e9)
    assert spec.dense_flops_per_s("fp16") == pytest.approx(bf16_dense * 1e12)


@pytest.mark.parametrize(
    ("typed", "expected"),
    [
        ("h100-sxm", "H100 SXM"),
        ("H100 SXM", "H100 SXM"),
        ("h100_sxm5", "H100 SXM"),
        ("  H100  pcie ", "H100 PCIe"),
        ("h200", "H200"),
        ("a100-80gb-sxm", "A100 80GB SXM"),
        ("l40s", "L40S"),
        ("L4", "L4"),
        ("a10g", "A10G"),
        ("mi300x", "MI300X"),
        ("AMD Instinct MI300X", "MI300X"),
        ("b200", "B200"),
        ("nvidia-h200", "H200"),
    ],
)
def test_lookup_ignores_case_spaces_and_dashes(typed, expected):
    assert lookup(typed).name == expected


@pytest.mark.parametrize(
    ("device_name", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "H100 SXM"),
        ("NVIDIA H100 PCIe", "H100 PCIe"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB SXM"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA A10G", "A10G"),
        ("AMD Instinct MI300X", "MI300X"),
        ("NVIDIA B200", "B200"),
    ],
)
def test_device_names_as_torch_reports_them(device_name, expected):
    spec = match_device(device_name)
    assert spec is not None and spec.name == expected


@pytest.mark.parametrize(
    "device_name",
    [
        "Intel(R) Xeon(R) Processor @ 2.50GHz",
        "NVIDIA H100 NVL",
        "NVIDIA H200 NVL",
        "NVIDIA A100 80GB PCIe",
        "NVIDIA GeForce RTX 4090",
        "",
        "NVIDIA H100",
    ],
)
def test_other_devices_are_not_matched_to_a_wrong_row(device_name):
    assert match_device(device_name) is None


def test_unknown_and_ambiguous_names_are_config_errors():
    with pytest.raises(ConfigError, match="known: H100 SXM"):
        lookup("rtx 4090")
    with pytest.raises(ConfigError, match="ambiguous: H100 SXM or H100 PCIe"):
        lookup("H100")
    with pytest.raises(ConfigError, match="ambiguous"):
        lookup("NVIDIA A100")


def test_unknown_figures_stay_none_and_dtypes_are_checked():
    assert lookup("A10G").dense_flops_per_s("bf16") is None  # no vendor figure found
    assert lookup("A100 80GB SXM").dense_flops_per_s("fp8") is None  # Ampere has no FP8
    assert lookup("H100 SXM").dense_flops_per_s("fp8") == pytest.approx(1979e12)
    with pytest.raises(ConfigError, match="int4"):
        lookup("H100 SXM").dense_flops_per_s("int4")


def test_normalize():
    assert normalize("H100-SXM 80GB") == "h100sxm80gb"
