"""The one wiring of a measurement (collect/session.py): what probe, interplay and watch's
demo open through it, against the project's SSE test server."""

from __future__ import annotations

import pytest

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.notices import RecordedNotices
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.collect.session import Session, SessionOptions
from phaseprobe.errors import ConfigError
from phaseprobe.records import RunSpec
from phaseprobe.testing.fake_nvml import FakeNvmlBackend, demo_devices
from phaseprobe.testing.sse_server import Script, SseServer


def test_a_session_wires_target_store_and_sampler_and_reports_after_the_runs(tmp_path):
    notices = RecordedNotices()
    with SseServer(Script(n_tokens=4)) as srv:
        opts = SessionOptions(
            store_path=str(tmp_path / "s.sqlite"),
            endpoint=srv.base_url,
            gpu="on",
            nvml_backend=FakeNvmlBackend(demo_devices()),
            gpu_period_s=0.01,
        )
        with Session(opts, notices) as s:
            assert s.endpoint == srv.base_url and s.model == srv.model
            assert [m["id"] for m in s.models] == [srv.model]
            assert s.sampler is not None and s.capture is None and s.sidecar is None
            assert s.span_wait_s is None  # spans are off unless asked for
            spec = RunSpec(endpoint=s.endpoint, model=s.model, prompt="hello", max_tokens=4)
            result = run_probe(
                spec,
                s.store,
                settings=ProbeSettings(runs=2, warmup=0),
                before_runs=s.before_runs,
                gpu_sampler=s.sampler,
                models=s.models,
            )
            report = s.finish(result)
            kept = [a for a in s.store.analyses() if a["experiment_id"] == result.experiment_id]
        paths = [r.path for r in srv.requests]
    assert paths.count("/v1/models") == 1  # fetched once, handed to the check and the runs
    assert len(result.runs) == 2
    # a client-only endpoint has no model config: the roofline says why it is skipped
    assert "skipped" in report.efficiency
    assert [a["kind"] for a in kept] == ["efficiency"]  # kept with the experiment
    assert report.trace is None and report.prometheus is None and report.shared == {}


def test_a_wrong_model_fails_before_the_store_is_opened(tmp_path):
    with SseServer(Script(n_tokens=2)) as srv:
        opts = SessionOptions(
            store_path=str(tmp_path / "s.sqlite"), endpoint=srv.base_url, model="no-such-model"
        )
        with pytest.raises(ConfigError, match="'no-such-model' is not served"):
            with Session(opts, RecordedNotices()):
                pass
    assert not (tmp_path / "s.sqlite").exists()


def test_bad_peaks_fail_before_any_server_is_asked(tmp_path):
    with SseServer(Script(n_tokens=2)) as srv:
        opts = SessionOptions(
            store_path=str(tmp_path / "s.sqlite"), endpoint=srv.base_url, peaks="h300"
        )
        with pytest.raises(ConfigError, match="unknown GPU 'h300'"):
            with Session(opts, RecordedNotices()):
                pass
        assert srv.requests == []


def test_no_nvml_is_said_once_and_the_session_goes_on(tmp_path, monkeypatch):
    from phaseprobe.sources.gpu import sampler as gpu_sampler

    monkeypatch.setattr(
        gpu_sampler, "open_sampler", lambda *a, **k: (None, "NVML not available (no NVIDIA driver)")
    )
    notices = RecordedNotices()
    with SseServer(Script(n_tokens=2)) as srv:
        opts = SessionOptions(
            store_path=str(tmp_path / "s.sqlite"), endpoint=srv.base_url, gpu="auto"
        )
        with Session(opts, notices) as s:
            assert s.sampler is None
    assert ("warn", "no GPU data: NVML not available (no NVIDIA driver)") in notices.lines
