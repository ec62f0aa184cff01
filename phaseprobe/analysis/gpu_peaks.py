"""Datasheet peaks of known accelerators: memory bandwidth and dense tensor FLOP/s.

These are the denominators of the roofline (:mod:`phaseprobe.analysis.roofline`): decode is
bound by memory bandwidth, prefill by matmul throughput. Every figure comes from the vendor's
datasheet or product page named in the row's ``source``; nothing here is measured (that is what
``phaseprobe calibrate`` is for) and nothing is guessed: a figure the vendor does not publish is
``None``.

**Dense, not sparse.** NVIDIA's datasheets print tensor FLOP/s *with 2:4 structured sparsity*
(marked "*" and footnoted "with sparsity") for Hopper, Ada and Blackwell; LLM inference does not
use structured sparsity, so the table holds half of those figures, i.e. the dense rate. Where a
datasheet states the dense number itself (A100, MI300X) it is used as printed. Bandwidths are
the datasheet's peak; a good copy kernel reaches ~80-90 % of it on HBM.

Units: GB/s and TFLOP/s are decimal (1e9 bytes/s, 1e12 FLOP/s), as vendors use them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from phaseprobe.errors import ConfigError

__all__ = ["GpuSpec", "GPUS", "normalize", "lookup", "match_device", "known_names"]


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's datasheet peaks (dense tensor rates)."""

    name: str
    mem_bandwidth_gb_s: float
    bf16_dense_tflop_s: float | None  # FP16 and BF16 tensor rates are equal on every row
    fp8_dense_tflop_s: float | None  # None: no FP8 tensor cores (A100, A10G) or not published
    memory_gb: float
    source: str
    aliases: tuple[str, ...] = ()

    @property
    def mem_bandwidth_bytes_per_s(self) -> float:
        """The datasheet memory bandwidth in bytes per second (decimal: GB/s × 1e9)."""
        return self.mem_bandwidth_gb_s * 1e9

    def dense_flops_per_s(self, dtype: str = "bf16") -> float | None:
        """Peak dense tensor FLOP/s for ``bf16``/``fp16`` or ``fp8`` (None when unknown).
        Raises ConfigError for any other dtype."""
        if dtype in ("bf16", "fp16"):
            tflops = self.bf16_dense_tflop_s
        elif dtype == "fp8":
            tflops = self.fp8_dense_tflop_s
        else:
            raise ConfigError(f"no tensor peak for dtype {dtype!r} (use bf16, fp16 or fp8)")
        return None if tflops is None else tflops * 1e12


_NVIDIA_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet "
    "https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet"
)

