"""Tables for ``phaseprobe prefix | batch | interfere`` (rich; only this layer knows about it)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.analysis.interplay import ARM_METRICS
from phaseprobe.collect.interplay import ArmsResult, BatchResult, InterfereResult, PrefixResult
from phaseprobe.format import ms_cell as _ms

__all__ = ["render_prefix", "render_batch", "render_interfere", "render_arms"]


def _num(v: float | None, fmt: str = "{:g}") -> str:
    return "—" if v is None else fmt.format(v)


def _notes(out: Console, notes: Iterable[str]) -> None:
    for note in notes:
        out.print(f"[yellow]note:[/] {escape(note)}")


def _ms_fine(v: float | None) -> str:
    """ms with significant digits below 1 ms, so a 5 µs gap reads 0.005, never 0.0."""
    return _ms(v) if v is None or abs(v) >= 1e-3 else _ms(v, 3)


def _table(title: str, columns: tuple[str, ...], left: tuple[str, ...] = ()) -> Table:
    t = Table(title=title)
    for col in columns:
        # A header is never cut: its unit is in it. A narrow console wraps the table instead.
        t.add_column(
            col,
            justify="left" if col in left else "right",
            min_width=max(len(w) for w in col.split("\n")),
            no_wrap=True,
        )
    return t


def _pd_line(out: Console, info: Mapping[str, Any]) -> None:
    """Which pair was measured, and how the requests reached it (nothing on one server)."""
    pd = info.get("pd")
    if not isinstance(pd, Mapping):
        return
    how = (
        f"through the router {pd.get('router')}"
        if pd.get("router")
        else "legs sent by phaseprobe (prefill max_tokens=1, then the decode leg)"
    )
    out.print(
        escape(f"P/D pair: prefill {pd.get('prefill')}, decode {pd.get('decode')}, {how}"),
        highlight=False,
    )


def _verdict(out: Console, kind: str, text: str) -> None:
    colour = {
        "interference": "red",
        "no interference": "green",
        "reuse": "green",
    }.get(kind, "yellow")
    out.print(f"[bold {colour}]verdict:[/] {escape(text)}")


def render_prefix(out: Console, r: PrefixResult) -> None:
    _pd_line(out, r.server_info)
    t = _table(
        f"prefix reuse (experiment {r.experiment_id}): shared prefix "
        f"{_num(r.prefix_tokens)} tokens, KV block {_num(r.block_size)} tokens, "
        f"up to {_num(r.expected_hit_tokens)} tokens can hit",
        (
            "pass",
            "runs",
            "TTFT ms",
            "server prefill ms",
            "prefix queries (tokens)",
            "prefix hits (tokens)",
        ),
        left=("pass",),
    )
    for name in ("cold", "warm"):
        s = r.summary[name]
        t.add_row(
            name,
            _num(s["runs"]),
            _ms(s["ttft_s"]),
            _ms(s["server_prefill_s"]),
            _num(s["prefix_cache_queries"]),
            _num(s["prefix_cache_hits"]),
        )
    out.print(t)
    v = r.verdict()
    _verdict(out, v.kind, v.text)
    pd = r.pd_text()
    if pd:
        out.print(escape(pd), highlight=False)
    # vLLM's own account of its prefix cache: prompt sources per pass, KV residency
    for src in r.sources:
        for line in src.lines():
            out.print(escape(line), highlight=False)
    if r.residency is not None:
        res = r.residency
        verdict = res.residency.evicted_before_reuse if res.residency else None
        colour = "yellow" if verdict is None else "red" if verdict else "green"
        where = "" if res.instance == "server" else f" ({res.instance} instance)"
        out.print(
            f"[{colour}]KV residency over the experiment{escape(where)}:[/] {escape(res.said)}",
            highlight=False,
        )
    _notes(out, r.notes)


def render_batch(out: Console, r: BatchResult) -> None:
    _pd_line(out, r.server_info)
    many = any(lv.rounds > 1 for lv in r.levels)
    cols = (
        "concurrency",
        *(("rounds",) if many else ()),
        "streams ok",
        "client tok/s",
        "rate over",
        "× vs lowest",
        "efficiency %",
        "server tok/s",
        "server ×",
        *(("round spread %",) if many else ()),
    )
    t = _table(f"batch scaling (experiment {r.experiment_id}): aggregate output tokens/s", cols)
    for lv in r.levels:
        ratio = r.scaling.ratios.get(lv.concurrency)
        eff = r.scaling.efficiency.get(lv.concurrency)
        row = [
            str(lv.concurrency),
            *((str(lv.rounds),) if many else ()),
            str(lv.streams_ok),
            _num(lv.tokens_per_s, "{:.1f}"),
            lv.rate_basis,
            _num(ratio, "{:.2f}"),
            _num(eff * 100 if eff is not None else None, "{:.0f}"),
            _num(lv.server_tokens_per_s, "{:.1f}"),
            _num(r.scaling.server_ratios.get(lv.concurrency), "{:.2f}"),
        ]
        if many:
            row.append(
                _num(lv.round_spread * 100 if lv.round_spread is not None else None, "{:.0f}")
            )
        t.add_row(*row)
    out.print(t)
    pd = "pd" in r.server_info
    t = _table(
        "per-stream latency and server pressure"
        + (" (server: the decode instance; prefill: the prefill instance)" if pd else ""),
        (
            "concurrency",
            "TPOT ms",
            "ITL p50 ms",
            "ITL p99 ms",
            "burst gaps %",
            "max waiting",
            "max running",
            "max KV %",
            "preemptions",
            *(("prefill max\nwaiting", "prefill max\nrunning") if pd else ()),
        ),
    )
    for lv in r.levels:
        row = [
            str(lv.concurrency),
            _ms_fine(lv.tpot_median_s),
            _ms_fine(lv.itl_p50_s),
            _ms_fine(lv.itl_p99_s),
            _num(lv.burst_share * 100 if lv.burst_share is not None else None, "{:.0f}"),
            _num(lv.max_waiting),
            _num(lv.max_running),
            _num(lv.max_kv_usage * 100 if lv.max_kv_usage is not None else None, "{:.1f}"),
            _num(lv.preemptions),
        ]
        if pd:
            seen = r.prefill_pressure.get(lv.concurrency, {})
            row += [_num(seen.get("requests_waiting")), _num(seen.get("requests_running"))]
        t.add_row(*row)
    out.print(t)
    if many:
        out.print(
            "each level: the median over its rounds (round spread: (max − min) ÷ median "
            "of the rounds' tokens/s; streams ok: the fewest in any round)"
        )
    bursty = [
        lv.concurrency for lv in r.levels if lv.burst_share is not None and lv.burst_share >= 0.5
    ]
    if bursty:
        out.print(
            f"[yellow]note:[/] at concurrency {', '.join(map(str, bursty))} most tokens "
            "reached the client in bursts (burst gaps: gaps under 10 % of the per-stream "
            "pace, vLLM's when known), so "
            "ITL percentiles measure delivery, not decode: TPOT and server tok/s give "
            "the decode pace"
        )
    kind = "no knee" if r.scaling.stops_at is None else "knee"
    _verdict(out, kind, r.scaling.verdict + ":")
    for why in r.scaling.why:
        out.print(f"  - {escape(why)}")
    _notes(out, r.notes)


def render_interfere(out: Console, r: InterfereResult, arm: str | None = None) -> None:
    _pd_line(out, r.server_info)
    who = f"arm {arm}, " if arm else ""
    t = _table(
        f"interference ({who}experiment {r.experiment_id}): A decoding, B's long "
        f"prefill sent {r.trigger.describe()}; A-alone TPOT "
        f"{_ms(r.baseline_itl_s)} ms, TTFT {_ms(r.baseline_ttft_s)} ms",
        (
            "pair",
            "B sent\nat ms",
            "A events\nbefore B",
            "A events",
            "B TTFT\nms",
            "A last\nevent ms",
            "B's prefill",
            "A max\nITL ms",
            "×\nbaseline",
            "A time\nlost ms",
            "A gaps\nin window",
        ),
        left=("B's prefill",),
    )
    for i, s in enumerate(r.stalls):
        t.add_row(
            str(i),
            _ms(s.b_arrival_s),
            str(s.a_tokens_before_b),
            str(s.a_events),
            _ms(s.b_ttft_s),
            _ms(s.a_last_s),
            "inside A's decode" if s.overlapped else f"{s.overlap}: discarded",
            _ms_fine(s.max_itl_s),
            _num(s.ratio, "{:.1f}"),
            _ms_fine(s.extra_s),
            str(s.gaps_in_window),
        )
    out.print(t)
    sm = r.summary()
    out.print(
        f"A alone over the same window (control): max ITL "
        f"{_ms_fine(sm['control_max_itl_s'])} ms, time lost "
        f"{_ms_fine(sm['control_extra_s'])} ms; with B: max ITL {_ms_fine(sm['max_itl_s'])}"
        f" ms, time lost {_ms_fine(sm['extra_s'])} ms (medians over "
        f"{sm['pairs_used']:.0f} of {sm['pairs']:.0f} pairs: those with B's prefill "
        "inside A's decode)"
    )
    out.print(
        f"A's decode on vLLM's clock: alone {_ms(sm['server_decode_alone_s'])} ms, with B "
        f"{_ms(sm['server_decode_with_b_s'])} ms (medians; needs --b-tokens 1)"
    )
    out.print(
        f"per prompt token of B: {escape(r.token_cost().text)}; `phaseprobe watch` "
        "estimates the same cost from live traffic"
    )
    v = r.verdict()
    _verdict(out, v.kind, v.text)
    pd = r.pd_summary()
    if pd is not None:
        out.print(escape(pd.sentence(v.kind)), highlight=False)
    _notes(out, r.notes)


def render_arms(out: Console, r: ArmsResult) -> None:
    """Each arm's pairs, then one table side by side and the comparison of B's arm to A's."""
    for name, res in r.arms.items():
        render_interfere(out, res, arm=name)
        out.print()
    names = list(r.arms)
    t = _table(
        "interference by arm (medians over the pairs with B's prefill inside A's "
        "decode)" + (f" · playbook {r.playbook}" if r.playbook else ""),
        (
            "arm",
            "experiment",
            "pairs\nused",
            "A-alone\nTPOT ms",
            "A max\nITL ms",
            "×\nbaseline",
            "A time\nlost ms",
            "B TTFT\nms",
            "control max\nITL ms",
            "server decode\nalone ms",
            "server decode\nwith B ms",
        ),
        left=("arm",),
    )
    for name in names:
        res = r.arms[name]
        sm = res.summary()
        t.add_row(
            name,
            str(res.experiment_id),
            f"{len(res.used)}/{len(res.stalls)}",
            _ms(sm["baseline_itl_s"]),
            _ms(sm["max_itl_s"]),
            _num(sm["ratio"], "{:.1f}"),
            _ms(sm["extra_s"]),
            _ms(sm["b_ttft_s"]),
            _ms(sm["control_max_itl_s"]),
            _ms(sm["server_decode_alone_s"]),
            _ms(sm["server_decode_with_b_s"]),
        )
    out.print(t)
    c = r.comparison
    t = Table(
        title=f"arm {c['arm_b']} vs arm {c['arm_a']} (ratio of medians, "
        f"{c['arm_b']} ÷ {c['arm_a']}; lower is better)"
    )
    for col in ("quantity", c["arm_a"], c["arm_b"], "ratio", "95% CI", "p", "verdict"):
        t.add_column(col, justify="left" if col in ("quantity", "verdict") else "right")
    warnings: list[str] = []
    for key, label in ARM_METRICS:
        m = c["metrics"][key]
        lo, hi = m["ci_low"], m["ci_high"]
        ci = "—" if lo is None and hi is None else f"{_num(lo, '{:.2f}')}–{_num(hi, '{:.2f}')}"
        t.add_row(
            label,
            _ms(m["median_a"]),
            _ms(m["median_b"]),
            _num(m["ratio"], "{:.2f}"),
            ci,
            _num(m["p_value"], "{:.2g}"),
            m["verdict"],
        )
        warnings.extend(m["warnings"])
    out.print(t)
    _notes(out, [*r.notes, *warnings])
