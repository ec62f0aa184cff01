"""The NVML sampler with the fake backend (timing, joining, no leaked threads), the real pynvml
backend without a driver, and ``phaseprobe gpu watch``."""

from __future__ import annotations

import argparse
import io
import json
import math
import threading
import time
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from rich.console import Console

from phaseprobe.errors import ConfigError, NvmlUnavailable
from phaseprobe.present.cli import cmd_gpu
from phaseprobe.sources.gpu.nvml import (
    COLUMNS,
    PynvmlBackend,
    conform,
    empty_frame,
)
from phaseprobe.sources.gpu.sampler import GpuSampler, open_sampler
from phaseprobe.testing.fake_nvml import FakeDevice, FakeNvmlBackend, GiB, demo_devices, value_at


def _sampler_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "phaseprobe-gpu-sampler"]


# -- timing with the real clock ----------------------------------------------------------------


def test_period_is_kept_with_the_fake_backend():
    backend = FakeNvmlBackend(demo_devices(2, startup_s=0.1))
    period, duration = 0.02, 0.6
    with GpuSampler(backend, period) as sampler:
        time.sleep(duration)
    frame = sampler.frame()
    assert list(frame.columns) == list(COLUMNS)
    assert dict(frame.dtypes.astype(str)) == COLUMNS
    for index in (0, 1):
        t = frame.loc[frame.gpu_index == index, "t_ns"].to_numpy()
        gaps = np.diff(t) / 1e9
        # Absolute deadlines: the median gap is the period even on a loaded 2-core machine.
        assert abs(float(np.median(gaps)) - period) < 0.25 * period
        assert 0.6 * duration / period <= len(t) <= duration / period + 2
    # Deadlines do not drift: the span of n ticks is (n - 1) periods, give or take one.
    t0 = frame.loc[frame.gpu_index == 0, "t_ns"].to_numpy()
    assert abs((t0[-1] - t0[0]) / 1e9 - (len(t0) - 1 + sampler.missed) * period) < 2 * period
    assert sampler.failed_reads == 0 and not backend.closed


def test_stop_joins_and_leaks_no_thread():
    before = set(threading.enumerate())
    backend = FakeNvmlBackend([FakeDevice()])
    sampler = GpuSampler(backend, 0.01, owns_backend=True).start()
    assert sampler.running and len(_sampler_threads()) == 1
    time.sleep(0.05)
    sampler.stop()
    assert not sampler.running
    assert set(threading.enumerate()) <= before
    assert backend.closed  # owns_backend: stop() closes it
    n = sampler.n_samples
    time.sleep(0.03)
    assert sampler.n_samples == n  # nothing sampled after stop
    sampler.stop()  # idempotent
    with pytest.raises(RuntimeError):
        sampler.start()


def test_context_manager_stops_on_error_and_stop_is_prompt():
    before = set(threading.enumerate())
    with pytest.raises(KeyError), GpuSampler(FakeNvmlBackend([FakeDevice()]), 5.0):
        raise KeyError("boom")  # a 5 s period must not make stop() wait 5 s
    assert set(threading.enumerate()) <= before
    t0 = time.monotonic()
    with GpuSampler(FakeNvmlBackend([FakeDevice()]), 5.0) as s:
        pass
    # Under half the 5 s period: stop() did not wait a period out (a relation to the period,
    # with room for a busy 2-core machine, not a speed figure).
    assert time.monotonic() - t0 < 2.5 and s.ticks == 1


def test_period_below_minimum_is_refused():
    for bad in (0.005, 0.0, -1.0, math.nan):
        with pytest.raises(ConfigError, match="minimum"):
            GpuSampler(FakeNvmlBackend([FakeDevice()]), bad)


# -- timing with an injected clock: exact ----------------------------------------------------


class FakeClock:
    """Monotonic ns; a read costs ``read_ns``; wait(s) advances by s; stops after ``ticks``."""

    def __init__(self, ticks: int) -> None:
        self.now = 1_000_000_000
        self.ticks = ticks
        self.waits: list[float] = []

    def clock(self) -> int:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += round(seconds * 1e9)
        return len(self.waits) >= self.ticks


