"""Experiments and their runs in the store. Each run is its own transaction, committed before
the next one starts; the scalar columns (``client_ttft_s``, ``server_decode_s``, …) are there
for SQL and dashboards, the ``*_json`` columns keep the full record. A URL is stored without
its ``user:pass@``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from phaseprobe.errors import StoreError
from phaseprobe.records import (
    AdapterUse,
    ClientCheck,
    ClientTimeline,
    Experiment,
    Isolation,
    PdLegs,
    ReplicaAttribution,
    RequestSpan,
    ResponseTimings,
    Run,
    RunSpec,
    ServerPhases,
)
from phaseprobe.redact import redact_url, redact_urls_in
from phaseprobe.store.db import Db, reads


class ExperimentStore(Db):
    """Experiments (a probe, an A/B arm, …) and their runs: written one run at a time, the
    span, replica or P/D legs attached once they arrive, read back as records."""

    def create_experiment(self, exp: Experiment) -> int:
        spec = exp.spec.to_dict()
        spec["endpoint"] = redact_url(spec["endpoint"])
        cur = self._write(
            "INSERT INTO experiments (name, kind, created_wall_ns, endpoint, model, spec_json,"
            " server_json, notes_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                exp.name,
                exp.kind,
                exp.created_wall_ns,
                spec["endpoint"],
                exp.spec.model,
                json.dumps(spec),
                json.dumps(exp.server_info),
                json.dumps([redact_urls_in(n) for n in exp.notes]),
            ),
        )
        return int(cur.lastrowid or 0)

    def add_run(self, experiment_id: int, run: Run) -> int:
        """Commit one run durably (its own transaction) and return its id."""
        c = run.client
        cur = self._write(
            "INSERT INTO runs (experiment_id, seq, status, isolated, error, prompt, sent_wall_ns,"
            " client_ttft_s, client_e2e_s, client_tpot_s, server_queue_s, server_prefill_s,"
            " server_decode_s, server_inference_s, server_ttft_s, server_e2e_s, prompt_tokens,"
            " completion_tokens, client_json, server_json, isolation_json, client_check_json,"
            " trace_id, request_id, span_json, replica, replica_json, pd_json, reported_json,"
            " client_ttfa_s, reasoning_tokens, answer_tokens, adapter, adapter_json)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                experiment_id,
                run.seq,
                run.status,
                int(run.isolated),
                redact_urls_in(run.error) if run.error else None,
                run.prompt,
                *((c.sent_wall_ns, c.ttft_s, c.e2e_s, c.tpot_s) if c else (None,) * 4),
                *_phase_columns(run.server),
                *((c.prompt_tokens, c.completion_tokens) if c else (None,) * 2),
                _dumps(c),
                _dumps(run.server),
                _dumps(run.isolation),
                _dumps(run.client_check),
                run.trace_id,
                run.request_id,
                _dumps(run.span),
                *_replica_columns(run.replica),
                _dumps(run.pd),
                _dumps(run.reported),
                *_reasoning_columns(c),
                run.adapter.name if run.adapter else None,
                _dumps(run.adapter),
            ),
        )
        return int(cur.lastrowid or 0)

    def set_run_pd(self, run_id: int, pd: PdLegs) -> None:
        """Record a P/D run's legs once its two spans were joined (they come after it)."""
        self._write("UPDATE runs SET pd_json = ? WHERE id = ?", (_dumps(pd), run_id))

    def set_run_replica(self, run_id: int, replica: ReplicaAttribution) -> None:
        """Record which replica served a run once it is known (its span came after it)."""
        self._write(
            "UPDATE runs SET replica = ?, replica_json = ? WHERE id = ?",
            (*_replica_columns(replica), run_id),
        )

    def set_run_span(
        self,
        run_id: int,
        span: RequestSpan,
        server: ServerPhases | None,
        status: str,
        client_check: ClientCheck | None,
    ) -> None:
        """Attach a run's own span once it arrived (spans come seconds after the request); the
        run's server phases become the span's when the histogram deltas were not its own."""
        self._write(
            "UPDATE runs SET span_json = ?, server_json = ?, status = ?, client_check_json = ?,"
            " server_queue_s = ?, server_prefill_s = ?, server_decode_s = ?,"
            " server_inference_s = ?, server_ttft_s = ?, server_e2e_s = ? WHERE id = ?",
            (
                _dumps(span),
                _dumps(server),
                status,
                _dumps(client_check),
                *_phase_columns(server),
                run_id,
            ),
        )

    def finish_experiment(self, experiment_id: int, notes: Iterable[str] | None = None) -> None:
        """Mark it finished; ``notes`` (when given: a list, a
        :class:`~phaseprobe.notes.Notes`) replace its notes, stored as a JSON list."""
        notes_json = None if notes is None else json.dumps([redact_urls_in(n) for n in notes])
        self._write(
            "UPDATE experiments SET finished_wall_ns = ?,"
            " notes_json = COALESCE(?, notes_json) WHERE id = ?",
            (time.time_ns(), notes_json, experiment_id),
        )

    @reads
    def experiments(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT e.id, e.name, e.kind, e.created_wall_ns, e.finished_wall_ns, e.endpoint,"
            " e.model, COUNT(r.id) AS n_runs, SUM(r.status = 'ok') AS n_ok,"
            " SUM(r.isolated) AS n_isolated FROM experiments e LEFT JOIN runs r"
            " ON r.experiment_id = e.id GROUP BY e.id ORDER BY e.id"
        ).fetchall()
        return [dict(row) for row in rows]

    @reads
    def experiment(self, experiment_id: int) -> Experiment:
        row = self._db.execute(
            "SELECT * FROM experiments WHERE id = ?", (experiment_id,)
        ).fetchone()
        if row is None:
            raise StoreError(f"no experiment {experiment_id} in {self.path}")
        spec = json.loads(row["spec_json"])
        # Specs written by other phaseprobe versions may carry fields this one lacks.
        known = {k: v for k, v in spec.items() if k in RunSpec.__dataclass_fields__}
        return Experiment(
            name=row["name"],
            kind=row["kind"],
            spec=RunSpec(**known),
            server_info=json.loads(row["server_json"]),
            created_wall_ns=row["created_wall_ns"],
            experiment_id=row["id"],
            notes=tuple(json.loads(row["notes_json"])),
        )

    @reads
    def runs(self, experiment_id: int) -> list[Run]:
        rows = self._db.execute(
            "SELECT * FROM runs WHERE experiment_id = ? ORDER BY seq", (experiment_id,)
        ).fetchall()
        return [_run_from_row(row) for row in rows]

    @reads
    def latest_experiment_id(self) -> int | None:
        row = self._db.execute("SELECT MAX(id) FROM experiments").fetchone()
        return row[0]


