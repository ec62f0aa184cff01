"""The embedded experiment store: one SQLite file (WAL), one transaction per completed run.

A run is committed before the next one starts, so a crash or Ctrl-C loses at most the run in
flight. Scalar columns (``client_ttft_s``, ``server_decode_s``, …) are there for SQL and
dashboards; the ``*_json`` columns keep the full record (every token arrival time).
The schema version lives in ``PRAGMA user_version`` and migrates forward in :data:`_MIGRATIONS`.
Nothing secret is stored: run specs carry no API key, and URLs lose any ``user:pass@``.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from phaseprobe.errors import StoreError
from phaseprobe.records import (
    ClientCheck,
    ClientTimeline,
    Experiment,
    Isolation,
    RequestSpan,
    Run,
    RunSpec,
    ServerPhases,
)

if TYPE_CHECKING:  # pandas only inside the GPU methods: `import phaseprobe` stays light
    import pandas as pd

__all__ = ["Store", "redact_url", "SCHEMA_VERSION", "GPU_SAMPLE_COLUMNS"]

_MIGRATIONS: list[str] = [
    # 1: experiments and runs
    """
    CREATE TABLE experiments (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        created_wall_ns INTEGER NOT NULL,
        finished_wall_ns INTEGER,
        endpoint TEXT NOT NULL,
        model TEXT NOT NULL,
        spec_json TEXT NOT NULL,
        server_json TEXT NOT NULL,
        notes_json TEXT NOT NULL DEFAULT '[]'
    );
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY,
        experiment_id INTEGER NOT NULL REFERENCES experiments(id),
        seq INTEGER NOT NULL,
        status TEXT NOT NULL,
        isolated INTEGER NOT NULL,
        error TEXT,
        prompt TEXT NOT NULL,
        sent_wall_ns INTEGER,
        client_ttft_s REAL, client_e2e_s REAL, client_tpot_s REAL,
        server_queue_s REAL, server_prefill_s REAL, server_decode_s REAL,
        server_inference_s REAL, server_ttft_s REAL, server_e2e_s REAL,
        prompt_tokens INTEGER, completion_tokens INTEGER,
        client_json TEXT, server_json TEXT, isolation_json TEXT NOT NULL,
        UNIQUE (experiment_id, seq)
    );
    CREATE INDEX runs_by_experiment ON runs(experiment_id, seq);
    """,
    # 2: GPU samples (NVML sampler or imports), joined to runs by wall-clock t_ns. Written out
    # literally: a migration must not change when the sample columns later grow.
    """
    CREATE TABLE gpu_samples (
        experiment_id INTEGER NOT NULL REFERENCES experiments(id),
        t_ns INTEGER NOT NULL,
        gpu_index INTEGER NOT NULL,
        mem_used_bytes REAL, mem_total_bytes REAL, mem_reserved_bytes REAL,
        util_gpu_pct REAL, util_mem_pct REAL, power_w REAL,
        sm_clock_mhz REAL, mem_clock_mhz REAL, temperature_c REAL,
        pcie_rx_bytes_per_s REAL, pcie_tx_bytes_per_s REAL,
        nvlink_rx_bytes_per_s REAL, nvlink_tx_bytes_per_s REAL
    );
    CREATE INDEX gpu_samples_by_experiment ON gpu_samples(experiment_id, t_ns);
    """,
    # 3: A/B sessions. The playbook text itself is kept, so `ab --resume` replays the session
    # as it was defined even if the file changed since; arms_json maps arm name -> experiment.
    """
    CREATE TABLE ab_sessions (
        id INTEGER PRIMARY KEY,
        name TEXT NOT NULL,
        created_wall_ns INTEGER NOT NULL,
        finished_wall_ns INTEGER,
        playbook_path TEXT NOT NULL,
        playbook_text TEXT NOT NULL,
        settings_json TEXT NOT NULL,
        arms_json TEXT NOT NULL DEFAULT '{}'
    );
    """,
    # 4: file analyses kept with `--keep` (NCCL logs, torch traces, nsys exports) or by
    # `probe --torch-profile`: the summary document, not the file, optionally attached to the
    # experiment it explains, so the dashboard can show it without the file at hand.
    """
    CREATE TABLE analyses (
        id INTEGER PRIMARY KEY,
        experiment_id INTEGER REFERENCES experiments(id),
        kind TEXT NOT NULL,
        source TEXT NOT NULL,
        created_wall_ns INTEGER NOT NULL,
        doc_json TEXT NOT NULL
    );
    CREATE INDEX analyses_by_experiment ON analyses(experiment_id, kind);
    """,
    # 5: the client/server consistency verdict per run (phaseprobe.analysis.client_check).
    # NULL for runs stored before it existed: readers judge those when they read them.
    """
    ALTER TABLE runs ADD COLUMN client_check_json TEXT;
    """,
    # 6: vLLM's request spans (OpenTelemetry, phaseprobe.sources.otlp_spans), one row per
    # request; (start_ns, span_id) is unique so an exporter's retry of a batch stores nothing
    # twice. It is the table's only index, and deliberately not on the random trace id: spans
    # arrive in start order, so this index grows at its end (100k rows/s, flat), where a
    # random-key index slowed commits 3x by 100k rows; it also serves time-range reads.
    # attributes_json holds the attributes no column holds (sampling parameters, anything
    # newer). span_counts keeps what was not a vLLM request (kind "other": service and span
    # name) or could not be used (kind "rejected": the reason). Runs remember the trace id and
    # request id they were sent with, and their span once it arrived.
    """
    CREATE TABLE IF NOT EXISTS request_spans (
        id INTEGER PRIMARY KEY,
        trace_id TEXT NOT NULL,
        span_id TEXT NOT NULL,
        parent_span_id TEXT,
        request_id TEXT,
        model TEXT,
        service TEXT,
        instance TEXT,
        start_ns INTEGER NOT NULL,
        end_ns INTEGER NOT NULL,
        queue_s REAL, prefill_s REAL, decode_s REAL, inference_s REAL, ttft_s REAL, e2e_s REAL,
        prompt_tokens INTEGER, completion_tokens INTEGER, max_tokens INTEGER,
        attributes_json TEXT NOT NULL DEFAULT '{}',
        received_wall_ns INTEGER NOT NULL,
        UNIQUE (start_ns, span_id)
    );
    CREATE TABLE IF NOT EXISTS span_counts (
        kind TEXT NOT NULL,
        service TEXT NOT NULL,
        name TEXT NOT NULL,
        count INTEGER NOT NULL,
        last_wall_ns INTEGER NOT NULL,
        PRIMARY KEY (kind, service, name)
    );
    ALTER TABLE runs ADD COLUMN trace_id TEXT;
    ALTER TABLE runs ADD COLUMN request_id TEXT;
    ALTER TABLE runs ADD COLUMN span_json TEXT
    """,
]
# The gpu_samples columns, in table order (phaseprobe.sources.nvml.COLUMNS; a test keeps the
# two equal).
GPU_SAMPLE_COLUMNS = (
    "t_ns", "gpu_index", "mem_used_bytes", "mem_total_bytes", "mem_reserved_bytes",
    "util_gpu_pct", "util_mem_pct", "power_w", "sm_clock_mhz", "mem_clock_mhz", "temperature_c",
    "pcie_rx_bytes_per_s", "pcie_tx_bytes_per_s", "nvlink_rx_bytes_per_s",
    "nvlink_tx_bytes_per_s",
)
SCHEMA_VERSION = len(_MIGRATIONS)


def redact_url(url: str) -> str:
    """Drop ``user:password@`` from a URL so credentials never reach the store or output."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


