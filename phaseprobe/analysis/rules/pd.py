"""Checklist rules for disaggregated prefill/decode runs (``probe --prefill … --decode …``).

Pure: read the runs' :class:`~phaseprobe.records.PdLegs`. A decode instance that computes the
prompt itself had no KV to load: the hand-over failed, silently, because the request still
succeeds (only slower). And a hand-over that takes most of the time to first token says the
transfer, not prefill, is what to fix.
"""

from __future__ import annotations

import statistics

from phaseprobe.analysis.rules.base import Evidence, Verdict, ms, num, pct, skipped

__all__ = ["kv_recompute", "hand_over_share", "HAND_OVER_WARN", "HAND_OVER_FAIL"]

_NEED = "runs on a prefill/decode pair (probe --prefill URL --decode URL)"
_COMMAND = "phaseprobe probe --prefill URL --decode URL [--endpoint ROUTER]"
HAND_OVER_WARN = 0.25  # the hand-over's share of the client TTFT
HAND_OVER_FAIL = 0.50


def kv_recompute(ev: Evidence) -> Verdict:
    """Did every decode leg get its prompt's KV from the prefill instance? A run whose decode
    instance computed the prompt itself fails the rule, with its token counts."""
    told = [r for r in ev.runs if r.pd is not None and r.status != "error"]
    if not told:
        return skipped(_NEED, _COMMAND)
    legs = [(r.seq, r.pd) for r in told if r.pd is not None]
    kinds = [pd.kv for _, pd in legs]
    bad = [(seq, pd) for seq, pd in legs if pd.kv in ("recomputed", "partial")]
    unknown = kinds.count("unknown")
    numbers = {k: kinds.count(k) for k in dict.fromkeys(kinds)} | {"runs": len(told)}
    if bad:
        seq, first = bad[0]
        return Verdict("fail", f"the decode instance recomputed the prompt in {len(bad)} of "
                               f"{len(told)} runs (run {seq + 1}: {first.kv_reason})",
                       numbers, {},
                       "the KV hand-over is failing silently: check the decode instance's "
                       "kv-transfer-config (the same connector and storage path or NIXL "
                       "side channel as the prefill instance) and its log for connector "
                       "errors; each recompute costs a full prefill on the decode pool",
                       ev.runs_command)
    if unknown == len(told):
        return Verdict("skipped", f"skipped: whether the KV moved could not be told in any of "
                                  f"{len(told)} runs ({legs[0][1].kv_reason})", numbers)
    moved = kinds.count("transferred")
    rest = f"; {unknown} not told" if unknown else ""
    return Verdict("pass", f"the KV was transferred in {moved} of {len(told)} runs{rest}",
                   numbers)


def hand_over_share(ev: Evidence) -> Verdict:
    """Is the hand-over (the prefill leg's end to the decode instance scheduling the request)
    most of the client's time to first token? Medians over the runs measured on the pair."""
    pairs = [(r.pd.hand_over_s, r.client.ttft_s) for r in ev.runs
             if r.pd is not None and r.client is not None and r.status == "ok"
             and r.pd.hand_over_s is not None and r.client.ttft_s]
    if not pairs:
        return skipped(_NEED, _COMMAND)
    hand = statistics.median(h for h, _ in pairs)
    ttft = statistics.median(t for _, t in pairs if t is not None)
    share = hand / ttft if ttft else None
    status = ("fail" if share is not None and share >= HAND_OVER_FAIL else
              "warn" if share is not None and share >= HAND_OVER_WARN else "pass")
    return Verdict(status,  # type: ignore[arg-type]
                   f"hand-over {ms(hand)} of a {ms(ttft)} TTFT ({pct(share)}), medians "
                   f"over {len(pairs)} runs",
                   {"hand_over_s": num(hand, 6), "ttft_s": num(ttft, 6),
                    "share": num(share, 4), "runs": len(pairs)},
                   {"warn_share": HAND_OVER_WARN, "fail_share": HAND_OVER_FAIL},
                   "" if status == "pass" else
                   "the KV transfer, not prefill, sets TTFT here: a faster link or connector "
                   "(NIXL over RDMA/NVLink), fewer KV bytes per token (KV-cache dtype), or "
                   "aggregated serving for short prompts",
                   ev.runs_command)
