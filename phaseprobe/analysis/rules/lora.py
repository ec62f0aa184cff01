"""LoRA adapter thrash: do adapter loads inflate TTFT?

Reads a stored experiment's runs that asked for LoRA adapters
(:func:`phaseprobe.analysis.lora.lora_report`): the runs that had to load their adapter (it was
not among the last ``max_loras`` asked for) against those that found it warm, on client TTFT.
The verdict quotes both medians, the added milliseconds, the ratio's bootstrap interval and the
Mann-Whitney p; with fewer than :data:`~phaseprobe.analysis.lora.MIN_RUNS` of either it says
"too thin" and concludes nothing.

- **fail** (thrash): loads are measurably slower (by at least ``MIN_EFFECT``) and at least
  :data:`THRASH_SHARE` of the adapter runs loaded: more adapters in rotation than slots.
- **warn**: loads are measurably slower but rare: each load costs, the rotation is not thrashing.
- **pass**: no measurable load cost, where one of :data:`MAX_MDE` of the warm TTFT would have
  been seen (the minimum detectable effect is quoted); a noisier measure is "too thin".
"""

from __future__ import annotations

from phaseprobe.analysis.lora import MIN_EFFECT, MIN_RUNS, lora_report
from phaseprobe.analysis.rules.base import Evidence, Verdict, num, skipped

__all__ = ["adapter_thrash", "ADVICE", "THRASH_SHARE", "MAX_MDE"]

THRASH_SHARE = 0.25  # a quarter of the adapter requests loading their adapter is thrash
# "no load cost" is said only when a cost of this share of the warm TTFT could have been seen
MAX_MDE = 0.5

ADVICE = (
    "more adapters are in rotation than vLLM keeps: raise --max-loras (GPU slots; each costs "
    "max_lora_rank-sized buffers) and --max-cpu-loras (adapters kept in host memory, so a swap "
    "skips the disk read), or route each adapter to fewer replicas so each keeps its own warm"
)


def adapter_thrash(ev: Evidence) -> Verdict:
    """Loads against warm runs on TTFT (fail: they cost and are frequent)."""
    rep = lora_report(ev.runs)
    if not rep.used:
        return skipped(
            "runs that asked for LoRA adapters",
            "phaseprobe probe --endpoint URL --adapters A,B,C --runs 20",
        )
    cost = rep.ttft
    numbers: dict[str, object] = {
        "max_loras": rep.max_loras,
        "loads": rep.loads,
        "warm": rep.warm,
        "load_unknown": rep.unknown,
        "ttft": cost.to_dict() if cost else None,
        "prefill": rep.prefill.to_dict() if rep.prefill else None,
    }
    th = {
        "min_runs_each": MIN_RUNS,
        "min_effect": MIN_EFFECT,
        "thrash_share": THRASH_SHARE,
        "max_detectable_for_pass": MAX_MDE,
    }
    if cost is None:
        return Verdict(
            "skipped",
            f"skipped: vLLM did not say its max_lora for {rep.unknown} adapter run(s) "
            "(vllm:lora_requests_info absent): loads cannot be told from warm runs",
            numbers,
            th,
        )
    said = cost.text()
    if cost.thin:
        return Verdict(
            "skipped",
            f"too thin: {said}",
            numbers,
            th,
            next_command="phaseprobe probe --endpoint URL --adapters A,B,C --runs 20",
        )
    share = rep.loads / max(1, rep.loads + rep.warm)
    numbers["load_share"] = num(share, 3)
    if not cost.costs:
        mde = cost.comparison.mde
        if mde is None or mde > MAX_MDE:
            # no cost seen, but none this small could have been: not a pass
            at = f"{mde:.0%}" if mde is not None else "no spread measured"
            return Verdict(
                "skipped",
                f"too thin: {said}, but at this noise only a load cost of {at} or more "
                f"could be seen (a pass needs {MAX_MDE:.0%} or less): more runs",
                numbers,
                th,
                next_command="phaseprobe probe --endpoint URL --adapters A,B,C --runs 40",
            )
        return Verdict(
            "pass", f"{said} (detectable at this noise: {mde:.0%} and more)", numbers, th
        )
    head = f"{rep.loads} of {rep.loads + rep.warm} adapter runs loaded their adapter ({share:.0%})"
    if share >= THRASH_SHARE:
        return Verdict(
            "fail", f"adapter thrash: {head}; {said}", numbers, th, ADVICE, ev.runs_command
        )
    return Verdict("warn", f"{head}; {said}", numbers, th, ADVICE)
