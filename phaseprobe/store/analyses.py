"""File analyses kept in the store (NCCL logs, torch traces, nsys exports, with ``--keep`` or
by ``probe --torch-profile``): the summary document, not the file, optionally attached to the
experiment it explains, so the dashboard shows it without the file at hand.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from phaseprobe.errors import StoreError
from phaseprobe.store.db import reads
from phaseprobe.store.experiments import ExperimentStore


class AnalysisStore(ExperimentStore):
    """Kept analyses. One attached to an experiment checks that the experiment exists first
    (a typed error naming it), hence an ``ExperimentStore``."""

    def add_analysis(
        self, kind: str, source: str, doc: Mapping[str, Any], experiment_id: int | None = None
    ) -> int:
        """Keep a file's summary (``kind``: nccl, trace, nsys), attached to an experiment or
        not; the experiment must exist."""
        if experiment_id is not None:
            self.experiment(experiment_id)  # a typed error naming the missing experiment
        cur = self._write(
            "INSERT INTO analyses (experiment_id, kind, source, created_wall_ns, doc_json)"
            " VALUES (?, ?, ?, ?, ?)",
            (experiment_id, kind, source, time.time_ns(), json.dumps(doc)),
        )
        return int(cur.lastrowid or 0)

    @reads
    def analyses(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Kept analyses (without their documents), oldest first, optionally of one kind."""
        if not self._has("analyses"):
            return []
        sql = "SELECT id, experiment_id, kind, source, created_wall_ns FROM analyses"
        rows = self._db.execute(
            sql + (" WHERE kind = ? ORDER BY id" if kind else " ORDER BY id"),
            (kind,) if kind else (),
        ).fetchall()
        return [dict(row) for row in rows]

    @reads
    def analysis(self, analysis_id: int) -> dict[str, Any]:
        """One kept analysis's summary document."""
        row = (
            self._db.execute(
                "SELECT doc_json FROM analyses WHERE id = ?", (analysis_id,)
            ).fetchone()
            if self._has("analyses")
            else None
        )
        if row is None:
            raise StoreError(f"no analysis {analysis_id} in {self.path}")
        doc: dict[str, Any] = json.loads(row["doc_json"])
        return doc
