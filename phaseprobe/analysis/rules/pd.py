"""Checklist rules for disaggregated prefill/decode runs (``probe --prefill … --decode …``).

Pure: read the runs' :class:`~phaseprobe.records.PdLegs`. A decode instance that computes the
prompt itself had no KV to load: the hand-over failed, silently, because the request still
succeeds (only slower). And a hand-over that takes most of the time to first token says the
transfer, not prefill, is what to fix.
"""

from __future__ import annotations

import statistics

from phaseprobe.analysis.pd.legs import SHORT_PROMPT
from phaseprobe.analysis.pd.window import PREFILL_ROLE_MAX_TOKENS
from phaseprobe.analysis.replica_window import ReplicaWindow
from phaseprobe.analysis.rules.base import Evidence, Status, Verdict, ms, num, skipped
from phaseprobe.analysis.rules.live import Part, per_replica, too_few
from phaseprobe.analysis.rules.live_base import MIN_FINISHED, LiveEvidence
from phaseprobe.format import pct
from phaseprobe.records import PdLegs

__all__ = [
    "kv_recompute",
    "hand_over_share",
    "live_kv_recompute",
    "prefill_pool_saturated",
    "decode_pool_saturated",
    "kv_wait_as_queue",
    "HAND_OVER_WARN",
    "HAND_OVER_FAIL",
    "RECOMPUTE_WARN",
    "RECOMPUTE_FAIL",
    "PREFILL_ROLE_MAX_TOKENS",
    "POOL_QUEUE_WARN",
    "POOL_QUEUE_FAIL",
    "KV_WAIT_QUEUE_WARN",
]

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
        return Verdict(
            "fail",
            f"the decode instance recomputed the prompt in {len(bad)} of "
            f"{len(told)} runs (run {seq + 1}: {first.kv_reason})",
            numbers,
            {},
            "the KV hand-over is failing silently: check the decode instance's "
            "kv-transfer-config (the same connector and storage path or NIXL "
            "side channel as the prefill instance) and its log for connector "
            "errors; each recompute costs a full prefill on the decode pool",
            ev.runs_command,
        )
    if unknown == len(told):
        return Verdict(
            "skipped",
            f"skipped: whether the KV moved could not be told in any of "
            f"{len(told)} runs ({legs[0][1].kv_reason})",
            numbers,
        )
    moved = kinds.count("transferred")
    short = [pd for _, pd in legs if pd.kv == SHORT_PROMPT]
    if short and not moved:
        return Verdict(
            "skipped",
            f"skipped: {len(short)} of {len(told)} runs had prompts "
            f"shorter than one KV block ({short[0].kv_reason})",
            numbers,
            next_command=_COMMAND + " --prompt-tokens 512",
        )
    rest = (f"; {unknown} not told" if unknown else "") + (
        f"; {len(short)} too short to hand over" if short else ""
    )
    return Verdict("pass", f"the KV was transferred in {moved} of {len(told)} runs{rest}", numbers)