GPUS: tuple[GpuSpec, ...] = (
    # Datasheet: BF16/FP16 1,979 and FP8 3,958 TFLOPS "with sparsity"; 3.35 TB/s HBM3.
    GpuSpec(
        "H100 SXM",
        3350.0,
        989.5,
        1979.0,
        80.0,
        _NVIDIA_H100,
        ("h100sxm", "h100sxm5", "h100sxm80gb", "h10080gbhbm3"),
    ),
    # Datasheet (PCIe column): BF16/FP16 1,513 and FP8 3,026 TFLOPS "with sparsity"; 2 TB/s
    # HBM2e. (Later datasheets replaced this column with H100 NVL, which is a different card.)
    GpuSpec("H100 PCIe", 2000.0, 756.5, 1513.0, 80.0, _NVIDIA_H100, ("h100pcie", "h100pcie80gb")),
    # Same GH100 compute as H100 SXM, faster and larger memory: 141 GB HBM3e at 4.8 TB/s;
    # BF16 1,979 / FP8 3,958 TFLOPS "with sparsity".
    GpuSpec(
        "H200",
        4800.0,
        989.5,
        1979.0,
        141.0,
        "NVIDIA H200 Tensor Core GPU datasheet https://www.nvidia.com/en-us/data-center/h200/",
        ("h200", "h200sxm", "h200sxm141gb", "h200141gbhbm3e"),
    ),
    # A100 datasheet prints dense 312 TFLOPS BF16/FP16 (624 "with sparsity"); 1,555 GB/s
    # (40 GB HBM2) and 2,039 GB/s (80 GB HBM2e) for SXM. Ampere has no FP8.
    GpuSpec(
        "A100 40GB SXM",
        1555.0,
        312.0,
        None,
        40.0,
        "NVIDIA A100 Tensor Core GPU datasheet https://www.nvidia.com/content/dam/en-zz/"
        "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        ("a10040gbsxm", "a100sxm440gb", "a100sxm40gb"),
    ),
    GpuSpec(
        "A100 80GB SXM",
        2039.0,
        312.0,
        None,
        80.0,
        "NVIDIA A100 Tensor Core GPU datasheet https://www.nvidia.com/content/dam/en-zz/"
        "Solutions/Data-Center/a100/pdf/nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf",
        ("a10080gbsxm", "a100sxm480gb", "a100sxm80gb"),
    ),
    # Datasheet prints both: BF16 362.05 | 733* and FP8 733 | 1,466* (* with sparsity);
    # 864 GB/s GDDR6.
    GpuSpec(
        "L40S",
        864.0,
        362.05,
        733.0,
        48.0,
        "NVIDIA L40S datasheet https://www.nvidia.com/en-us/data-center/l40s/",
        ("l40s",),
    ),
    # Datasheet: BF16/FP16 242 and FP8 485 TFLOPS, footnoted "with sparsity"; 300 GB/s GDDR6.
    GpuSpec(
        "L4",
        300.0,
        121.0,
        242.5,
        24.0,
        "NVIDIA L4 Tensor Core GPU datasheet https://www.nvidia.com/en-us/data-center/l4/",
        ("l4",),
    ),
    # AWS-only variant of the A10; NVIDIA publishes no A10G datasheet. Bandwidth (600 GB/s,
    # 24 GB GDDR6, same as the A10) per AWS's G5 page; its tensor rate differs from the A10's
    # 125 TFLOPS and no vendor figure was found, so it is left unknown (use calibrate).
    GpuSpec(
        "A10G",
        600.0,
        None,
        None,
        24.0,
        "AWS EC2 G5 instances https://aws.amazon.com/ec2/instance-types/g5/ (bandwidth as "
        "in https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/)",
        ("a10g",),
    ),
    # AMD datasheet prints dense and sparse separately: FP16/BF16 1,307.4 (2,614.9 with
    # sparsity), FP8 2,614.9 (5,229.8 with sparsity) TFLOPS; 192 GB HBM3 at 5.3 TB/s.
    GpuSpec(
        "MI300X",
        5300.0,
        1307.4,
        2614.9,
        192.0,
        "AMD Instinct MI300X data sheet https://www.amd.com/content/dam/amd/en/documents/"
        "instinct-tech-docs/data-sheets/amd-instinct-mi300x-data-sheet.pdf",
        ("mi300x", "instinctmi300x", "amdinstinctmi300x"),
    ),
    # HGX B200 per-GPU column: FP16/BF16 4.5 PFLOPS and FP8 9 PFLOPS "with sparsity";
    # 180 GB HBM3e at 7.7 TB/s (launch material said 192 GB / 8 TB/s; the HGX table is used).
    GpuSpec(
        "B200",
        7700.0,
        2250.0,
        4500.0,
        180.0,
        "NVIDIA HGX platform specifications (HGX B200, per GPU) "
        "https://www.nvidia.com/en-us/data-center/hgx/",
        ("b200", "hgxb200", "b200sxm"),
    ),
)

# Names too vague to pick a row: say which rows they could mean instead of guessing.
_AMBIGUOUS: dict[str, tuple[str, ...]] = {
    "h100": ("H100 SXM", "H100 PCIe"),
    "a100": ("A100 40GB SXM", "A100 80GB SXM"),
    "a100sxm": ("A100 40GB SXM", "A100 80GB SXM"),
    "a100sxm4": ("A100 40GB SXM", "A100 80GB SXM"),
}
_VENDOR_PREFIXES = ("nvidia", "amdinstinct", "amd", "tesla")


def normalize(name: str) -> str:
    """Case, spaces, dashes and underscores do not matter: ``"H100-SXM"`` → ``"h100sxm"``."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _index() -> dict[str, GpuSpec]:
    index: dict[str, GpuSpec] = {}
    for spec in GPUS:
        for key in (normalize(spec.name), *spec.aliases):
            index[key] = spec
    return index


_INDEX = _index()


def known_names() -> list[str]:
    """Every listed GPU's name, in table order (aliases left out)."""
    return [spec.name for spec in GPUS]


def match_device(device_name: str) -> GpuSpec | None:
    """The row for a device name as torch/nvidia-smi report it (``"NVIDIA H100 80GB HBM3"``,
    ``"NVIDIA A100-SXM4-80GB"``, ``"AMD Instinct MI300X"``), or None when it is not a known
    GPU (a CPU, an unlisted card, or an ambiguous name)."""
    key = normalize(device_name)
    for prefix in _VENDOR_PREFIXES:
        if key.startswith(prefix) and key[len(prefix) :] in _INDEX:
            return _INDEX[key[len(prefix) :]]
    return _INDEX.get(key)


def lookup(name: str) -> GpuSpec:
    """The row for a user-typed name (``h100-sxm``, ``"H200"``, ``mi300x``); ``ConfigError``
    naming the known GPUs when it matches none, or the candidates when it is ambiguous."""
    spec = match_device(name)
    if spec is not None:
        return spec
    key = normalize(name)
    for prefix in ("", *_VENDOR_PREFIXES):
        if key.startswith(prefix) and key[len(prefix) :] in _AMBIGUOUS:
            options = " or ".join(_AMBIGUOUS[key[len(prefix) :]])
            raise ConfigError(f"GPU name {name!r} is ambiguous: {options}?")
    raise ConfigError(f"unknown GPU {name!r}; known: {', '.join(known_names())}")
