"""GPU samples in the store (the NVML sampler's, or imported), joined to runs by wall-clock
time. pandas is imported only inside these methods: ``import phaseprobe`` stays light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phaseprobe.store.db import Db, reads

if TYPE_CHECKING:  # pandas only inside the GPU methods: `import phaseprobe` stays light
    import pandas as pd


# The gpu_samples columns, in table order (phaseprobe.sources.gpu.nvml.COLUMNS; a test keeps the
# two equal).
GPU_SAMPLE_COLUMNS = (
    "t_ns",
    "gpu_index",
    "mem_used_bytes",
    "mem_total_bytes",
    "mem_reserved_bytes",
    "util_gpu_pct",
    "util_mem_pct",
    "power_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "pcie_rx_bytes_per_s",
    "pcie_tx_bytes_per_s",
    "nvlink_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
)


class GpuStore(Db):
    """GPU samples per experiment, stored and read as a frame of :data:`GPU_SAMPLE_COLUMNS`."""

    def add_gpu_samples(self, experiment_id: int, samples: pd.DataFrame) -> int:
        """Store GPU samples (a frame with :data:`phaseprobe.sources.gpu.nvml.COLUMNS`; other
        columns are not stored) in one transaction; returns the number of rows. NaN is NULL."""
        from phaseprobe.sources.gpu.nvml import conform

        frame = conform(samples, source="GPU samples to store")
        if frame.empty:
            return 0
        table = frame[list(GPU_SAMPLE_COLUMNS)].astype(object)
        rows = [
            (experiment_id, *row)
            for row in table.where(table.notna(), None).itertuples(index=False, name=None)
        ]
        sql = (
            f"INSERT INTO gpu_samples (experiment_id, {', '.join(GPU_SAMPLE_COLUMNS)})"
            f" VALUES ({', '.join('?' * (len(GPU_SAMPLE_COLUMNS) + 1))})"
        )
        with self._transaction():
            self._db.executemany(sql, rows)
        return len(rows)

    @reads
    def gpu_samples(self, experiment_id: int) -> pd.DataFrame:
        """The experiment's GPU samples ordered by time then GPU (an empty frame when none)."""
        import pandas as pd

        from phaseprobe.sources.gpu.nvml import conform

        rows = (
            self._db.execute(
                f"SELECT {', '.join(GPU_SAMPLE_COLUMNS)} FROM gpu_samples WHERE experiment_id = ?"
                " ORDER BY t_ns, gpu_index",
                (experiment_id,),
            ).fetchall()
            if self._has("gpu_samples")
            else []
        )
        frame = pd.DataFrame.from_records(
            [tuple(r) for r in rows], columns=list(GPU_SAMPLE_COLUMNS)
        )
        return conform(frame, source=f"{self.path} gpu_samples")