def hand_over_share(ev: Evidence) -> Verdict:
    """Is getting the KV to the decode instance most of the client's time to first token? The
    hand-over (the prefill leg's end to the decode instance scheduling the request: where an
    asynchronous connector such as NIXL waits) plus the decode side's prompt work (where a
    synchronous one such as the ExampleConnector loads the KV, or where a failed hand-over is
    recomputed), over the client TTFT; medians over the runs measured on the pair."""
    rows = [
        (r.pd.hand_over_s, r.pd.decode_prompt_s or 0.0, r.client.ttft_s)
        for r in ev.runs
        if r.pd is not None
        and r.client is not None
        and r.status == "ok"
        and r.pd.hand_over_s is not None
        and r.client.ttft_s
    ]
    if not rows:
        return skipped(_NEED, _COMMAND)
    hand = statistics.median(h for h, _, _ in rows)
    load = statistics.median(p for _, p, _ in rows)
    ttft = statistics.median(t for _, _, t in rows if t is not None)
    kv_path = statistics.median(h + p for h, p, _ in rows)
    share = kv_path / ttft if ttft else None
    status = (
        "fail"
        if share is not None and share >= HAND_OVER_FAIL
        else "warn"
        if share is not None and share >= HAND_OVER_WARN
        else "pass"
    )
    return Verdict(
        status,  # type: ignore[arg-type]
        f"hand-over {ms(hand)} + the decode side's prompt work (KV load or "
        f"recompute) {ms(load)} = {ms(kv_path)} of a {ms(ttft)} TTFT "
        f"({pct(share)}), medians over {len(rows)} runs",
        {
            "hand_over_s": num(hand, 6),
            "decode_prompt_s": num(load, 6),
            "kv_path_s": num(kv_path, 6),
            "ttft_s": num(ttft, 6),
            "share": num(share, 4),
            "runs": len(rows),
        },
        {"warn_share": HAND_OVER_WARN, "fail_share": HAND_OVER_FAIL},
        ""
        if status == "pass"
        else "getting the KV to the decode instance, not prefill, sets TTFT here: a "
        "faster link or connector (NIXL over RDMA/NVLink), fewer KV bytes per token "
        "(KV-cache dtype), or aggregated serving for short prompts; if the "
        "kv_recompute rule fails, the prompt is being computed twice",
        ev.runs_command,
    )


RECOMPUTE_WARN = 0.25  # a decode instance's share of prompt tokens it computed itself
RECOMPUTE_FAIL = 0.50


def live_kv_recompute(ev: LiveEvidence) -> Verdict:
    """``check --live``: the share of prompt tokens each decode instance computed itself over
    the window (``prompt_tokens_by_source``), judged only on instances with a KV connector
    (its lookups moved). A prefill instance computes every prompt by design: one that
    generated at most ~1 token per finished request is taken for one and left out."""

    def judge(r: ReplicaWindow) -> Part:
        lookups = r.delta("external_prefix_cache_queries")
        ext, comp = (
            r.delta("prompt_source_external_kv_transfer"),
            r.delta("prompt_source_local_compute"),
        )
        hit = r.delta("prompt_source_local_cache_hit") or 0.0
        done, gen = r.finished, r.delta("generation_tokens")
        if ext is None or comp is None:
            return Part(r.name, "skipped", "no prompt_tokens_by_source (vLLM 0.32 or newer)")
        if not lookups:
            return Part(
                r.name,
                "skipped",
                "no KV-connector lookups in the window (not a P/D instance, or idle)",
            )
        if (
            done is not None
            and done >= 1
            and gen is not None
            and gen / done <= PREFILL_ROLE_MAX_TOKENS
        ):
            return Part(
                r.name,
                "skipped",
                f"a prefill instance ({gen / done:.1f} tokens "
                "generated per request): it computes every prompt "
                "by design",
            )
        if done is None or done < MIN_FINISHED:
            return too_few(r, ev, done)
        total = ext + comp + hit
        share = comp / total if total else 0.0
        numbers = {
            "transferred": ext,
            "computed": comp,
            "cached": hit,
            "recompute_share": num(share, 4),
            "finished": done,
        }
        said = (
            f"computed {comp:.0f} of {total:.0f} prompt tokens itself ({pct(share)}), "
            f"{ext:.0f} came over the KV connector, over {done:.0f} requests"
        )
        status: Status = (
            "fail" if share >= RECOMPUTE_FAIL else "warn" if share >= RECOMPUTE_WARN else "pass"
        )
        return Part(r.name, status, said, share, numbers)

    return per_replica(
        ev,
        judge,
        thresholds={"recompute_warn": RECOMPUTE_WARN, "recompute_fail": RECOMPUTE_FAIL},
        recommendation="decode instances recompute prompts: the KV hand-over "
        "is failing silently (connector config, storage path or "
        "side channel, expired KV): each recompute is a full "
        "prefill on the decode pool",
        next_command="phaseprobe probe --prefill URL --decode URL",
    )


