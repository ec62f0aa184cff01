"""The server log's "KV Transfer metrics:" line (issue 28, item 5): read, summed, judged.

The fixture lines are in the format vLLM prints them: the logger's prefix
(``%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]``, behind the process tag), then
``KVConnectorLogging.log()``'s ``"KV Transfer metrics: %s"`` with the connector's ``reduce()``
dict joined as ``k=v, …`` (vllm/distributed/kv_transfer/kv_connector/v1/metrics.py; NIXL's keys
from kv_connector/v1/nixl/stats.py, Mooncake's from its stats.py).
"""

from __future__ import annotations

import pytest

from phaseprobe.analysis.checklist import RULES, Evidence, run_checklist
from phaseprobe.analysis.rules.kv_transfer import kv_transfer_log
from phaseprobe.analysis.rules.vllm_log import parse_log

_PREFIX = "(APIServer pid=4242) INFO 11-26 10:15:{s:02d} [metrics.py:142] "


def _nixl(s: int, n: int, avg: float, p90: float, mb: float) -> str:
    fields = {
        "Num successful transfers": n,
        "Avg xfer time (ms)": avg,
        "P90 xfer time (ms)": p90,
        "Avg post time (ms)": 0.201,
        "P90 post time (ms)": 0.33,
        "Avg MB per transfer": mb,
        "Throughput (MB/s)": round(mb / avg * 1e3, 3) if n else 0,
        "Avg number of descriptors": 64.0 if n else 0,
    }
    return (
        _PREFIX.format(s=s)
        + "KV Transfer metrics: "
        + ", ".join(f"{k}={v}" for k, v in fields.items())
    )


# NIXL's reduce() when an interval had only failures: every figure 0, no failure key.
NIXL_ZEROS = _PREFIX.format(s=40) + (
    "KV Transfer metrics: Num successful transfers=0, Avg xfer time (ms)=0, "
    "P90 xfer time (ms)=0, Avg post time (ms)=0, P90 post time (ms)=0, Avg MB per transfer=0, "
    "Throughput (MB/s)=0, Avg number of descriptors=0"
)
# Mooncake's reduce() carries failures; the MultiConnector-era wording names the connector.
MOONCAKE = "INFO 11-26 10:16:02 [metrics.py:120] KVConnectorType: MooncakeConnector, " + (
    "KV Transfer metrics: Num successful transfers=3, Avg xfer time (ms)=2.0, "
    "P90 xfer time (ms)=2.5, Avg MB per transfer=1.5, Throughput (MB/s)=750.0, "
    "Avg number of descriptors=5.0, Num failed transfers={f}, Num failed recvs={r}, "
    "Num KV expired reqs={e}"
)
STARTUP = (
    "(APIServer pid=4242) INFO 11-26 10:14:40 [api_server.py:1] vLLM API server version 0.33.0"
)
NOISE = (
    "(APIServer pid=4242) INFO 11-26 10:15:05 [loggers.py:200] Engine 000: Avg prompt "
    "throughput: 17.0 tokens/s, GPU KV cache usage: 1.2%, Prefix cache hit rate: 0.0%"
)


def _ev(log: str | None) -> Evidence:
    return Evidence(server_log=log)


def test_nixl_lines_are_summed_with_a_weighted_mean():
    log = "\n".join([STARTUP, _nixl(2, 12, 3.5, 5.1, 10.0), NOISE, _nixl(12, 4, 1.5, 2.0, 2.0)])
    facts = parse_log(log)
    assert facts.kv_transfer_lines == 2 and facts.kv_transfers == 16
    assert facts.kv_xfer_avg_ms == pytest.approx((12 * 3.5 + 4 * 1.5) / 16)  # 3.0
    assert facts.kv_xfer_p90_ms_max == 5.1
    assert facts.kv_mb_per_transfer == pytest.approx((12 * 10.0 + 4 * 2.0) / 16)  # 8.0
    assert facts.kv_failures == {} and facts.kv_expired_reqs is None
    assert facts.kv_lines[0].startswith("L2: (APIServer pid=4242)")
    # The other facts are still read around it.
    assert facts.vllm_version == "0.33.0" and facts.stats_lines == 1

    v = kv_transfer_log(_ev(log))
    assert v.status == "pass"
    assert (
        "16 successful KV transfers over 2 logged interval(s), 3 ms each on average "
        "(worst interval's p90 5.1 ms), 8 MB per transfer" in v.summary
    )
    assert "carries no failure counts" in v.summary  # NIXL's line cannot say
    assert v.numbers["transfers"] == 16 and v.numbers["avg_xfer_ms"] == 3.0
    assert len(v.numbers["lines"]) == 2


