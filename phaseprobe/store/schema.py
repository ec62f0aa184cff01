"""The store's schema as the migrations that build it: :data:`MIGRATIONS` holds one SQL
script per version, applied in order by :class:`~phaseprobe.store.db.Db` when it opens a store
to write; the version a file has is its ``PRAGMA user_version``. A migration is written out
literally and never changed once released (stores made by it migrate on from it): a change
to the schema is a new migration at the end.
"""

from __future__ import annotations

__all__ = ["MIGRATIONS", "SCHEMA_VERSION"]

MIGRATIONS: list[str] = [
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
    # 6: vLLM's request spans (OpenTelemetry, phaseprobe.sources.vllm.otlp_spans), one row per
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
    # 7: the other and rejected spans already counted, so that a re-import or an exporter's
    # retry of the same batch does not count them twice. Keyed like request_spans (start time
    # first: the index grows at its end); the key is the trace and span id, or a digest of
    # the span's bytes when it has no usable ids.
    """
    CREATE TABLE IF NOT EXISTS counted_spans (
        start_ns INTEGER NOT NULL,
        key BLOB NOT NULL,
        PRIMARY KEY (start_ns, key)
    ) WITHOUT ROWID
    """,
    # 8: the replica that served each run behind a router (issue 27): its name in a column, so
    # per-replica reads need no JSON, and how it was told (span, counters, or why not).
    """
    ALTER TABLE runs ADD COLUMN replica TEXT;
    ALTER TABLE runs ADD COLUMN replica_json TEXT
    """,
    # 9: a disaggregated prefill/decode run's two legs and hand-over (issue 28)
    """
    ALTER TABLE runs ADD COLUMN pd_json TEXT
    """,
    # 10: vLLM's per-request metrics object from the response (vLLM >= 0.33, issue 32)
    """
    ALTER TABLE runs ADD COLUMN reported_json TEXT
    """,
    # 11: reasoning streams (issue 41): the time to the first answer token and the reasoning
    # and answer token counts, for SQL (client_json keeps the whole timeline). NULL for runs
    # stored before, and for runs that streamed no reasoning.
    """
    ALTER TABLE runs ADD COLUMN client_ttfa_s REAL;
    ALTER TABLE runs ADD COLUMN reasoning_tokens INTEGER;
    ALTER TABLE runs ADD COLUMN answer_tokens INTEGER
    """,
    # 12: the LoRA adapter a run asked for (issue 41): its served name for SQL, and the
    # AdapterUse record (base model, max_lora, the adapters asked for before it). NULL: the
    # base model, or a run stored before.
    """
    ALTER TABLE runs ADD COLUMN adapter TEXT;
    ALTER TABLE runs ADD COLUMN adapter_json TEXT
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)
