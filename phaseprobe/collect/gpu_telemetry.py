"""GPU series for ``phaseprobe gpu``: sampled live through NVML, or imported from an
nvidia-smi CSV log or from DCGM-exporter series in Prometheus.

The command parses its options and renders what comes back; which NVML backend is opened, the
sampler over it and the Prometheus client of a DCGM import are built here. The NVML backend is
injectable (the scripted demo GPUs of ``--fake`` are one), as in
:class:`phaseprobe.collect.session.SessionOptions`. The frame columns (:data:`COLUMNS`) and the
sampling period's bounds are the NVML reader's, named here for the command's options and tables.
"""

from __future__ import annotations

from phaseprobe.sources.gpu.importer import GpuImport, import_dcgm, read_nvidia_smi_csv
from phaseprobe.sources.gpu.nvml import (
    COLUMNS,
    DEFAULT_PERIOD_S,
    MIN_PERIOD_S,
    NvmlBackend,
    PynvmlBackend,
)
from phaseprobe.sources.gpu.sampler import GpuSampler

__all__ = [
    "COLUMNS",
    "DEFAULT_PERIOD_S",
    "MIN_PERIOD_S",
    "GpuImport",
    "GpuSampler",
    "NvmlBackend",
    "open_gpu_watch",
    "import_dcgm_series",
    "read_nvidia_smi_csv",
]


def open_gpu_watch(
    period_s: float, backend: NvmlBackend | None = None
) -> tuple[GpuSampler, list[str]]:
    """A sampler (not started) over ``backend``, else the machine's NVML (raises
    NvmlUnavailable without a driver), and the name of each GPU. The sampler owns the backend:
    :meth:`GpuSampler.stop` closes it."""
    if backend is None:
        backend = PynvmlBackend()
    names = [backend.device_name(i) for i in range(backend.device_count())]
    return GpuSampler(backend, period_s, owns_backend=True), names


def import_dcgm_series(
    prom_url: str, *, start: float, end: float, step: float | str, selector: str
) -> GpuImport:
    """The DCGM exporter's ``DCGM_FI_DEV_*`` series between ``start`` and ``end`` (unix s)
    from the Prometheus at ``prom_url``."""
    from phaseprobe.sources.prometheus import PrometheusClient

    with PrometheusClient(prom_url) as client:
        return import_dcgm(client, start=start, end=end, step=step, selector=selector)
