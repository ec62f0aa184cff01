"""Checklist rule on a prefill/decode deployment's KV hand-over, from the server log (issue 28).

vLLM's KV connectors log a ``KV Transfer metrics:`` line every logging interval with the
transfers of that interval (:mod:`phaseprobe.analysis.rules.vllm_log` reads it). The figures
are pooled over requests and TP ranks, so the rule says how the hand-over went over the log's
span, not which request it was.
"""

from __future__ import annotations

from phaseprobe.analysis.rules.base import Evidence, Verdict, num, skipped

__all__ = ["kv_transfer_log"]

_QUERY = "phaseprobe query pd_recompute_share --prom URL"


def kv_transfer_log(ev: Evidence) -> Verdict:
    """The P/D KV hand-over verdict from the log's ``KV Transfer metrics:`` lines: fail on
    any logged failure, warn on expired requests or no successful transfer, else pass
    (times in ms, sizes in MB); skipped without such a log."""
    log = ev.log
    if log is None:
        return skipped("the vLLM server log of a prefill or decode instance (--server-log FILE)")
    if not log.kv_transfer_lines:
        return skipped(
            "a log with 'KV Transfer metrics:' lines (this one has none: no KV "
            "connector that logs them, logging above INFO, or no transfer while it "
            "was written)"
        )
    failures = sum(log.kv_failures.values())
    numbers = {
        "intervals": log.kv_transfer_lines,
        "transfers": log.kv_transfers,
        "avg_xfer_ms": num(log.kv_xfer_avg_ms, 3),
        "p90_xfer_ms_worst_interval": num(log.kv_xfer_p90_ms_max, 3),
        "mb_per_transfer": num(log.kv_mb_per_transfer, 3),
        "failures": dict(log.kv_failures),
        "kv_expired_reqs": log.kv_expired_reqs,
        "connectors": list(log.kv_connectors),
        "lines": list(log.kv_lines),
    }
    said = (
        f"{log.kv_transfers} successful KV transfers over {log.kv_transfer_lines} logged "
        f"interval(s)"
    )
    if log.kv_xfer_avg_ms is not None:
        said += f", {log.kv_xfer_avg_ms:.3g} ms each on average"
        if log.kv_xfer_p90_ms_max is not None:
            said += f" (worst interval's p90 {log.kv_xfer_p90_ms_max:.3g} ms)"
    if log.kv_mb_per_transfer is not None:
        said += f", {log.kv_mb_per_transfer:.3g} MB per transfer"
    if failures:
        listed = ", ".join(f"{k}={v}" for k, v in log.kv_failures.items() if v)
        return Verdict(
            "fail",
            f"{said}; failures: {listed}",
            numbers,
            {"failures": 0},
            "a failed hand-over makes the decode instance compute the prompt itself "
            "(slower, still a success): check the link between the instances and "
            "the connector's errors in both logs",
            _QUERY,
        )
    if log.kv_expired_reqs:
        return Verdict(
            "warn",
            f"{said}; {log.kv_expired_reqs} request(s) had their KV expire "
            "on the prefill instance before the decode instance fetched it",
            numbers,
            {"kv_expired_reqs": 0},
            "the decode side fetched late or never: check its queue and that the "
            "router sends every prefilled request on to a decode instance",
            _QUERY,
        )
    if log.kv_transfers == 0:
        return Verdict(
            "warn",
            f"{log.kv_transfer_lines} 'KV Transfer metrics:' line(s), none "
            "with a successful transfer: NIXL logs all zeros for an interval that "
            "had only failures (it counts those in Prometheus, not in the log)",
            numbers,
            {"transfers": "> 0"},
            "read vllm:nixl_num_failed_transfers and the recompute share",
            "phaseprobe query kv_failed_transfer_rate --prom URL",
        )
    tail = (
        ""
        if log.kv_failures or log.kv_expired_reqs is not None
        else " (this connector's line carries no failure counts:"
        " see vllm:nixl_num_failed_transfers)"
    )
    return Verdict("pass", said + ", no failure logged" + tail, numbers, {})
