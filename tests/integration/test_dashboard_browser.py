"""End to end: ``phaseprobe dashboard`` on a store of real probe runs, opened in headless Chromium.

The store holds two probe experiments against the local vLLM (the second with a fake-NVML GPU
series) and request spans of three replicas (one slow) for the Live and Fleet pages. A second
dashboard runs as on a new machine: no experiment store, its spans from a chdb span store
(``--spans-from``), an NCCL log uploaded on the Files page. ``phaseprobe dashboard`` runs as a
subprocess on a free port of 127.0.0.1; Playwright
drives Debian's ``/usr/bin/chromium`` (``executable_path``: no browser download), waits for
Streamlit's asynchronous rendering, checks that the run timeline's swimlanes are drawn (one
lane per run, queue/prefill/decode bars) and that no page shows an exception, and saves a
screenshot of every page of both to ``$PHASEPROBE_ARTIFACTS_DIR`` (default ``artifacts/`` at
the repo root).

Without playwright or Chromium the tests skip, or fail when ``PHASEPROBE_REQUIRE_BROWSER=1``
(``tests/run_all.sh`` sets it and installs both).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.local.process import free_port, log_tail, process_group_alive, stop_process_group
from phaseprobe.records import RunSpec
from phaseprobe.sources.gpu.sampler import GpuSampler
from phaseprobe.store import Store
from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices
from tests.unit.test_dashboard_fleet import spans as fleet_spans

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path(os.environ.get("PHASEPROBE_CHROMIUM", "/usr/bin/chromium"))
REQUIRE_ENV = "PHASEPROBE_REQUIRE_BROWSER"
ARTIFACTS_ENV = "PHASEPROBE_ARTIFACTS_DIR"
# As root, on a closed network: no sandbox, and nothing that phones home (its connections are
# refused here and slow the start down).
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
]
# every page of the sidebar, in its order
PAGES = [
    "Experiments",
    "Live",
    "Fleet",
    "Capacity",
    "Stalls",
    "Run timeline",
    "Phases",
    "GPU",
    "Checklist",
    "A/B",
    "NCCL",
    "Traces",
]
EXPERIMENT_PAGES = {"Experiments", "Run timeline", "Phases", "GPU", "Checklist", "A/B"}
NCCL_LOG = REPO / "tests" / "data" / "nccl" / "v2_18_mpirun_ib_2node.log"
RUNS = 3  # measured runs in the timeline's experiment (the last one: the default selection)
TIMEOUT_MS = 30_000  # for one element to appear: Streamlit renders asynchronously


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package playwright is not installed (pip install -e '.[test]')"
    if not CHROMIUM.is_file():
        return f"{CHROMIUM} is missing (apt-get install chromium; tests/run_all.sh does it)"
    return None


@pytest.fixture(scope="session")
def browser_ready() -> None:
    """Checked before the shared vLLM starts, so a missing browser costs nothing."""
    why = _browser_missing()
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"browser test required ({REQUIRE_ENV}=1) but {why}", pytrace=False)
    pytest.skip(f"no headless browser: {why}")


@pytest.fixture(scope="module")
def artifacts() -> Path:
    path = Path(os.environ.get(ARTIFACTS_ENV) or REPO / "artifacts") / "dashboard"
    path.mkdir(parents=True, exist_ok=True)
    for old in path.glob("*.png"):
        old.unlink()
    return path


@pytest.fixture(scope="module")
def real_store(browser_ready, local_vllm, tmp_path_factory) -> Path:
    """Two probe experiments from the real vLLM; the second carries a fake-NVML GPU series and
    a kept NCCL summary."""
    path = tmp_path_factory.mktemp("dashboard") / "store.db"
    spec = RunSpec(
        endpoint=local_vllm.base_url,
        model=local_vllm.model,
        prompt="",
        max_tokens=16,
        prompt_tokens_target=64,
    )
    with Store(path) as store:
        first = run_probe(spec, store, settings=ProbeSettings(runs=2, warmup=1, name="e2e-a"))
        # The fake GPUs finish "loading" (memory up to the KV plateau) during the warm-up.
        sampler = GpuSampler(FakeNvmlBackend(demo_devices(2, startup_s=0.1)), 0.05)
        second = run_probe(
            replace(spec, max_tokens=24),
            store,
            settings=ProbeSettings(runs=RUNS, warmup=1, pause_s=0.2, name="e2e-b"),
            gpu_sampler=sampler,
        )
        assert len(store.gpu_samples(second.experiment_id)) > 0
    # Spans of three replicas that finished over the last minutes (r2 decodes slowly), as
    # `phaseprobe watch` stores them: the Live and Fleet pages' data.
    with Store(path) as store:
        items = fleet_spans({"r1": 20, "r2": 20, "r3": 20}, time.time(), slow="r2")
        store.add_spans(items, [{}] * len(items), {})
    # An NCCL summary kept with the second experiment, as `phaseprobe nccl --keep` leaves it.
    from phaseprobe.present.cli import main

    log = NCCL_LOG
    assert (
        main(
            [
                "nccl",
                str(log),
                "--keep",
                "--experiment",
                str(second.experiment_id),
                "--store",
                str(path),
                "--json",
            ]
        )
        == 0
    )
    for run in first.runs + second.runs:  # (an overlapping stray request only flags a run)
        assert run.status in ("ok", "isolation_failed"), (run.error, run.isolation.reasons)
    return path


@pytest.fixture(scope="module")
def dashboard(real_store, tmp_path_factory) -> Iterator[str]:
    """``phaseprobe dashboard`` on the store of real runs; its base URL."""
    yield from _serve(["--store", str(real_store)], tmp_path_factory)


@pytest.fixture(scope="module")
def new_machine(browser_ready, tmp_path_factory) -> Iterator[str]:
    """``phaseprobe dashboard`` as on a new machine: no experiment store; spans of three
    replicas in a chdb span store, database ``otel`` as the collector's example writes it."""
    pytest.importorskip("chdb")
    from tests.unit.span_store_data import chdb_store

    where = tmp_path_factory.mktemp("new-machine")
    items = fleet_spans({"r1": 20, "r2": 20, "r3": 20}, time.time(), slow="r2")
    with chdb_store(where / "ch", items, database="otel"):
        pass  # written and closed: chdb keeps one engine per process, the dashboard's now
    argv = [
        "--store",
        str(where / "absent.db"),
        "--spans-from",
        f"chdb:{where / 'ch'}?database=otel",
    ]
    yield from _serve(argv, tmp_path_factory)
    assert not (where / "absent.db").exists()


