"""Checklist rules for disaggregated prefill/decode runs (``probe --prefill … --decode …``).

Pure: read the runs' :class:`~phaseprobe.records.PdLegs`. A decode instance that computes the
prompt itself had no KV to load: the hand-over failed, silently, because the request still
succeeds (only slower). And a hand-over that takes most of the time to first token says the
transfer, not prefill, is what to fix.
"""

from __future__ import annotations

import statistics

from phaseprobe.analysis.rules.base import Evidence, Status, Verdict, ms, num, pct, skipped
from phaseprobe.analysis.rules.live import Part, per_replica, too_few
from phaseprobe.analysis.rules.live_base import MIN_FINISHED, LiveEvidence, ReplicaWindow

__all__ = ["kv_recompute", "hand_over_share", "live_kv_recompute", "HAND_OVER_WARN",
           "HAND_OVER_FAIL", "RECOMPUTE_WARN", "RECOMPUTE_FAIL"]

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
    """Is getting the KV to the decode instance most of the client's time to first token? The
    hand-over (the prefill leg's end to the decode instance scheduling the request: where an
    asynchronous connector such as NIXL waits) plus the decode side's prompt work (where a
    synchronous one such as the ExampleConnector loads the KV, or where a failed hand-over is
    recomputed), over the client TTFT; medians over the runs measured on the pair."""
    rows = [(r.pd.hand_over_s, r.pd.decode_prompt_s or 0.0, r.client.ttft_s) for r in ev.runs
            if r.pd is not None and r.client is not None and r.status == "ok"
            and r.pd.hand_over_s is not None and r.client.ttft_s]
    if not rows:
        return skipped(_NEED, _COMMAND)
    hand = statistics.median(h for h, _, _ in rows)
    load = statistics.median(p for _, p, _ in rows)
    ttft = statistics.median(t for _, _, t in rows if t is not None)
    kv_path = statistics.median(h + p for h, p, _ in rows)
    share = kv_path / ttft if ttft else None
    status = ("fail" if share is not None and share >= HAND_OVER_FAIL else
              "warn" if share is not None and share >= HAND_OVER_WARN else "pass")
    return Verdict(status,  # type: ignore[arg-type]
                   f"hand-over {ms(hand)} + the decode side's prompt work (KV load or "
                   f"recompute) {ms(load)} = {ms(kv_path)} of a {ms(ttft)} TTFT "
                   f"({pct(share)}), medians over {len(rows)} runs",
                   {"hand_over_s": num(hand, 6), "decode_prompt_s": num(load, 6),
                    "kv_path_s": num(kv_path, 6), "ttft_s": num(ttft, 6),
                    "share": num(share, 4), "runs": len(rows)},
                   {"warn_share": HAND_OVER_WARN, "fail_share": HAND_OVER_FAIL},
                   "" if status == "pass" else
                   "getting the KV to the decode instance, not prefill, sets TTFT here: a "
                   "faster link or connector (NIXL over RDMA/NVLink), fewer KV bytes per token "
                   "(KV-cache dtype), or aggregated serving for short prompts; if the "
                   "kv_recompute rule fails, the prompt is being computed twice",
                   ev.runs_command)


RECOMPUTE_WARN = 0.25  # a decode instance's share of prompt tokens it computed itself
RECOMPUTE_FAIL = 0.50
PREFILL_ROLE_MAX_TOKENS = 1.5  # generated tokens per finished request: a prefill instance


def live_kv_recompute(ev: LiveEvidence) -> Verdict:
    """``check --live``: the share of prompt tokens each decode instance computed itself over
    the window (``prompt_tokens_by_source``), judged only on instances with a KV connector
    (its lookups moved). A prefill instance computes every prompt by design: one that
    generated at most ~1 token per finished request is taken for one and left out."""
    def judge(r: ReplicaWindow) -> Part:
        lookups = r.delta("external_prefix_cache_queries")
        ext, comp = r.delta("prompt_source_external_kv_transfer"), \
            r.delta("prompt_source_local_compute")
        hit = r.delta("prompt_source_local_cache_hit") or 0.0
        done, gen = r.finished, r.delta("generation_tokens")
        if ext is None or comp is None:
            return Part(r.name, "skipped", "no prompt_tokens_by_source (vLLM 0.32 or newer)")
        if not lookups:
            return Part(r.name, "skipped", "no KV-connector lookups in the window (not a P/D "
                                           "instance, or idle)")
        if done is not None and done >= 1 and gen is not None \
                and gen / done <= PREFILL_ROLE_MAX_TOKENS:
            return Part(r.name, "skipped", f"a prefill instance ({gen / done:.1f} tokens "
                                           "generated per request): it computes every prompt "
                                           "by design")
        if done is None or done < MIN_FINISHED:
            return too_few(r, ev, done)
        total = ext + comp + hit
        share = comp / total if total else 0.0
        numbers = {"transferred": ext, "computed": comp, "cached": hit,
                   "recompute_share": num(share, 4), "finished": done}
        said = (f"computed {comp:.0f} of {total:.0f} prompt tokens itself ({pct(share)}), "
                f"{ext:.0f} came over the KV connector, over {done:.0f} requests")
        status: Status = ("fail" if share >= RECOMPUTE_FAIL else
                          "warn" if share >= RECOMPUTE_WARN else "pass")
        return Part(r.name, status, said, share, numbers)

    return per_replica(ev, judge, thresholds={"recompute_warn": RECOMPUTE_WARN,
                                              "recompute_fail": RECOMPUTE_FAIL},
                       recommendation="decode instances recompute prompts: the KV hand-over "
                                      "is failing silently (connector config, storage path or "
                                      "side channel, expired KV): each recompute is a full "
                                      "prefill on the decode pool",
                       next_command="phaseprobe probe --prefill URL --decode URL")
