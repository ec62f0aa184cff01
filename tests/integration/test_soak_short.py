"""The soak's short form (issue 38 item 5): a receiving ``watch`` for 50 s beside probes and prunes.

bench/soak_receiver.py runs ``phaseprobe watch --retain-spans`` as a subprocess, an exporter that
retries as vLLM's SDK does (50 spans/s, a batch a second), and every 20 s a ``probe`` against the
SSE test server and a ``spans prune --keep`` on the same store (the second with ``--vacuum``).
Asserted: nothing acknowledged is lost (each acknowledged batch read back right after its ack,
and the watch's count of new spans equal to the spans left plus every deletion), no process
exits with an error, the watch lives to the end of its ``--duration``, and its RSS does not grow
beyond a generous bound. Nothing on speed. About 65 s of wall time; no vLLM needed.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

import pytest

from bench.soak_receiver import SoakConfig, SoakResult, run_soak

pytestmark = pytest.mark.integration

SHORT = SoakConfig(
    seconds=50.0,  # CI's budget: the hour's figures come from bench/soak_receiver.py
    every_s=20.0,  # a probe and a prune at 20 s, again (prune --vacuum) at 40 s
    rate=50.0,
    retain_spans=1200,  # the watch's retention deletes too (its pass every 30 s sees more)
    keep=800,
    report_every_s=10.0,
    tail_s=10.0,
)


def _rss(result: SoakResult, lo: float, hi: float) -> float:
    values = [s.rss_mib for s in result.samples if lo <= s.t_s < hi and s.rss_mib is not None]
    assert values, f"no RSS sample of the watch between {lo:g} and {hi:g} s"
    return statistics.fmean(values)


def test_short_soak_loses_nothing_acknowledged_and_every_process_lives(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_soak(replace(SHORT, store=tmp_path / "soak.sqlite"), lines.append)
    report = "\n".join(lines)
    print(report)
    e, c = result.exporter, result.checker
    doc = result.watch_doc
    assert doc is not None, f"the watch printed no JSON:\n{result.watch_stderr[-3000:]}\n{report}"

    # the watch: alive while spans came, exited 0 at the end of its --duration, no traceback
    assert result.watch_alive_until_end, report
    assert result.watch_returncode == 0, result.watch_stderr[-3000:]
    assert result.watch_ran_s >= SHORT.seconds + SHORT.tail_s - 1, report
    assert "Traceback" not in result.watch_stderr, result.watch_stderr[-3000:]

    # the probes and prunes beside it: each ran, each exited 0 (no store error)
    names = [op.name for op in result.ops]
    assert any(n.startswith("probe") for n in names), names
    assert any(n.startswith("prune") and "--vacuum" not in n for n in names), names
    assert any(n.endswith("--vacuum") for n in names), names
    for op in result.ops:
        assert op.ok, op.text()
        assert op.doc is not None, op.text()
    assert any(int((op.doc or {}).get("deleted", 0)) > 0 for op in result.ops), report

    # 0 acknowledged spans lost, counted two ways
    assert e["acked"] > 0.8 * SHORT.rate * SHORT.seconds, report
    assert e["dropped_spans"] == 0 and e["rejected_spans"] == 0 and e["queue_dropped"] == 0, e
    assert result.flushed, "the exporter's last batches were not answered before the tail ended"
    assert c["unchecked_spans"] == 0, c
    assert c["checked_spans"] == e["acked"], (c, e)
    assert c["lost_spans"] == 0, f"acknowledged, then not in the store: {c}"
    assert c["unverifiable_spans"] == 0, c
    received_new = doc["receiver"]["new_request_spans"]
    pruned = sum(int((op.doc or {}).get("deleted", 0)) for op in result.ops)
    assert result.final_rows is not None
    assert received_new == result.final_rows + doc["retention"]["deleted"] + pruned, (
        received_new,
        result.final_rows,
        doc["retention"]["deleted"],
        pruned,
    )
    assert received_new >= e["acked"], (received_new, e["acked"])
    assert result.integrity == "ok", result.integrity

    # memory: generous (interpreter warm-up and allocator noise are not a leak)
    second = _rss(result, SHORT.report_every_s, 2 * SHORT.report_every_s)
    last = _rss(result, SHORT.seconds - SHORT.report_every_s, SHORT.seconds)
    assert last <= 1.5 * second + 50, f"watch RSS {second:.1f} MiB -> {last:.1f} MiB\n{report}"