def _serve(argv: list[str], tmp_path_factory: Any) -> Iterator[str]:
    """``phaseprobe dashboard ARGV`` in its own process group, bound to 127.0.0.1; its base
    URL once Streamlit answers."""
    port = free_port()
    log = tmp_path_factory.mktemp("dashboard-log") / "dashboard.log"
    env = dict(os.environ)
    env.pop("PHASEPROBE_SPANS_FROM", None)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH")) if p)
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "phaseprobe", "dashboard", *argv, "--port", str(port)],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if requests.get(f"{base}/_stcore/health", timeout=2).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if proc.poll() is not None:
                pytest.fail(f"phaseprobe dashboard exited with {proc.returncode}:\n{log_tail(log)}")
            if time.monotonic() > deadline:
                pytest.fail(f"{base}/_stcore/health not ok after 60 s:\n{log_tail(log)}")
            time.sleep(0.25)
        yield base
    finally:
        stop_process_group(proc.pid, reap=proc.poll)
        assert not process_group_alive(proc.pid)
        print(f"\n[dashboard log]\n{log_tail(log, 15)}", file=sys.__stderr__)


@pytest.fixture(scope="module")
def playwright(browser_ready) -> Iterator[Any]:
    """Playwright, once for the module: its sync API runs one instance per thread."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="module")
def page(playwright, dashboard) -> Iterator[Any]:
    """One Chromium page on the dashboard, with a fresh empty profile."""
    yield from _browse(playwright, dashboard, "Experiments")


@pytest.fixture(scope="module")
def new_page(playwright, new_machine) -> Iterator[Any]:
    """One Chromium page on the new machine's dashboard (it opens on the start page)."""
    yield from _browse(playwright, new_machine, "Getting started")