def _dumps(record: Any) -> str | None:
    """A record's JSON column (None stays NULL)."""
    return None if record is None else json.dumps(record.to_dict())


def _phase_columns(s: ServerPhases | None) -> tuple[float | None, ...]:
    """The server_queue_s … server_e2e_s columns of a run."""
    if s is None:
        return (None,) * 6
    return (s.queue_s, s.prefill_s, s.decode_s, s.inference_s, s.ttft_s, s.e2e_s)


def _reasoning_columns(c: ClientTimeline | None) -> tuple[float | None, int | None, int | None]:
    """client_ttfa_s, reasoning_tokens, answer_tokens of a run that streamed reasoning."""
    if c is None or not c.reasoned:
        return None, None, None
    return c.ttfa_s, c.reasoning_tokens, c.answer_tokens


def _replica_columns(r: ReplicaAttribution | None) -> tuple[str | None, str | None]:
    """The replica and replica_json columns of a run (a replica URL without credentials)."""
    if r is None:
        return None, None
    if r.url:
        r = replace(r, url=redact_url(r.url))
    return r.name, _dumps(r)


def _run_from_row(row: sqlite3.Row) -> Run:
    client = (
        ClientTimeline.from_dict(json.loads(row["client_json"])) if row["client_json"] else None
    )
    server = ServerPhases.from_dict(json.loads(row["server_json"])) if row["server_json"] else None
    keys = row.keys()
    check = row["client_check_json"] if "client_check_json" in keys else None
    span = row["span_json"] if "span_json" in keys else None
    replica = row["replica_json"] if "replica_json" in keys else None
    pd = row["pd_json"] if "pd_json" in keys else None
    reported = row["reported_json"] if "reported_json" in keys else None
    adapter = row["adapter_json"] if "adapter_json" in keys else None
    return Run(
        seq=row["seq"],
        status=row["status"],
        prompt=row["prompt"],
        client=client,
        server=server,
        isolation=Isolation.from_dict(json.loads(row["isolation_json"])),
        error=row["error"],
        experiment_id=row["experiment_id"],
        run_id=row["id"],
        client_check=ClientCheck.from_dict(json.loads(check)) if check else None,
        trace_id=row["trace_id"] if "trace_id" in keys else None,
        request_id=row["request_id"] if "request_id" in keys else None,
        span=RequestSpan.from_dict(json.loads(span)) if span else None,
        replica=ReplicaAttribution.from_dict(json.loads(replica)) if replica else None,
        pd=PdLegs.from_dict(json.loads(pd)) if pd else None,
        reported=ResponseTimings.from_dict(json.loads(reported)) if reported else None,
        adapter=AdapterUse.from_dict(json.loads(adapter)) if adapter else None,
    )