def test_absolute_deadlines_and_missed_ticks_with_an_injected_clock():
    fc = FakeClock(ticks=5)
    delays = iter([3, 3, 3, 250, 3, 3, 3, 3])  # ms per read: the 4th overruns 2.5 periods

    class Slow(FakeNvmlBackend):
        def read(self, index: int) -> Any:
            fc.now += next(delays) * 1_000_000
            return super().read(index)

    sampler = GpuSampler(
        Slow([FakeDevice()], clock=lambda: fc.now / 1e9),
        0.1,
        clock=fc.clock,
        wall_clock=lambda: 5_000_000_000,
        wait=fc.wait,
    )
    sampler.start()
    sampler._thread.join(2)  # the injected wait ends the loop after 5 ticks
    sampler.stop()
    t = sampler.frame()["t_ns"].to_numpy() - 5_000_000_000
    # Every tick starts on the 100 ms grid (the wall anchor plus monotonic offsets) ...
    assert list(t) == [0, 100_000_000, 200_000_000, 300_000_000, 600_000_000]
    # ... the sleeps absorb the read time, and the overrun skips ticks 4 and 5 instead of
    # bunching them up.
    assert fc.waits[:3] == pytest.approx([0.097, 0.097, 0.097])
    assert fc.waits[3] == pytest.approx(0.05)
    assert sampler.missed == 2


def test_failed_reads_are_counted_and_sampling_goes_on():
    fc = FakeClock(ticks=6)
    backend = FakeNvmlBackend(
        [FakeDevice(), FakeDevice(fail_at=(0.15,))], clock=lambda: fc.now / 1e9
    )
    sampler = GpuSampler(backend, 0.1, clock=fc.clock, wait=fc.wait).start()
    sampler._thread.join(2)
    sampler.stop()
    assert sampler.failed_reads == 1 and "GPU 1" in (sampler.error or "")
    frame = sampler.frame()
    assert (frame.gpu_index == 0).sum() == 6 and (frame.gpu_index == 1).sum() == 5


# -- the fake backend ------------------------------------------------------------------------


def test_scripts_constant_steps_and_functions():
    assert value_at(3.0, 10.0) == 3.0
    assert value_at(lambda t: 2 * t, 1.5) == 3.0
    steps = [(0.0, 1.0), (2.0, 5.0)]
    assert value_at(steps, 1.99) == 1.0 and value_at(steps, 2.0) == 5.0
    assert math.isnan(value_at([(1.0, 1.0)], 0.5))
    now = [0.0]
    backend = FakeNvmlBackend(
        [FakeDevice(mem_used=steps, util_gpu=lambda t: 10 * t)], clock=lambda: now[0]
    )
    now[0] = 2.5
    r = backend.read(0)
    assert r.mem_used_bytes == 5.0 and r.util_gpu_pct == 25.0 and r.mem_total_bytes == 80 * GiB
    assert math.isnan(r.nvlink_rx_bytes_per_s) and backend.reads == [1]


# -- the real backend --------------------------------------------------------------------------


def test_real_backend_without_driver_is_a_clear_nvml_unavailable():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - a machine with a GPU
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlUnavailable) as info:
        PynvmlBackend()
    message = str(info.value)
    assert "no NVIDIA driver/NVML library found" in message
    assert "nvmlInit" in message and "NVML Shared Library Not Found" in message
    assert "\n" not in message


class _NVMLError(Exception):
    pass


def _fake_pynvml(**overrides: Any) -> SimpleNamespace:
    """Just enough of pynvml's surface: one H100-ish GPU without utilisation counters."""

    def unsupported(*args: Any) -> Any:
        raise _NVMLError("Not Supported")

    module = SimpleNamespace(
        NVMLError=_NVMLError,
        NVML_CLOCK_SM=1,
        NVML_CLOCK_MEM=2,
        NVML_TEMPERATURE_GPU=0,
        NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1,
        nvmlMemory_v2=33554472,
        NVML_FI_DEV_PCIE_COUNT_RX_BYTES=1,
        NVML_FI_DEV_PCIE_COUNT_TX_BYTES=2,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX=3,
        NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX=4,
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: None,
        nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lambda i: f"h{i}",
        nvmlDeviceGetName=lambda h: b"NVIDIA H100 80GB HBM3",
        nvmlDeviceGetMemoryInfo=lambda h, v=None: SimpleNamespace(
            used=10 * GiB, total=80 * GiB, reserved=0.5 * GiB, free=69.5 * GiB
        ),
        nvmlDeviceGetUtilizationRates=unsupported,
        nvmlDeviceGetPowerUsage=lambda h: 250_000,
        nvmlDeviceGetClockInfo=lambda h, which: 1980 if which == 1 else 2619,
        nvmlDeviceGetTemperature=lambda h, which: 41,
        nvmlDeviceGetFieldValues=unsupported,
        nvmlDeviceGetPcieThroughput=lambda h, which: 1000 if which == 1 else 2000,
    )
    for k, v in overrides.items():
        setattr(module, k, v)
    return module


def test_pynvml_backend_maps_units_and_unsupported_fields():
    backend = PynvmlBackend(_fake_pynvml())
    assert backend.device_count() == 1 and backend.device_name(0) == "NVIDIA H100 80GB HBM3"
    r = backend.read(0)
    assert r.mem_used_bytes == 10 * GiB and r.mem_reserved_bytes == 0.5 * GiB
    assert math.isnan(r.util_gpu_pct) and math.isnan(r.util_mem_pct)  # not supported: NaN
    assert r.power_w == 250.0 and r.sm_clock_mhz == 1980 and r.temperature_c == 41
    assert r.pcie_rx_bytes_per_s == 1000 * 1024 and r.pcie_tx_bytes_per_s == 2000 * 1024
    assert math.isnan(r.nvlink_rx_bytes_per_s)
    backend.close()


