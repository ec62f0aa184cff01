"""What every page gets: the store, its cache key, the experiment list and the selection."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from phaseprobe.present.dashboard import data
from phaseprobe.records import Experiment, Run

__all__ = ["Context"]


@dataclass(frozen=True)
class Context:
    path: str
    key: tuple[float, ...]
    experiments: pd.DataFrame
    experiment_id: int

    def experiment(self) -> Experiment:
        return data.experiment(self.path, self.experiment_id, self.key)

    def runs(self) -> list[Run]:
        return data.runs(self.path, self.experiment_id, self.key)

    def gpu_samples(self) -> pd.DataFrame:
        return data.gpu_samples(self.path, self.experiment_id, self.key)