class Store:
    """Open (creating and migrating as needed) the store at ``path``.

    ``threaded``: the connection may be used from several threads (the span receiver's
    handlers); the caller serialises the calls (one lock), as SQLite needs."""

    def __init__(self, path: str | Path, *, threaded: bool = False) -> None:
        self.path = Path(path)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # isolation_level=None: we open transactions ourselves, one per run.
            self._db = sqlite3.connect(self.path, isolation_level=None, timeout=10.0,
                                       check_same_thread=not threaded)
            self._db.row_factory = sqlite3.Row
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"cannot open experiment store {self.path}: {exc}") from None

    def _migrate(self) -> None:
        version = self._db.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise StoreError(f"{self.path} has schema version {version}; this phaseprobe knows "
                             f"up to {SCHEMA_VERSION}: upgrade phaseprobe")
        for target in range(version + 1, SCHEMA_VERSION + 1):
            self._db.execute("BEGIN IMMEDIATE")
            for statement in _MIGRATIONS[target - 1].split(";"):
                if statement.strip() and not self._column_exists(statement):
                    self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {target}")
            self._db.execute("COMMIT")

    def _column_exists(self, statement: str) -> bool:
        """True for an ``ALTER TABLE t ADD COLUMN c`` whose column is already there (a store
        rebuilt from a newer schema's tables): adding it again would fail."""
        words = statement.split()
        if [w.upper() for w in words[:2]] != ["ALTER", "TABLE"] or len(words) < 6 \
                or [w.upper() for w in words[3:5]] != ["ADD", "COLUMN"]:
            return False
        cols = {row[1] for row in self._db.execute(f"PRAGMA table_info({words[2]})")}
        return words[5] in cols

    # -- writing -------------------------------------------------------------------------

    def create_experiment(self, exp: Experiment) -> int:
        spec = exp.spec.to_dict()
        spec["endpoint"] = redact_url(spec["endpoint"])
        cur = self._write(
            "INSERT INTO experiments (name, kind, created_wall_ns, endpoint, model, spec_json,"
            " server_json, notes_json) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (exp.name, exp.kind, exp.created_wall_ns, spec["endpoint"], exp.spec.model,
             json.dumps(spec), json.dumps(exp.server_info), json.dumps(list(exp.notes))),
        )
        return int(cur.lastrowid or 0)

    def add_run(self, experiment_id: int, run: Run) -> int:
        """Commit one run durably (its own transaction) and return its id."""
        c = run.client
        s = run.server
        cur = self._write(
            "INSERT INTO runs (experiment_id, seq, status, isolated, error, prompt, sent_wall_ns,"
            " client_ttft_s, client_e2e_s, client_tpot_s, server_queue_s, server_prefill_s,"
            " server_decode_s, server_inference_s, server_ttft_s, server_e2e_s, prompt_tokens,"
            " completion_tokens, client_json, server_json, isolation_json, client_check_json,"
            " trace_id, request_id, span_json)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (experiment_id, run.seq, run.status, int(run.isolated), run.error, run.prompt,
             c.sent_wall_ns if c else None, c.ttft_s if c else None, c.e2e_s if c else None,
             c.tpot_s if c else None, s.queue_s if s else None, s.prefill_s if s else None,
             s.decode_s if s else None, s.inference_s if s else None, s.ttft_s if s else None,
             s.e2e_s if s else None, c.prompt_tokens if c else None,
             c.completion_tokens if c else None,
             json.dumps(c.to_dict()) if c else None, json.dumps(s.to_dict()) if s else None,
             json.dumps(run.isolation.to_dict()),
             json.dumps(run.client_check.to_dict()) if run.client_check else None,
             run.trace_id, run.request_id,
             json.dumps(run.span.to_dict()) if run.span else None),
        )
        return int(cur.lastrowid or 0)

    def set_run_span(self, run_id: int, span: RequestSpan, server: ServerPhases | None,
                     status: str, client_check: ClientCheck | None) -> None:
        """Attach a run's own span once it arrived (spans come seconds after the request); the
        run's server phases become the span's when the histogram deltas were not its own."""
        self._write(
            "UPDATE runs SET span_json = ?, server_json = ?, status = ?, client_check_json = ?,"
            " server_queue_s = ?, server_prefill_s = ?, server_decode_s = ?,"
            " server_inference_s = ?, server_ttft_s = ?, server_e2e_s = ? WHERE id = ?",
            (json.dumps(span.to_dict()), json.dumps(server.to_dict()) if server else None,
             status, json.dumps(client_check.to_dict()) if client_check else None,
             *((server.queue_s, server.prefill_s, server.decode_s, server.inference_s,
                server.ttft_s, server.e2e_s) if server else (None,) * 6), run_id))

    def add_spans(self, requests: list[RequestSpan], attributes: list[dict[str, Any]],
                  counts: dict[tuple[str, str, str], int]) -> int:
        """Commit one received batch in one transaction: the request spans (a span already
        stored, e.g. an exporter's retry, is ignored) and the (kind, service, name) counts of
        other and rejected spans. Returns how many request spans were new."""
        now = time.time_ns()
        rows = [(s.trace_id, s.span_id, s.parent_span_id, s.request_id, s.model, s.service,
                 s.instance, s.start_ns, s.end_ns, s.queue_s, s.prefill_s, s.decode_s,
                 s.inference_s, s.ttft_s, s.e2e_s, s.prompt_tokens, s.completion_tokens,
                 s.max_tokens, json.dumps(a), now) for s, a in zip(requests, attributes)]
        try:
            self._db.execute("BEGIN IMMEDIATE")
            before = self._db.total_changes
            self._db.executemany(
                "INSERT OR IGNORE INTO request_spans (trace_id, span_id, parent_span_id,"
                " request_id, model, service, instance, start_ns, end_ns, queue_s, prefill_s,"
                " decode_s, inference_s, ttft_s, e2e_s, prompt_tokens, completion_tokens,"
                " max_tokens, attributes_json, received_wall_ns)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)", rows)
            new = self._db.total_changes - before
            self._db.executemany(
                "INSERT INTO span_counts (kind, service, name, count, last_wall_ns)"
                " VALUES (?, ?, ?, ?, ?) ON CONFLICT (kind, service, name) DO UPDATE SET"
                " count = count + excluded.count, last_wall_ns = excluded.last_wall_ns",
                [(*key, n, now) for key, n in counts.items()])
            self._db.execute("COMMIT")
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            self._rollback()
            raise StoreError(f"cannot write to experiment store {self.path}: {exc}") from None
        except BaseException:
            self._rollback()  # never leave the connection inside a transaction
            raise
        return new

    def _rollback(self) -> None:
        if self._db.in_transaction:
            self._db.execute("ROLLBACK")

    def finish_experiment(self, experiment_id: int, notes: list[str] | None = None) -> None:
        if notes is None:
            self._write("UPDATE experiments SET finished_wall_ns = ? WHERE id = ?",
                        (time.time_ns(), experiment_id))
        else:
            self._write("UPDATE experiments SET finished_wall_ns = ?, notes_json = ? WHERE id = ?",
                        (time.time_ns(), json.dumps(notes), experiment_id))

    def add_gpu_samples(self, experiment_id: int, samples: pd.DataFrame) -> int:
        """Store GPU samples (a frame with :data:`phaseprobe.sources.nvml.COLUMNS`; other
        columns are not stored) in one transaction; returns the number of rows. NaN is NULL."""
        from phaseprobe.sources.nvml import conform

        frame = conform(samples, source="GPU samples to store")
        if frame.empty:
            return 0
        table = frame[list(GPU_SAMPLE_COLUMNS)].astype(object)
        rows = [(experiment_id, *row) for row in
                table.where(table.notna(), None).itertuples(index=False, name=None)]
        sql = (f"INSERT INTO gpu_samples (experiment_id, {', '.join(GPU_SAMPLE_COLUMNS)})"
               f" VALUES ({', '.join('?' * (len(GPU_SAMPLE_COLUMNS) + 1))})")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(sql, rows)
            self._db.execute("COMMIT")
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            self._rollback()
            raise StoreError(f"cannot write to experiment store {self.path}: {exc}") from None
        except BaseException:
            self._rollback()
            raise
        return len(rows)

    def create_ab_session(self, name: str, playbook_path: str, playbook_text: str,
                          settings: dict[str, Any]) -> int:
        cur = self._write(
            "INSERT INTO ab_sessions (name, created_wall_ns, playbook_path, playbook_text,"
            " settings_json) VALUES (?, ?, ?, ?, ?)",
            (name, time.time_ns(), playbook_path, playbook_text, json.dumps(settings)))
        return int(cur.lastrowid or 0)

    def set_ab_arms(self, session_id: int, arms: dict[str, int]) -> None:
        """Record arm name -> experiment id (committed before any run of the session)."""
        self._write("UPDATE ab_sessions SET arms_json = ? WHERE id = ?",
                    (json.dumps(arms), session_id))

    def update_ab_settings(self, session_id: int, changes: dict[str, Any]) -> None:
        """Merge ``changes`` into a session's settings (a sequential session's stop record)."""
        settings = self.ab_session(session_id)["settings"]
        self._write("UPDATE ab_sessions SET settings_json = ? WHERE id = ?",
                    (json.dumps({**settings, **changes}), session_id))

    def finish_ab_session(self, session_id: int) -> None:
        self._write("UPDATE ab_sessions SET finished_wall_ns = ? WHERE id = ?",
                    (time.time_ns(), session_id))

    def add_analysis(self, kind: str, source: str, doc: dict[str, Any],
                     experiment_id: int | None = None) -> int:
        """Keep a file's summary (``kind``: nccl, trace, nsys), attached to an experiment or
        not; the experiment must exist."""
        if experiment_id is not None:
            self.experiment(experiment_id)  # a typed error naming the missing experiment
        cur = self._write(
            "INSERT INTO analyses (experiment_id, kind, source, created_wall_ns, doc_json)"
            " VALUES (?, ?, ?, ?, ?)",
            (experiment_id, kind, source, time.time_ns(), json.dumps(doc)))
        return int(cur.lastrowid or 0)

    def _write(self, sql: str, params: tuple[Any, ...]) -> sqlite3.Cursor:
        try:
            self._db.execute("BEGIN IMMEDIATE")
            cur = self._db.execute(sql, params)
            self._db.execute("COMMIT")
            return cur
        except (sqlite3.Error, OverflowError, ValueError) as exc:
            self._rollback()
            raise StoreError(f"cannot write to experiment store {self.path}: {exc}") from None
        except BaseException:
            self._rollback()
            raise

    # -- reading -------------------------------------------------------------------------

    def experiments(self) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT e.id, e.name, e.kind, e.created_wall_ns, e.finished_wall_ns, e.endpoint,"
            " e.model, COUNT(r.id) AS n_runs, SUM(r.status = 'ok') AS n_ok,"
            " SUM(r.isolated) AS n_isolated FROM experiments e LEFT JOIN runs r"
            " ON r.experiment_id = e.id GROUP BY e.id ORDER BY e.id").fetchall()
        return [dict(row) for row in rows]

    def experiment(self, experiment_id: int) -> Experiment:
        row = self._db.execute("SELECT * FROM experiments WHERE id = ?",
                               (experiment_id,)).fetchone()
        if row is None:
            raise StoreError(f"no experiment {experiment_id} in {self.path}")
        spec = json.loads(row["spec_json"])
        # Specs written by other phaseprobe versions may carry fields this one lacks.
        known = {k: v for k, v in spec.items() if k in RunSpec.__dataclass_fields__}
        return Experiment(name=row["name"], kind=row["kind"], spec=RunSpec(**known),
                          server_info=json.loads(row["server_json"]),
                          created_wall_ns=row["created_wall_ns"], experiment_id=row["id"],
                          notes=tuple(json.loads(row["notes_json"])))

    def runs(self, experiment_id: int) -> list[Run]:
        rows = self._db.execute("SELECT * FROM runs WHERE experiment_id = ? ORDER BY seq",
                                (experiment_id,)).fetchall()
        return [_run_from_row(row) for row in rows]

    def gpu_samples(self, experiment_id: int) -> pd.DataFrame:
        """The experiment's GPU samples ordered by time then GPU (an empty frame when none)."""
        import pandas as pd

        from phaseprobe.sources.nvml import conform

        rows = self._db.execute(
            f"SELECT {', '.join(GPU_SAMPLE_COLUMNS)} FROM gpu_samples WHERE experiment_id = ?"
            " ORDER BY t_ns, gpu_index", (experiment_id,)).fetchall()
        frame = pd.DataFrame.from_records([tuple(r) for r in rows],
                                          columns=list(GPU_SAMPLE_COLUMNS))
        return conform(frame, source=f"{self.path} gpu_samples")

    def ab_session(self, session_id: int) -> dict[str, Any]:
        """One A/B session: its playbook text, settings and ``arms`` (name -> experiment id)."""
        row = self._db.execute("SELECT * FROM ab_sessions WHERE id = ?",
                               (session_id,)).fetchone()
        if row is None:
            raise StoreError(f"no A/B session {session_id} in {self.path}")
        return {"id": row["id"], "name": row["name"], "created_wall_ns": row["created_wall_ns"],
                "finished_wall_ns": row["finished_wall_ns"],
                "playbook_path": row["playbook_path"], "playbook_text": row["playbook_text"],
                "settings": json.loads(row["settings_json"]),
                "arms": json.loads(row["arms_json"])}

    def ab_sessions(self) -> list[dict[str, Any]]:
        """Every A/B session, oldest first, as :meth:`ab_session` gives it."""
        ids = [row[0] for row in self._db.execute("SELECT id FROM ab_sessions ORDER BY id")]
        return [self.ab_session(i) for i in ids]

    def analyses(self, kind: str | None = None) -> list[dict[str, Any]]:
        """Kept analyses (without their documents), oldest first, optionally of one kind."""
        sql = "SELECT id, experiment_id, kind, source, created_wall_ns FROM analyses"
        rows = self._db.execute(sql + (" WHERE kind = ? ORDER BY id" if kind else " ORDER BY id"),
                                (kind,) if kind else ()).fetchall()
        return [dict(row) for row in rows]

    def analysis(self, analysis_id: int) -> dict[str, Any]:
        """One kept analysis's summary document."""
        row = self._db.execute("SELECT doc_json FROM analyses WHERE id = ?",
                               (analysis_id,)).fetchone()
        if row is None:
            raise StoreError(f"no analysis {analysis_id} in {self.path}")
        doc: dict[str, Any] = json.loads(row["doc_json"])
        return doc

    def spans(self, *, since_ns: int | None = None, until_ns: int | None = None,
              received_since_ns: int | None = None, limit: int | None = None,
              newest: bool = False) -> list[RequestSpan]:
        """Stored request spans by start time (``since``/``until`` on the span's start,
        ``received_since`` on when phaseprobe received it), oldest first; ``newest`` with
        ``limit`` takes the most recent ``limit`` instead of the first."""
        where, params = _span_filter(since_ns, until_ns, received_since_ns)
        order = "DESC" if newest else "ASC"
        sql = f"SELECT * FROM request_spans{where} ORDER BY start_ns {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        rows = [_span_from_row(r) for r in self._db.execute(sql, params)]
        return rows[::-1] if newest else rows

    def spans_by_trace(self, trace_ids: list[str],
                       since_ns: int | None = None) -> dict[str, RequestSpan]:
        """The request span of each trace id that has one. ``since_ns`` (a lower bound on the
        spans' start, e.g. the first request's send time minus clock skew) turns the lookup
        into a range read of the time index; without it the table is scanned."""
        out: dict[str, RequestSpan] = {}
        for i in range(0, len(trace_ids), 500):
            chunk = trace_ids[i:i + 500]
            where = f"trace_id IN ({', '.join('?' * len(chunk))})"
            params: list[Any] = list(chunk)
            if since_ns is not None:
                where = f"start_ns >= ? AND {where}"
                params.insert(0, int(since_ns))
            for row in self._db.execute(f"SELECT * FROM request_spans WHERE {where}", params):
                out[row["trace_id"]] = _span_from_row(row)
        return out

    def span_by_request_id(self, request_id: str) -> tuple[RequestSpan, dict[str, Any]] | None:
        """The span whose vLLM request id is ``request_id`` or contains it (vLLM may prefix the
        client's X-Request-Id, e.g. ``cmpl-``), with its raw attributes; the newest wins."""
        row = self._db.execute(
            "SELECT * FROM request_spans WHERE request_id = ? OR instr(request_id, ?) > 0"
            " ORDER BY (request_id = ?) DESC, start_ns DESC LIMIT 1",
            (request_id, request_id, request_id)).fetchone()
        if row is None:
            return None
        return _span_from_row(row), json.loads(row["attributes_json"])

    def span_stats(self) -> dict[str, Any]:
        """How many request spans are stored (and over what time), and the other/rejected
        span counts."""
        row = self._db.execute("SELECT COUNT(*), MIN(start_ns), MAX(end_ns),"
                               " MAX(received_wall_ns) FROM request_spans").fetchone()
        counts = [dict(r) for r in self._db.execute(
            "SELECT kind, service, name, count FROM span_counts ORDER BY kind, count DESC")]
        return {"requests": row[0], "first_start_ns": row[1], "last_end_ns": row[2],
                "last_received_wall_ns": row[3],
                "other": [c for c in counts if c["kind"] == "other"],
                "rejected": [c for c in counts if c["kind"] == "rejected"]}

    def latest_experiment_id(self) -> int | None:
        row = self._db.execute("SELECT MAX(id) FROM experiments").fetchone()
        return row[0]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def _span_filter(since_ns: int | None, until_ns: int | None,
                 received_since_ns: int | None) -> tuple[str, tuple[int, ...]]:
    clauses, params = [], []
    for clause, value in (("start_ns >= ?", since_ns), ("start_ns <= ?", until_ns),
                          ("received_wall_ns >= ?", received_since_ns)):
        if value is not None:
            clauses.append(clause)
            params.append(int(value))
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


def _span_from_row(row: sqlite3.Row) -> RequestSpan:
    return RequestSpan(**{k: row[k] for k in RequestSpan.__dataclass_fields__})


def _run_from_row(row: sqlite3.Row) -> Run:
    client = ClientTimeline.from_dict(json.loads(row["client_json"])) if row["client_json"] \
        else None
    server = ServerPhases.from_dict(json.loads(row["server_json"])) if row["server_json"] \
        else None
    keys = row.keys()
    check = row["client_check_json"] if "client_check_json" in keys else None
    span = row["span_json"] if "span_json" in keys else None
    return Run(seq=row["seq"], status=row["status"], prompt=row["prompt"], client=client,
               server=server, isolation=Isolation.from_dict(json.loads(row["isolation_json"])),
               error=row["error"], experiment_id=row["experiment_id"], run_id=row["id"],
               client_check=ClientCheck.from_dict(json.loads(check)) if check else None,
               trace_id=row["trace_id"] if "trace_id" in keys else None,
               request_id=row["request_id"] if "request_id" in keys else None,
               span=RequestSpan.from_dict(json.loads(span)) if span else None)
