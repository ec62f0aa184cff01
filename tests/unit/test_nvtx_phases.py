"""Each probe run marks its phases with NVTX (issue 20 §7): under `nsys profile` the run, its
request, the wait for the first token and the decode show on the timeline, with the names
`phaseprobe nsys` maps to phases. A recording stand-in for the nvtx module checks the calls."""

from __future__ import annotations

import sys
import types
from contextlib import contextmanager

from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.records import RunSpec
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import Script, SseServer


def _recording_nvtx(monkeypatch) -> list[tuple[str, str]]:
    calls: list[tuple[str, str]] = []
    mod = types.ModuleType("nvtx")

    @contextmanager
    def annotate(name, domain=None):
        calls.append(("push", name))
        yield
        calls.append(("pop", name))

    def start_range(name, domain=None):
        calls.append(("start", name))
        return name

    def end_range(handle):
        calls.append(("end", handle))

    mod.annotate, mod.start_range, mod.end_range = annotate, start_range, end_range
    monkeypatch.setitem(sys.modules, "nvtx", mod)
    return calls


def test_every_run_marks_request_first_token_and_decode(tmp_path, monkeypatch):
    calls = _recording_nvtx(monkeypatch)
    with SseServer(Script(n_tokens=5)) as srv, Store(tmp_path / "s.sqlite") as store:
        spec = RunSpec(endpoint=srv.base_url, model=srv.model, prompt="hi", max_tokens=5)
        result = run_probe(spec, store, settings=ProbeSettings(runs=2, warmup=1))
    assert [r.status for r in result.runs] == ["ok", "ok"]
    per_run = [
        ("push", "run 0"),
        ("push", "request"),
        ("start", "first token"),
        ("end", "first token"),
        ("start", "decode"),
        ("end", "decode"),
        ("pop", "request"),
        ("pop", "run 0"),
    ]
    assert calls == per_run + [(k, n.replace("run 0", "run 1")) for k, n in per_run]


def test_a_run_that_fails_before_any_token_closes_its_range(tmp_path, monkeypatch):
    calls = _recording_nvtx(monkeypatch)
    with SseServer(Script(n_tokens=5, status=500)) as srv, Store(tmp_path / "s.sqlite") as store:
        spec = RunSpec(endpoint=srv.base_url, model=srv.model, prompt="hi", max_tokens=5)
        run_probe(spec, store, settings=ProbeSettings(runs=1, warmup=0))
    assert ("start", "first token") in calls and ("end", "first token") in calls
    assert ("start", "decode") not in calls
