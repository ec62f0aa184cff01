"""Every dashboard page rendered by Streamlit's AppTest on a store filled here: runs with
server phases, a client-only run, a failed run, fake GPU series, an experiment with no runs,
and an empty / missing store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from phaseprobe.records import ClientTimeline, Experiment, Isolation, Run, RunSpec, ServerPhases
from phaseprobe.sources.gpu.nvml import COLUMNS
from phaseprobe.store import Store
from tests.dashboard_apptest import count_charts, goto, open_app, page_text

T0 = 1_700_000_000_000_000_000
GiB = 2**30


def _run(seq: int, *, server: bool = True, status: str = "ok", slow: float = 1.0) -> Run:
    sent = T0 + seq * 2_000_000_000
    ttft_ns = 40_000_000 + seq * 1_000_000
    events = tuple(
        ttft_ns + int(slow * (i * 10_000_000 + (5_000_000 if i == 7 else 0))) + seq * 1000
        for i in range(16)
    )
    client = ClientTimeline(
        sent_wall_ns=sent,
        event_offsets_ns=events,
        end_offset_ns=events[-1] + 1_000_000,
        http_status=200,
        prompt_tokens=32,
        completion_tokens=16,
        finish_reason="length",
        complete=True,
    )
    phases = (
        ServerPhases(
            queue_s=0.001,
            prefill_s=0.030,
            decode_s=0.150 * slow + seq * 1e-4,
            inference_s=0.180,
            ttft_s=0.035,
            e2e_s=0.185,
            count_deltas={},
            counter_deltas={},
        )
        if server
        else None
    )
    iso = Isolation(verified=server, isolated=server)
    return Run(
        seq=seq,
        status=status,
        prompt=f"p{seq}",
        client=client,
        server=phases,  # type: ignore[arg-type]
        isolation=iso,
    )


def _gpu_frame() -> pd.DataFrame:
    rows = []
    for k in range(80):  # 8 s at 0.1 s: load, reserve KV, then flat during the runs
        t = T0 - 2_000_000_000 + k * 100_000_000
        for gpu in (0, 1):
            mem = min(k, 20) / 20 * 72 * GiB
            rows.append(
                {
                    "t_ns": t,
                    "gpu_index": gpu,
                    "mem_used_bytes": mem,
                    "mem_total_bytes": 80 * GiB,
                    "util_gpu_pct": 90.0 if k > 20 else 0.0,
                    "power_w": 300.0 + k,
                    "sm_clock_mhz": 1980.0,
                }
            )
    frame = pd.DataFrame(rows)
    for col in COLUMNS:
        if col not in frame:
            frame[col] = np.nan
    return frame[list(COLUMNS)]


def _experiment(store: Store, name: str, **labels: str) -> int:
    spec = RunSpec(
        endpoint="http://127.0.0.1:8000",
        model="tiny",
        prompt="hi",
        max_tokens=16,
        labels=dict(labels),
    )
    return store.create_experiment(
        Experiment(name=name, kind="probe", spec=spec, server_info={}, created_wall_ns=T0)
    )


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("dash") / "store.db"
    with Store(path) as store:
        first = _experiment(store, "baseline", gpu="a100")
        for seq in range(3):
            store.add_run(first, _run(seq))
        store.add_gpu_samples(first, _gpu_frame())
        store.finish_experiment(first)
        empty = _experiment(store, "nothing-ran")
        store.finish_experiment(empty)
        mixed = _experiment(store, "client-only", gpu="l4")
        store.add_run(mixed, _run(0, server=False))
        store.add_run(
            mixed,
            Run(
                seq=1,
                status="error",
                prompt="p",
                client=None,
                server=None,
                isolation=Isolation(False, False),
                error="connection refused",
            ),
        )
        store.finish_experiment(mixed)
    return path


def test_missing_store_says_so(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "absent.db")
    assert "No experiment store" in at.info[0].value


def test_empty_store_says_so(monkeypatch, tmp_path):
    Store(tmp_path / "empty.db").close()
    at = open_app(monkeypatch, tmp_path / "empty.db")
    for page in ("Experiments", "Run timeline", "Phases", "GPU", "Checklist"):
        goto(at, page)
        assert "no experiments yet" in at.info[0].value


def test_experiments_page_lists_filters_and_selects(monkeypatch, filled):
    at = open_app(monkeypatch, filled)
    assert at.sidebar.selectbox(key="experiment").value == 3  # the latest by default
    table = at.dataframe[0].value
    assert list(table["name"]) == ["baseline", "nothing-ran", "client-only"]
    assert "✅ ok" in list(table["status"]) and "⚠️ 1 failed" in list(table["status"])
    assert "🔒 all isolated" in list(table["isolation"])
    runs = at.dataframe[1].value
    assert list(runs["status"]) == ["ok", "error"]
    assert "connection refused" in list(runs["note"])
    at.text_input(key="label_filter").set_value("a100").run()
    assert list(at.dataframe[0].value["name"]) == ["baseline"]
    at.selectbox(key="pick").set_value(1).run()
    at.button(key="select_button").click().run()
    assert not at.exception
    assert at.sidebar.selectbox(key="experiment").value == 1
    assert at.subheader[0].value.startswith("#1 baseline")
    assert len(at.dataframe[1].value) == 3


def test_experiment_without_runs(monkeypatch, filled):
    at = open_app(monkeypatch, filled)
    goto(at, "Experiments", 2)
    assert "no runs stored" in page_text(at)
    for page in ("Run timeline", "Phases", "GPU", "Checklist"):
        goto(at, page)
        assert at.info or at.get("metric"), page


def test_timeline_page(monkeypatch, filled):
    at = goto(open_app(monkeypatch, filled), "Run timeline", 1)
    assert count_charts(at) == 2  # swimlane + ITL
    assert at.selectbox(key="timeline_run").options == ["0", "1", "2"]
    assert "p50 10.00 ms · p99 14.30 ms over 15 gaps" in page_text(at)
    side = at.dataframe[0].value
    assert dict(zip(side["phase"], side["server"], strict=True))["prefill"] == "30.0 ms"
    assert dict(zip(side["phase"], side["client"], strict=True))["TTFT"] == "40.0 ms"  # run 0
    at.selectbox(key="timeline_run").set_value(2).run()
    assert (
        dict(zip(at.dataframe[0].value["phase"], at.dataframe[0].value["client"], strict=True))[
            "TTFT"
        ]
        == "42.0 ms"
    )
    metric = at.get("metric")[0]
    assert metric.label == "Client − server TTFT"


def test_timeline_client_only(monkeypatch, filled):
    at = goto(open_app(monkeypatch, filled), "Run timeline", 3)
    assert count_charts(at) == 2
    assert "client-only" in page_text(at)


def test_phases_page(monkeypatch, filled):
    at = goto(open_app(monkeypatch, filled), "Phases", 1)
    metrics = {m.label: m.value for m in at.get("metric")}
    assert metrics["Prefill (median)"] == "30.0 ms"
    assert metrics["Decode (median)"] == "150.1 ms"  # 150.0, 150.1, 150.2
    assert metrics["TTFT (median)"] == "41.0 ms"
    assert metrics["Decode share of e2e"].endswith("%")
    assert count_charts(at) == 3  # per run, per experiment, distributions
    goto(at, "Phases", 3)
    assert "No server phases stored" in page_text(at)


def test_phases_page_against_the_bound(monkeypatch, filled, tmp_path):
    import json

    from tests.unit.test_roofline import LLAMA2_70B_CONFIG

    monkeypatch.setenv("PHASEPROBE_DATA_DIR", str(tmp_path))  # no calibration stored
    at = goto(open_app(monkeypatch, filled), "Phases", 1)
    assert at.selectbox(key="bound_peaks").value == "— choose —"
    assert "Choose the hardware peaks" in page_text(at)
    at.selectbox(key="bound_peaks").set_value("H100 SXM").run()
    # The stored server info names no model directory: the page asks for a config.
    assert "Not computable" in page_text(at) and "config.json" in page_text(at)
    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_70B_CONFIG))
    at.text_input(key="bound_config_1").set_value(str(tmp_path)).run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.get("metric")}
    # 16 tokens in 150 ms of decode vs ~138 GB of fp16 weights at 3.35 TB/s (~41 ms/token):
    # the fake runs are far faster than a 70B model could be: not an efficiency (issue 16),
    # "bound beaten" and the warning naming the peak used.
    assert metrics["Decode efficiency (median)"] == "bound beaten"
    assert "/ 41." in metrics["Decode per token: measured / bound"]
    assert "faster than its physical bound" in at.warning[0].value
    assert "underestimated (peaks used: datasheet H100 SXM" in at.warning[0].value
    assert count_charts(at) == 4  # per run, per experiment, distributions, against the bound
    assert "H100 SXM" in page_text(at)


def test_gpu_page(monkeypatch, filled):
    at = goto(open_app(monkeypatch, filled), "GPU", 1)
    assert "Flat memory ≠ idle" in page_text(at)
    assert count_charts(at) == 4  # memory, utilisation, power, SM clock
    assert "1,600 samples" in page_text(at) or "160 samples from 2 GPU(s)" in page_text(at)
    goto(at, "GPU", 3)
    assert "No GPU samples" in page_text(at)


def test_checklist_page(monkeypatch, filled):
    at = goto(open_app(monkeypatch, filled), "Checklist", 1)
    metrics = {m.label: int(m.value) for m in at.get("metric")}
    from phaseprobe.analysis.checklist import RULES

    # every experiment rule answers (the store holds no spans: the span rules do not run)
    assert sum(metrics.values()) == len(RULES)
    rules = list(at.dataframe[0].value["rule"])
    assert rules == [r.id for r in RULES]
    assert "decode_vs_prefill" in rules and "memory_flat" in rules
    assert at.expander, "no verdict details"
    at.selectbox(key="use_case").set_value("voice").run()
    assert not at.exception
    goto(at, "Checklist", 3)
    rows = at.dataframe[0].value
    run_errors = rows[rows["rule"] == "run_errors"].iloc[0]
    assert run_errors[""] in ("⚠️", "❌")


def test_many_experiments_are_all_listed(monkeypatch, tmp_path):
    """How fast they open is measured by bench/dashboard_open.py, not asserted here."""
    path = tmp_path / "many.db"
    with Store(path) as store:
        for i in range(1000):
            _experiment(store, f"e{i}")
    at = open_app(monkeypatch, path)
    assert len(at.dataframe[0].value) == 1000
    assert at.sidebar.selectbox(key="experiment").value == 1000


def test_ab_page_needs_two_experiments(monkeypatch, tmp_path):
    with Store(tmp_path / "one.db") as store:
        store.add_run(_experiment(store, "only"), _run(0))
    at = goto(open_app(monkeypatch, tmp_path / "one.db"), "A/B")
    assert "needs two experiments" in at.info[0].value


def test_ab_page(monkeypatch, tmp_path):
    path = tmp_path / "ab.db"
    with Store(path) as store:
        for name, slow in (("arm-a", 1.0), ("arm-b", 1.3)):
            eid = _experiment(store, name)
            for seq in range(8):
                store.add_run(eid, _run(seq, slow=slow))
    at = goto(open_app(monkeypatch, path), "A/B")
    assert at.selectbox(key="ab_a").value == 1 and at.selectbox(key="ab_b").value == 2
    table = at.dataframe[0].value
    row = table[table["metric"] == "server decode"].iloc[0]
    assert row["ratio B/A"] == pytest.approx(1.3, rel=0.01)
    assert row["CI low"] <= row["ratio B/A"] <= row["CI high"]
    assert row["verdict"] == "regression"
    assert count_charts(at) == 1  # the forest plot
    at.selectbox(key="ab_b").set_value(1).run()
    assert "two different experiments" in at.info[0].value


def _ab_session_store(
    path: Path, *, b_slow: float, arms: int = 2, settings: dict | None = None
) -> None:
    from phaseprobe.collect.ab.playbook import shipped_playbooks

    book = shipped_playbooks() / "cpu-compile.toml"
    with Store(path) as store:
        sid = store.create_ab_session(
            "cpu-compile", str(book), book.read_text(), settings or {"runs": 8}
        )
        ids = {}
        for name, slow in (("eager", 1.0), ("compiled", b_slow))[:arms]:
            ids[name] = _experiment(store, f"cpu-compile/{name}")
            for seq in range(8):
                store.add_run(ids[name], _run(seq, slow=slow))
        store.add_run(_experiment(store, "unrelated"), _run(0))
        store.set_ab_arms(sid, ids)


def test_ab_page_shows_a_stored_session(monkeypatch, tmp_path):
    _ab_session_store(tmp_path / "s.db", b_slow=0.7)
    at = goto(open_app(monkeypatch, tmp_path / "s.db"), "A/B")
    assert at.radio(key="ab_source").value == "A/B session"
    assert at.selectbox(key="ab_session").value == 1
    assert "A = **eager** (experiment #1), B = **compiled** (experiment #2)" in page_text(at)
    table = at.dataframe[0].value
    row = table[table["metric"] == "server decode"].iloc[0]
    assert row["ratio B/A"] == pytest.approx(0.7, rel=0.02)
    assert row["verdict"] == "improvement"
    # The other source is still there: any two experiments, the selected one as B.
    at.radio(key="ab_source").set_value("Any two experiments").run()
    assert not at.exception
    assert at.selectbox(key="ab_b").value == 3


def test_ab_page_shows_a_sequential_session_with_why_it_stopped(monkeypatch, tmp_path):
    from phaseprobe.analysis.ab.sequential import SequentialPlan

    plan = SequentialPlan(min_effect=0.05, max_runs=8)
    stop = {
        "reason": "decided",
        "primary": "server_decode_s",
        "verdict": "improvement",
        "pairs": 8,
        "runs": {"eager": 8, "compiled": 8},
        "minutes": 0.4,
        "looks": 2,
        "more_runs": None,
    }
    _ab_session_store(
        tmp_path / "s.db",
        b_slow=0.7,
        settings={"runs": 8, "sequential": plan.to_dict(), "stop": stop},
    )
    at = goto(open_app(monkeypatch, tmp_path / "s.db"), "A/B")
    assert not at.exception
    text = page_text(at)
    assert "Sequential session: stopped (decided) after 8 eager, 8 compiled runs" in text
    row = at.dataframe[0].value
    row = row[row["metric"] == "server decode"].iloc[0]
    # The sequential view: geometric mean of paired ratios, the anytime interval, its verdict.
    assert row["verdict"] == "improvement" and row["CI high"] < 1
    assert row["ratio B/A"] == pytest.approx(0.7, rel=0.05)
    assert "Noise, server decode" in text


def test_ab_page_session_missing_an_arm(monkeypatch, tmp_path):
    _ab_session_store(tmp_path / "s.db", b_slow=1.0, arms=1)
    at = goto(open_app(monkeypatch, tmp_path / "s.db"), "A/B")
    assert "no experiment for arm compiled" in at.error[0].value


def test_nccl_and_traces_without_upload(monkeypatch, filled):
    at = open_app(monkeypatch, filled)
    goto(at, "NCCL")
    assert "Upload an NCCL log" in at.info[0].value
    goto(at, "Traces")
    assert "Upload a trace" in at.info[0].value


def test_file_summaries():
    """The upload path (AppTest cannot drive st.file_uploader): the cached summariser and the
    flatteners the pages render with."""
    import json

    from phaseprobe.present.dashboard import page_files

    log = Path(__file__).parents[1] / "data" / "nccl" / "v2_18_mpirun_ib_2node.log"
    doc = page_files._summarize("nccl", log.name, log.read_bytes())
    assert doc["transports"]["by_kind"]["NET/IB"] == 4
    assert ("transports.by_kind.NET/IB", "4") in page_files.scalars(doc)
    assert any(name == "transports.peers" for name, _ in page_files.tables(doc))

    from tests.unit.test_torch_trace import gpu_trace

    trace = page_files._summarize("trace", "t.json", json.dumps(gpu_trace()).encode())
    classes = dict(page_files.tables(trace))["classes"]
    assert {"cls", "time_ns"} <= set(classes) and "gemm" in set(classes["cls"])
    saved = page_files._summarize("trace", "s.json", json.dumps(trace).encode())
    assert saved["idle_gaps_total_ns"] == trace["idle_gaps_total_ns"]
    from phaseprobe.errors import PhaseprobeError

    with pytest.raises((PhaseprobeError, OSError, ValueError)):  # the page: one error line
        page_files._summarize("trace", "bad.json", b"not json")


def test_nccl_and_traces_from_kept_analyses(monkeypatch, tmp_path, filled):
    """Summaries kept with `phaseprobe nccl|trace --keep` show without the file; the one
    attached to the selected experiment comes first."""
    import shutil

    from phaseprobe.present.cli import main
    from tests.unit.test_torch_trace import gpu_trace, write

    store = tmp_path / "kept.db"
    shutil.copy(filled, store)
    logs = Path(__file__).parents[1] / "data" / "nccl"
    assert (
        main(["nccl", str(logs / "v2_18_mpirun_ib_2node.log"), "--keep", "--store", str(store)])
        == 0
    )
    assert (
        main(
            [
                "nccl",
                str(logs / "v2_7_srun_socket_shm.log"),
                "--keep",
                "--experiment",
                "3",
                "--store",
                str(store),
            ]
        )
        == 0
    )
    trace = write(tmp_path / "rank0.1.pt.trace.json.gz", gpu_trace(), gz=True)
    assert main(["trace", str(trace), "--keep", "--experiment", "1", "--store", str(store)]) == 0

    at = goto(open_app(monkeypatch, store), "NCCL", 3)
    assert at.radio(key="source_nccl").value == "Kept in the store (2)"
    assert at.selectbox(key="kept_nccl").value == 2  # attached to #3, before the newer loose one
    assert "v2_7_srun_socket_shm.log" in page_text(at)
    assert count_charts(at) == 1  # the transport mix
    at.selectbox(key="kept_nccl").set_value(1).run()
    assert "v2_18_mpirun_ib_2node.log" in page_text(at)
    assert "NET/IB" in set(at.dataframe[0].value["field"].str.rsplit(".", n=1).str[-1])
    at.radio(key="source_nccl").set_value("Upload a file").run()
    assert "Upload an NCCL log" in at.info[0].value

    goto(at, "Traces", 1)
    assert at.selectbox(key="kept_trace").value == 3
    assert "classes" in [h.value for h in at.subheader]
    assert count_charts(at) == 1  # time per kernel class
    goto(at, "Traces", 2)
    assert "None is attached to experiment #2" in page_text(at)
    # The checklist takes the trace kept with experiment #1 as its timeline evidence.
    goto(at, "Checklist", 1)
    verdicts = at.dataframe[0].value.set_index("rule")["verdict"]
    assert not verdicts["idle_gaps"].startswith("skipped")
    assert "kept analysis 3" in page_text(at)


def test_interfere_pairs_on_one_clock(monkeypatch, tmp_path):
    """An interfere experiment's pairs, read back from the stored runs: A and B on A's clock,
    B's send and first token marked, A's gaps over time."""
    from phaseprobe.analysis.interplay import interfere_role
    from phaseprobe.collect.interplay.context import concurrent_run
    from phaseprobe.present.dashboard.interfere_pairs import a_gaps, pair_lanes, pairs
    from phaseprobe.sources.vllm.openai_stream import StreamOutcome

    def outcome(sent_ns: int, offsets_ms: list[float]) -> StreamOutcome:
        ev = tuple(int(t * 1e6) for t in offsets_ms)
        return StreamOutcome(
            timeline=ClientTimeline(
                sent_wall_ns=sent_ns,
                event_offsets_ns=ev,
                end_offset_ns=ev[-1] + 1_000_000,
                http_status=200,
                prompt_tokens=32,
                completion_tokens=len(ev),
                finish_reason="length",
                complete=True,
            ),
            error=None,
            text="",
        )

    path = tmp_path / "i.db"
    a_ms = [10.0 + 4 * k for k in range(10)] + [90.0 + 4 * k for k in range(10)]  # a 44 ms gap
    with Store(path) as store:
        eid = store.create_experiment(
            Experiment(
                name="interfere",
                kind="interfere",
                spec=RunSpec(
                    endpoint="http://127.0.0.1:8000", model="tiny", prompt="", max_tokens=20
                ),
                server_info={},
                created_wall_ns=T0,
            )
        )
        store.add_run(eid, _run(0))  # an A-alone baseline: not part of a pair
        store.add_run(eid, concurrent_run(1, "a", outcome(T0, a_ms), interfere_role(0, "A")))
        store.add_run(
            eid, concurrent_run(2, "b", outcome(T0 + 40_000_000, [38.0]), interfere_role(0, "B"))
        )
        store.add_run(eid, concurrent_run(3, "a", outcome(T0, a_ms), interfere_role(1, "A")))
        runs = store.runs(eid)
    found = pairs(runs)
    assert list(found) == [0]  # pair 1 has no B: not drawn
    assert pair_lanes(found[0]) == {1: ("A (decoding)", 0.0), 2: ("B (long prefill)", 40.0)}
    gaps = a_gaps(found[0])
    assert gaps["gap_ms"].max() == pytest.approx(44.0) and len(gaps) == 19

    at = goto(open_app(monkeypatch, path), "Run timeline", 1)
    assert at.selectbox(key="interfere_pair").options == ["0"]
    assert count_charts(at) == 4  # all runs, the pair, A's gaps, one run's ITL
    assert "A's largest gap after B was sent: 44.0 ms; its median gap before: 4.0 ms" in page_text(
        at
    )


def test_nccl_tests_table_is_plotted_busbw_against_size(monkeypatch, tmp_path, filled):
    import shutil

    from phaseprobe.present.cli import main

    store = tmp_path / "kept.db"
    shutil.copy(filled, store)
    log = Path(__file__).parents[1] / "data" / "nccl" / "pair_healthy.log"
    assert main(["nccl", str(log), "--keep", "--experiment", "3", "--store", str(store)]) == 0
    at = goto(open_app(monkeypatch, store), "NCCL", 3)
    assert "nccl-tests: bus bandwidth by message size" in [h.value for h in at.subheader]
    assert count_charts(at) == 2  # busbw by size, then the transport mix


# -- issue 43 item 1: the dashboard opens anywhere


def test_a_missing_store_opens_every_page(monkeypatch, tmp_path):
    """No store (a new machine): the experiment pages give the start page, the file pages
    their upload, the store pages say how spans arrive; nothing is created."""
    absent = tmp_path / "absent.db"
    at = open_app(monkeypatch, absent)
    pages = at.sidebar.radio(key="page").options
    assert {"Live", "Fleet", "NCCL", "Traces"} <= set(pages)
    for page in pages:
        goto(at, page)
        text = page_text(at)
        if page in ("Experiments", "Run timeline", "Phases", "GPU", "Checklist", "A/B"):
            assert at.header[0].value == "Getting started", page
            assert f"`{page}` shows an experiment" in text
            commands = "\n".join(c.value for c in at.code)
            for command in ("phaseprobe probe", "watch --demo", "spans import", "nccl LOG"):
                assert command in commands, (page, command)
        else:
            assert at.header[0].value == page
    goto(at, "NCCL")
    assert "Upload an NCCL log" in at.info[0].value
    goto(at, "Traces")
    assert "Upload a trace" in at.info[0].value
    assert not absent.exists()


def test_files_pages_read_a_store_with_no_experiment(monkeypatch, tmp_path):
    """A summary kept with no experiment (``nccl LOG --keep``) shows on a store without
    experiments."""
    path = tmp_path / "kept.db"
    with Store(path) as store:
        store.add_analysis("nccl", "/logs/rank0.log", {"transports": {"by_kind": {"P2P": 3}}})
    at = goto(open_app(monkeypatch, path), "NCCL")
    assert "Transport mix" in [s.value for s in at.subheader] + [h.value for h in at.header]
    assert "/logs/rank0.log" in page_text(at)
    goto(at, "Run timeline")
    assert "holds no experiments yet" in at.info[0].value


def test_the_sidebar_default_is_the_selection(monkeypatch, filled):
    """The browser shows a selectbox's default whenever it lacks the widget's state: the
    default must be the selected experiment, not the first (issue 43: a browser showed "#1"
    while the newest was selected)."""
    at = open_app(monkeypatch, filled)
    box = at.sidebar.selectbox(key="experiment")
    assert box.value == 3 and box.proto.default == box.options.index("#3 client-only")
    at.selectbox(key="pick").set_value(1).run()
    at.button(key="select_button").click().run()
    box = at.sidebar.selectbox(key="experiment")
    assert box.value == 1 and box.proto.default == 0
    goto(at, "Phases")
    assert at.sidebar.selectbox(key="experiment").proto.default == 0