def _browse(pw: Any, dashboard: str, first: str) -> Iterator[Any]:
    with tempfile.TemporaryDirectory(prefix="phaseprobe-chromium-") as profile:
        context = pw.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1400, "height": 1000},
        )
        try:
            tab = context.pages[0] if context.pages else context.new_page()
            tab.set_default_timeout(TIMEOUT_MS)
            tab.goto(dashboard, wait_until="domcontentloaded")
            _wait_page(tab, first)
            yield tab
        finally:
            context.close()


def _wait_page(tab: Any, name: str) -> None:
    """Wait until Streamlit has drawn page ``name``: its heading is there and no element of
    the previous page is left over (Streamlit marks those ``data-stale``)."""
    main = tab.get_by_test_id("stMain")
    main.get_by_role("heading", name=name, exact=True).wait_for()
    tab.wait_for_function("() => document.querySelectorAll('[data-stale=\"true\"]').length === 0")
    tab.wait_for_timeout(300)  # charts lay themselves out after they are mounted


def _goto(tab: Any, name: str, heading: str | None = None) -> None:
    tab.get_by_test_id("stSidebar").get_by_test_id("stRadio").get_by_text(name, exact=True).click()
    _wait_page(tab, heading or name)


def _screenshot(tab: Any, artifacts: Path, name: str) -> Path:
    """The whole page: Streamlit scrolls inside its own container, so the viewport is made as
    tall as the content for the shot."""
    height = tab.evaluate("""() => Math.max(...[...document.querySelectorAll(
        '[data-testid="stMain"], [data-testid="stAppViewContainer"], section, body')]
        .map(e => e.scrollHeight))""")
    tab.set_viewport_size({"width": 1400, "height": max(1000, min(int(height) + 40, 8000))})
    tab.wait_for_timeout(300)  # charts re-fit to the new size
    path = artifacts / (re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") + ".png")
    tab.screenshot(path=str(path), full_page=True)
    tab.set_viewport_size({"width": 1400, "height": 1000})
    return path


def _exceptions(tab: Any) -> list[str]:
    boxes = tab.locator('[data-testid="stException"]')
    return [boxes.nth(i).inner_text()[:2000] for i in range(boxes.count())]


def _shown_runs(store_path: Path) -> list[Any]:
    """The runs of the experiment the dashboard selects by default (the newest, e2e-b)."""
    with Store(store_path) as store:
        (shown,) = [row["id"] for row in store.experiments() if row["name"] == "e2e-b"]
        runs = [r for r in store.runs(shown) if r.client is not None]
    assert [r.seq for r in runs] == list(range(RUNS))
    return runs


def test_run_timeline_draws_one_swimlane_per_run(page, artifacts, real_store):
    runs = {f"run {r.seq}": r for r in _shown_runs(real_store)}
    _goto(page, "Run timeline")
    try:
        chart = page.get_by_test_id("stMain").get_by_test_id("stVegaLiteChart").first
        chart.locator("svg.marks, canvas").first.wait_for()
        box = chart.bounding_box()
        assert box is not None and box["width"] > 300 and box["height"] > 60, box
        assert not _exceptions(page), _exceptions(page)

        lanes = [f"run {seq}" for seq in range(RUNS)]
        # The y axis names every lane (Vega's ARIA description of the axis).
        y_axis = chart.locator('[aria-roledescription="axis"][aria-label^="Y-axis"]')
        assert y_axis.count() == 1
        assert y_axis.get_attribute("aria-label").endswith(", ".join(lanes))

        # Every run has its queue, prefill and decode bar, drawn to its stored durations.
        bars = chart.locator('[aria-roledescription="bar"]').evaluate_all(
            """els => els.map(e => {
                const r = e.getBoundingClientRect();
                return {label: e.getAttribute('aria-label'), y: r.y + r.height / 2,
                        width: r.width, height: r.height};
            })"""
        )
        by_lane: dict[str, dict[str, dict[str, float]]] = {}
        for bar in bars:
            fields = dict(kv.split(": ", 1) for kv in bar["label"].split("; "))
            by_lane.setdefault(fields["lane"], {})[fields["phase"]] = bar
        assert sorted(by_lane) == lanes, sorted(by_lane)
        # One linear x scale for every lane: px per ms from all bars together, then each bar's
        # width is its stored duration on that scale (within a pixel of anti-aliasing). How
        # long each phase took depends on the machine; that the chart draws it faithfully
        # does not.
        durations_ms = {
            lane: {
                "queue": (r.server.queue_s or 0.0) * 1e3,
                "prefill": r.server.prefill_s * 1e3,
                "decode": r.server.decode_s * 1e3,
            }
            for lane, r in runs.items()
        }
        px_per_ms = sum(
            bar["width"] for phases in by_lane.values() for bar in phases.values()
        ) / sum(sum(d.values()) for d in durations_ms.values())
        assert px_per_ms > 0
        for lane, phases in by_lane.items():
            assert set(phases) == {"queue", "prefill", "decode"}, (lane, sorted(phases))
            assert phases["decode"]["height"] > 4, phases
            for phase, bar in phases.items():
                want = durations_ms[lane][phase] * px_per_ms
                assert bar["width"] == pytest.approx(want, rel=0.02, abs=1.5), (
                    lane,
                    phase,
                    bar,
                    durations_ms[lane],
                )

        # One lane per run, each on its own row: the bars of different runs do not overlap.
        rows = sorted(by_lane[lane]["decode"]["y"] for lane in lanes)
        gaps = [b - a for a, b in zip(rows, rows[1:])]
        assert min(gaps) >= 8, (
            f"the swimlanes are drawn on top of each other (row centres {rows} px): the "
            "chart's plot area has collapsed (a fixed chart height smaller than its legend "
            "and axis; alt.Step for the lane height avoids it)"
        )

        # Token ticks: one per stored token event (up to 24 a run; fewer when vLLM merged
        # tokens into one event, which it does when the client lags), then the ITL series
        # with its p50/p99 lines and the client/server table.
        ticks = chart.locator('[aria-roledescription="tick"]').count()
        events = sum(len(r.client.event_offsets_ns) for r in runs.values())
        assert ticks == events, (ticks, events)
        assert RUNS <= events <= RUNS * 24
        main = page.get_by_test_id("stMain")
        for heading in ("Inter-token latency", "Client vs server"):
            main.get_by_role("heading", name=heading, exact=True).wait_for()
        assert main.get_by_test_id("stVegaLiteChart").count() >= 2
        main.get_by_text(re.compile(r"p50 [\d.]+ ms · p99 [\d.]+ ms over \d+ gaps")).wait_for()
        main.get_by_test_id("stDataFrame").first.wait_for()
        main.get_by_test_id("stMetric").first.wait_for()
    finally:
        print(f"\nscreenshot: {_screenshot(page, artifacts, 'Run timeline')}", file=sys.__stderr__)


def test_every_page_renders_without_an_exception(page, artifacts):
    from playwright.sync_api import expect

    failures = {}
    for name in PAGES:
        _goto(page, name)
        if name == "Experiments":  # the newest experiment is the one selected
            # The page's own timeout, not expect's 5 s: on a busy 2-core box Streamlit's rerun
            # after the navigation click can take longer (the sidebar showed a stale value).
            expect(
                page.get_by_test_id("stSidebar").get_by_role("combobox", name="Experiment")
            ).to_have_value(re.compile(r"^#\d+ e2e-b$"), timeout=TIMEOUT_MS)
        errors = _exceptions(page)
        if errors:
            failures[name] = errors
        shot = _screenshot(page, artifacts, name)
        print(f"\nscreenshot: {shot}", file=sys.__stderr__)
    assert not failures, failures
    # The GPU page of the experiment with the fake-NVML series (the selected, last one).
    _goto(page, "GPU")
    main = page.get_by_test_id("stMain")
    main.get_by_text("Flat memory ≠ idle", exact=False).first.wait_for()
    assert main.get_by_test_id("stVegaLiteChart").count() >= 3
    # The NCCL page shows the summary kept with this experiment, without any upload.
    _goto(page, "NCCL")
    main.get_by_role("heading", name="Transport mix", exact=True).wait_for()
    main.get_by_text("v2_18_mpirun_ib_2node.log", exact=False).first.wait_for()
    assert main.get_by_test_id("stVegaLiteChart").count() == 1
    # Live and Fleet over the spans of the store: the 60 requests, r2 named the straggler.
    _goto(page, "Live")
    _live_and_fleet(page, "60")


def _live_and_fleet(tab: Any, requests: str) -> None:
    """The Live page's summary and the Fleet page's table and verdicts, as drawn."""
    main = tab.get_by_test_id("stMain")
    main.get_by_role("heading", name="Summary", exact=True).wait_for()
    tile = main.get_by_test_id("stMetric").filter(has_text="Requests").first
    assert tile.get_by_test_id("stMetricValue").inner_text().strip() == requests
    _goto(tab, "Fleet")
    for heading in ("Replicas", "TPOT and TTFT per replica", "Straggler and imbalance"):
        main.get_by_role("heading", name=heading, exact=True).wait_for()
    main.get_by_text(re.compile(r"straggler: r2 decodes [\d.]+× slower per token")).wait_for()
    assert main.get_by_test_id("stVegaLiteChart").count() == 1
    assert not _exceptions(tab), _exceptions(tab)


def test_a_new_machine_opens_every_page(new_page, artifacts):
    """No experiment store, spans in chdb (``--spans-from``): the experiment pages give the
    start page, Live and Fleet read the span store, the Files page reads an upload."""
    failures = {}
    for name in PAGES:
        _goto(new_page, name, "Getting started" if name in EXPERIMENT_PAGES else None)
        errors = _exceptions(new_page)
        if errors:
            failures[name] = errors
        print(
            f"\nscreenshot: {_screenshot(new_page, artifacts, 'new ' + name)}", file=sys.__stderr__
        )
    assert not failures, failures
    main = new_page.get_by_test_id("stMain")
    _goto(new_page, "Phases", "Getting started")
    main.get_by_text("No experiment store at", exact=False).wait_for()
    for command in ("phaseprobe probe", "phaseprobe watch --demo", "phaseprobe spans import"):
        main.get_by_text(command, exact=False).first.wait_for()
    _goto(new_page, "Live")
    main.get_by_text("Computed by chdb:", exact=False).wait_for()
    _live_and_fleet(new_page, "60")
    _goto(new_page, "NCCL")
    main.get_by_text("Upload an NCCL log", exact=False).wait_for()
    upload = main.get_by_test_id("stFileUploader").locator('input[type="file"]')
    upload.set_input_files(str(NCCL_LOG))
    main.get_by_role("heading", name="Transport mix", exact=True).wait_for()
    assert not _exceptions(new_page), _exceptions(new_page)
    print(
        f"\nscreenshot: {_screenshot(new_page, artifacts, 'new NCCL upload')}", file=sys.__stderr__
    )