def test_pynvml_backend_counter_rates():
    stamps = iter([(1_000_000, 100, 10), (1_100_000, 100 + 10_000_000, 10 + 1000)])

    def fields(h: Any, ids: Any) -> list[Any]:
        ts, pcie, nvl = next(stamps)

        def v(value: int) -> Any:
            return SimpleNamespace(nvmlReturn=0, timestamp=ts, value=SimpleNamespace(ullVal=value))

        return [v(pcie), v(pcie // 2), v(nvl), v(nvl)]

    backend = PynvmlBackend(_fake_pynvml(nvmlDeviceGetFieldValues=fields))
    assert math.isnan(backend.read(0).pcie_rx_bytes_per_s)  # first reading: no rate yet
    r = backend.read(0)
    assert r.pcie_rx_bytes_per_s == pytest.approx(10_000_000 / 0.1)
    assert r.nvlink_rx_bytes_per_s == pytest.approx(1000 * 1024 / 0.1)  # KiB counters


def test_pynvml_init_failure_and_missing_package_are_nvml_unavailable():
    def no_driver() -> None:
        raise _NVMLError("Driver Not Loaded")

    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded.*no NVIDIA driver"):
        PynvmlBackend(_fake_pynvml(nvmlInit=no_driver))


# -- frames ------------------------------------------------------------------------------------


def test_conform_validates_and_orders_columns():
    import pandas as pd

    frame = conform(
        pd.DataFrame({"gpu_index": [0], "t_ns": [5], "power_w": ["12.5"], "host": ["n1"]})
    )
    assert list(frame.columns) == [*COLUMNS, "host"]
    assert frame.power_w[0] == 12.5 and math.isnan(frame.mem_used_bytes[0])
    with pytest.raises(ConfigError, match="t_ns"):
        conform(pd.DataFrame({"gpu_index": [0]}))
    with pytest.raises(ConfigError, match="missing values"):
        conform(pd.DataFrame({"gpu_index": [0, None], "t_ns": [1, 2]}))
    assert list(empty_frame().columns) == list(COLUMNS) and empty_frame().empty


# -- gpu watch ---------------------------------------------------------------------------------


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cmd_gpu.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def _consoles() -> tuple[Console, Console]:
    return (Console(file=io.StringIO(), width=200), Console(file=io.StringIO(), width=200))


def test_gpu_watch_fake_json():
    out, err = _consoles()
    before = set(threading.enumerate())
    code = cmd_gpu.run(
        _parse(
            "gpu",
            "watch",
            "--fake",
            "--fake-gpus",
            "3",
            "--duration",
            "0.3",
            "--period",
            "0.05",
            "--json",
        ),
        out,
        err,
    )
    assert code == 0
    doc = json.loads(out.file.getvalue())
    assert doc["backend"] == "fake" and len(doc["gpus"]) == 3
    assert {s["gpu_index"] for s in doc["samples"]} == {0, 1, 2}
    assert len(doc["summary"]) == 3 and doc["columns"] == COLUMNS
    assert set(threading.enumerate()) <= before


def test_gpu_watch_fake_table():
    out, err = _consoles()
    assert cmd_gpu.run(_parse("gpu", "watch", "--fake", "--duration", "0.2"), out, err) == 0
    assert "Fake NVIDIA H100" in out.file.getvalue()


def test_gpu_watch_without_driver_raises_nvml_unavailable():
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    out, err = _consoles()
    with pytest.raises(NvmlUnavailable, match="no NVIDIA driver/NVML library found"):
        cmd_gpu.run(_parse("gpu", "watch", "--duration", "0.1"), out, err)
    assert out.file.getvalue() == ""
    with pytest.raises(ConfigError, match="minimum"):
        cmd_gpu.run(_parse("gpu", "watch", "--fake", "--period", "0.001"), out, err)


def test_open_sampler_goes_on_without_nvml():
    sampler, reason = open_sampler(0.05, FakeNvmlBackend(demo_devices(1)))
    assert sampler is not None and reason is None
    with sampler:
        time.sleep(0.06)
    assert sampler.device_names() == ["Fake NVIDIA H100 80GB HBM3 #0"]
    assert len(sampler.frame()) >= 1
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        sampler, reason = open_sampler()
        assert sampler is None and "no NVIDIA driver/NVML library found" in (reason or "")
    else:  # pragma: no cover
        pynvml.nvmlShutdown()