# -- pools and the KV wait (issue 28 item 6) ---------------------------------------------------

POOL_QUEUE_WARN = 0.25  # a pool's queue (beyond the KV wait, decode side) as a share of TTFT
POOL_QUEUE_FAIL = 0.50
KV_WAIT_QUEUE_WARN = 0.10  # the decode side's queue of a run alone there, as a share of TTFT
_LIVE = "phaseprobe check --live --endpoint ROUTER --replica prefill=URL --replica decode=URL"


def _pd_ok(ev: Evidence) -> list[tuple[int, PdLegs, float]]:
    """(seq, legs, client TTFT) of the completed P/D runs with a client TTFT."""
    return [
        (r.seq, r.pd, r.client.ttft_s)
        for r in ev.runs
        if r.pd is not None and r.client is not None and r.status == "ok" and r.client.ttft_s
    ]


def _share_status(share: float | None) -> Status:
    return (
        "fail"
        if share is not None and share >= POOL_QUEUE_FAIL
        else "warn"
        if share is not None and share >= POOL_QUEUE_WARN
        else "pass"
    )


def prefill_pool_saturated(ev: Evidence) -> Verdict:
    """Is the prefill pool saturated? The prefill leg's queue on its instance (medians over the
    P/D runs) as a share of the client TTFT. phaseprobe sends one request at a time, so a
    queue there is other traffic the prefill instance was serving."""
    rows = [
        (pd.prefill_queue_s, ttft, pd.prefill_isolated)
        for _, pd, ttft in _pd_ok(ev)
        if pd.prefill_queue_s is not None
    ]
    if not rows:
        return skipped(_NEED, _COMMAND)
    queue = statistics.median(q for q, _, _ in rows)
    ttft = statistics.median(t for _, t, _ in rows)
    share = queue / ttft if ttft else None
    shared = sum(1 for _, _, alone in rows if alone is False)
    status = _share_status(share)
    return Verdict(
        status,
        f"prefill-side queue {ms(queue)} of a {ms(ttft)} TTFT ({pct(share)}), "
        f"medians over {len(rows)} runs ({shared} shared the prefill instance "
        "with other requests)",
        {
            "prefill_queue_s": num(queue, 6),
            "ttft_s": num(ttft, 6),
            "share": num(share, 4),
            "runs": len(rows),
            "prefill_shared": shared,
        },
        {"warn_share": POOL_QUEUE_WARN, "fail_share": POOL_QUEUE_FAIL},
        ""
        if status == "pass"
        else "requests wait for a prefill instance: add prefill instances (or GPUs per "
        "instance), raise --max-num-batched-tokens if prefill steps have room, or "
        "route short prompts to aggregated serving",
        _LIVE,
    )