def test_failures_on_the_line_fail_the_rule():
    log = "\n".join([MOONCAKE.format(f=2, r=1, e=0), MOONCAKE.format(f=0, r=0, e=0)])
    facts = parse_log(log)
    assert facts.kv_failures == {"Num failed transfers": 2, "Num failed recvs": 1}
    assert facts.kv_expired_reqs == 0 and facts.kv_connectors == ["MooncakeConnector"]
    assert facts.kv_transfers == 6 and facts.kv_xfer_avg_ms == pytest.approx(2.0)
    v = kv_transfer_log(_ev(log))
    assert v.status == "fail"
    assert "failures: Num failed transfers=2, Num failed recvs=1" in v.summary
    assert "6 successful KV transfers" in v.summary
    assert v.next_command == "phaseprobe query pd_recompute_share --prom URL"


def test_expired_kv_warns_and_clean_mooncake_passes():
    expired = kv_transfer_log(_ev(MOONCAKE.format(f=0, r=0, e=4)))
    assert expired.status == "warn" and "4 request(s) had their KV expire" in expired.summary
    clean = kv_transfer_log(_ev(MOONCAKE.format(f=0, r=0, e=0)))
    assert clean.status == "pass" and clean.summary.endswith("no failure logged")


def test_an_all_zero_nixl_line_is_a_warning_not_a_pass():
    v = kv_transfer_log(_ev("\n".join([NIXL_ZEROS, NIXL_ZEROS])))
    assert v.status == "warn"
    assert "2 'KV Transfer metrics:' line(s), none with a successful transfer" in v.summary
    assert v.numbers["avg_xfer_ms"] is None and v.numbers["p90_xfer_ms_worst_interval"] is None


def test_skipped_without_a_log_or_without_the_line():
    none = kv_transfer_log(_ev(None))
    assert none.status == "skipped" and "--server-log" in none.summary
    plain = kv_transfer_log(_ev("\n".join([STARTUP, NOISE])))
    assert plain.status == "skipped" and "'KV Transfer metrics:'" in plain.summary


@pytest.mark.parametrize(
    "line",
    [
        _PREFIX.format(s=1) + "KV Transfer metrics: ",  # empty dict
        _PREFIX.format(s=1) + "KV Transfer metrics: Foo=1, Bar=x",  # a connector we do not know
        _PREFIX.format(s=1) + "KV Transfer metrics: Num successful transfers=n/a",
    ],
)
def test_lines_without_a_count_are_not_counted(line):
    facts = parse_log(line)
    assert facts.kv_transfer_lines == 0 and facts.kv_transfers == 0
    assert kv_transfer_log(_ev(line)).status == "skipped"


def test_non_finite_figures_are_ignored():
    # Throughput is total MB / total time: inf when the times sum to 0.
    line = _PREFIX.format(s=1) + (
        "KV Transfer metrics: Num successful transfers=2, "
        "Avg xfer time (ms)=0.0, Avg MB per transfer=nan, "
        "Throughput (MB/s)=inf"
    )
    facts = parse_log(line)
    assert facts.kv_transfers == 2 and facts.kv_xfer_avg_ms == 0.0
    assert facts.kv_mb_per_transfer is None
    assert kv_transfer_log(_ev(line)).status == "pass"


def test_registered_and_run_by_the_checklist():
    assert [r.id for r in RULES].count("kv_transfer_log") == 1
    report = run_checklist(_ev(MOONCAKE.format(f=1, r=0, e=0)), only=["kv_transfer_log"])
    (verdict,) = report.verdicts
    assert verdict.rule == "kv_transfer_log" and verdict.status == "fail"