def decode_pool_saturated(ev: Evidence) -> Verdict:
    """Is the decode pool saturated? The decode side's queue holds the KV wait (vLLM books it
    there) and any wait for capacity. Runs alone on the decode instance had no capacity to
    wait for: their median queue is the KV wait. Runs that shared it, beyond that median, are
    capacity queueing, as a share of the client TTFT. Without both kinds of runs it cannot be
    told."""
    rows = [
        (pd.decode_kv_wait_s, ttft, pd.decode_isolated)
        for _, pd, ttft in _pd_ok(ev)
        if pd.decode_kv_wait_s is not None
    ]
    if not rows:
        return skipped(_NEED, _COMMAND)
    alone = [q for q, _, iso in rows if iso is True]
    shared = [(q, t) for q, t, iso in rows if iso is False]
    numbers = {"runs": len(rows), "alone": len(alone), "shared": len(shared)}
    if not shared:
        wait = statistics.median(alone) if alone else None
        return Verdict(
            "skipped",
            f"skipped: cannot tell: no decode leg shared its instance "
            f"with other requests ({len(alone)} ran alone, median queue "
            f"{ms(wait)}: their KV wait); a saturated pool shows under "
            "load, which check --live reads",
            numbers | {"kv_wait_s": num(wait, 6)},
            next_command=_LIVE,
        )
    if not alone:
        return Verdict(
            "skipped",
            f"skipped: cannot tell: all {len(shared)} decode legs shared "
            "their instance, so no run shows the KV wait alone to "
            "subtract",
            numbers,
            next_command=_LIVE,
        )
    kv_wait = statistics.median(alone)
    queue = statistics.median(q for q, _ in shared)
    ttft = statistics.median(t for _, t in shared)
    beyond = max(queue - kv_wait, 0.0)
    share = beyond / ttft if ttft else None
    status = _share_status(share)
    return Verdict(
        status,
        f"decode-side queue {ms(queue)} in {len(shared)} runs that shared the "
        f"decode instance, against {ms(kv_wait)} (the KV wait) in {len(alone)} "
        f"alone: {ms(beyond)} of capacity queueing, {pct(share)} of their "
        f"{ms(ttft)} TTFT (medians)",
        numbers
        | {
            "decode_queue_s": num(queue, 6),
            "kv_wait_s": num(kv_wait, 6),
            "beyond_kv_wait_s": num(beyond, 6),
            "ttft_s": num(ttft, 6),
            "share": num(share, 4),
        },
        {"warn_share": POOL_QUEUE_WARN, "fail_share": POOL_QUEUE_FAIL},
        ""
        if status == "pass"
        else "requests wait for a decode slot beyond their KV: add decode instances, "
        "raise --max-num-seqs if the KV cache has room, or give the KV cache more "
        "memory",
        _LIVE,
    )


def kv_wait_as_queue(ev: Evidence) -> Verdict:
    """Is the decode side's "queue" really KV wait? A decode leg alone on its instance had a
    free instance: whatever vLLM booked as its queue was the wait for its KV (an asynchronous
    connector such as NIXL schedules the request only once the KV has arrived). When that is
    a notable share of TTFT, the fix is the transfer path, not decode capacity."""
    rows = [
        (pd.decode_kv_wait_s, pd.decode_prompt_s, ttft)
        for _, pd, ttft in _pd_ok(ev)
        if pd.decode_kv_wait_s is not None and pd.decode_isolated is True
    ]
    if not rows:
        told = [r for r in ev.runs if r.pd is not None]
        return skipped(
            _NEED
            if not told
            else "decode legs alone on their instance (with "
            "other traffic there, its queue mixes KV wait and capacity)",
            _COMMAND,
        )
    wait = statistics.median(w for w, _, _ in rows)
    load = (
        statistics.median(p for _, p, _ in rows if p is not None)
        if any(p is not None for _, p, _ in rows)
        else None
    )
    ttft = statistics.median(t for _, _, t in rows)
    share = wait / ttft if ttft else None
    numbers = {
        "decode_queue_s": num(wait, 6),
        "decode_prompt_s": num(load, 6),
        "ttft_s": num(ttft, 6),
        "share": num(share, 4),
        "runs": len(rows),
    }
    head = (
        f"decode-side queue {ms(wait)} = {pct(share)} of a {ms(ttft)} TTFT, medians over "
        f"{len(rows)} runs alone on the decode instance"
    )
    if share is None or share < KV_WAIT_QUEUE_WARN:
        return Verdict(
            "pass",
            f"{head}: little KV wait is booked as queue (a synchronous "
            f"connector loads the KV in the decode side's prompt work, "
            f"median {ms(load)})",
            numbers,
            {"warn_share": KV_WAIT_QUEUE_WARN},
        )
    return Verdict(
        "warn",
        f'{head}: nothing else ran there, so this "queue" is the wait for the KV, not for capacity',
        numbers,
        {"warn_share": KV_WAIT_QUEUE_WARN},
        "vLLM books the decode side's KV wait as queue time: adding decode "
        "capacity will not shorten it; the transfer path will (connector, link, "
        "KV bytes per token; see hand_over_share and plan --kv-transfer)",
        ev.runs_command,
    )
