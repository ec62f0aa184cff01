"""Human output: the phase table, the summary and a progress bar (rich, on stderr).

Only this layer knows about rich. Progress goes to stderr so ``--json`` stdout stays clean.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from phaseprobe.format import duration as fmt_duration
from phaseprobe.format import efficiency as fmt_efficiency
from phaseprobe.format import ms_cell as ms  # a table cell in ms
from phaseprobe.present.cli.table_fit import fit_hints
from phaseprobe.records import Run

if TYPE_CHECKING:
    from phaseprobe.analysis.spec_decode import SpecFigures
    from phaseprobe.store import Store

if TYPE_CHECKING:  # imported where used: a command's --help must not load it
    from phaseprobe.analysis.phases import Summary
    from phaseprobe.collect.prom_summary import PromSummaryDoc

__all__ = [
    "RichProgress",
    "progress_bar",
    "render_probe",
    "render_experiments",
    "replica_cell",
    "replica_line",
    "render_pd_legs",
    "render_prom_comparison",
    "render_efficiency",
    "print_schema_note",
    "ms",
]


def progress_bar(console: Console) -> Progress:
    """The one progress bar look: what, bar, n/total, elapsed, ETA (transient, on stderr)."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def print_schema_note(store: Store, err: Console) -> None:
    """Say so when the store is of a newer schema (called once what is shown was read)."""
    note = store.schema_note()
    if note:
        err.print(f"[yellow]note:[/] {escape(note)}")


class RichProgress:
    """Progress bar with ETA over warm-ups and measured runs."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._progress = progress_bar(console)
        self._task: Any = None

    def on_start(self, total: int, warmup: int) -> None:
        self._progress.start()
        self._task = self._progress.add_task("warm-up" if warmup else "runs", total=total + warmup)

    def on_warmup(self, index: int, error: str | None) -> None:
        if error:
            self.console.print(f"[yellow]warm-up {index + 1} failed: {escape(error)}")
        self._progress.update(self._task, advance=1, description="warm-up")

    def on_run(self, run: Run) -> None:
        if run.error:
            self.console.print(f"[red]run {run.seq + 1}: {escape(run.error)}")
        self._progress.update(self._task, advance=1, description="runs")

    def on_end(self) -> None:
        self._progress.stop()


def _count(n: int | None) -> str:
    return "—" if n is None else str(n)


def _itl(run: Run, q: float) -> float | None:
    from phaseprobe.analysis.phases import percentile

    # per token: an event that carried several tokens counts once per token (gap / tokens)
    return percentile(run.client.itl_token_s, q) if run.client else None


def _spec_cells(f: SpecFigures | None) -> tuple[str, str]:
    """A run's acceptance rate and mean accepted length ("—": nothing drafted or no counters)."""
    rate = f.acceptance_rate if f else None
    length = f.mean_accepted_length if f else None
    return (
        "—" if rate is None else f"{rate:.0%}",
        "—" if length is None else f"{length:.2f}",
    )


def _adapter_cells(run: Run) -> tuple[str, str]:
    """The adapter a run asked for and whether it loaded it ("—": the base model; "?": vLLM
    did not say its max_lora)."""
    from phaseprobe.analysis.lora import load_kind

    if run.adapter is None:
        return "—", "—"
    return escape(run.adapter.name), load_kind(run.adapter) or "?"


def render_probe(
    console: Console,
    runs: Sequence[Run],
    summary: Summary,
    info: Mapping[str, Any],
    notes: Iterable[str],
    experiment_id: int,
) -> None:
    from phaseprobe.analysis.client_check import client_consistent
    from phaseprobe.analysis.interplay import concurrent_by_design

    version = info.get("vllm_version")
    by_span = any(r.attributed and not r.isolated for r in runs)
    caption = (
        "times in ms; server columns are vLLM's own per request: its /metrics deltas "
        "(isolated: yes) or the request's own span (isolated: span)"
        if by_span
        else "times in ms; server columns are vLLM's own histograms per request"
    )
    # a failed run has a client timeline without usage, a server that hides /version no
    # version: a table says "—" or leaves it out, never None or "?"
    table = Table(
        title=f"phaseprobe · experiment {experiment_id}"
        + (f" · vLLM {version}" if version else " · vLLM version not reported"),
        caption=caption,
    )
    fleet = bool(info.get("router")) or any(r.replica is not None for r in runs)
    # reasoning streams: time to the first answer token and the tokens of each kind
    reasoned = any(r.client is not None and r.client.reasoned for r in runs)
    # speculative decoding: each run's acceptance from its own counter deltas
    from phaseprobe.analysis.spec_decode import spec_of_run, spec_report

    specs = [spec_of_run(r) for r in runs]
    spec_on = any(f is not None for f in specs)
    lora = any(r.adapter is not None for r in runs)  # the LoRA adapter each run asked for
    columns = (
        "run",
        *(("adapter", "load") if lora else ()),
        "status",
        "TTFT ms",
        *(("TTFA ms",) if reasoned else ()),
        "queue ms",
        "prefill ms",
        "decode ms",
        "TPOT ms",
        "ITL p50 ms",
        "ITL p99 ms",
        "e2e ms",
        "in tok",
        "out tok",
        *(("reason tok", "answer tok") if reasoned else ()),
        *(("accepted %", "accept len") if spec_on else ()),
        "isolated",
        *(("replica",) if fleet else ()),
    )
    # narrow terminals: the caption says "times in ms", so the headers need not
    fit_hints(table, short={c: c.removesuffix(" ms") for c in columns if c.endswith(" ms")})
    for col in columns:
        table.add_column(
            col,
            justify="left" if col in ("status", "replica", "adapter", "load") else "right",
            no_wrap=True,
        )
    for i, r in enumerate(runs):
        c, s = r.client, r.server
        iso = (
            "yes"
            if r.isolated
            else "response"
            if r.attributed and s is not None and s.source == "response"
            else "span"
            if r.attributed
            else "concurrent"
            if concurrent_by_design(r)
            else "n/a"
            if not r.isolation.verified
            else "[red]NO"
        )
        if r.status == "ok" and r.attributed and not client_consistent(r):
            iso += " [yellow]†"  # alone on the server, but its client stamps are not valid
        table.add_row(
            str(r.seq + 1),
            *(_adapter_cells(r) if lora else ()),
            r.status if r.status == "ok" else f"[red]{r.status}",
            ms(c.ttft_s if c else None),
            *((ms(c.ttfa_s if c else None),) if reasoned else ()),
            ms(s.queue_s if s else None, 2),
            ms(s.prefill_s if s else None),
            ms(s.decode_s if s else None),
            ms(c.tpot_s if c else None, 2),
            ms(_itl(r, 50), 2),
            ms(_itl(r, 99), 2),
            ms(c.e2e_s if c else None),
            _count(c.prompt_tokens if c else None),
            _count(c.completion_tokens if c else None),
            *(
                (_count(c.reasoning_tokens if c else None), _count(c.answer_tokens if c else None))
                if reasoned
                else ()
            ),
            *(_spec_cells(specs[i]) if spec_on else ()),
            iso,
            *((replica_cell(r),) if fleet else ()),
        )
    console.print(table)
    if fleet:
        console.print(escape(replica_line(runs)), highlight=False)
    if spec_on:
        console.print(escape(spec_report(runs).sentence()), highlight=False)
    if lora:
        from phaseprobe.analysis.lora import lora_report

        for line in lora_report(runs).lines():
            console.print(escape(line), highlight=False)
    if any(r.pd is not None for r in runs):
        render_pd_legs(console, runs)
    share = summary.decode_share_of_e2e
    console.print(
        f"[bold]median[/] over {summary.n_clean} clean run(s): "
        f"client TTFT {ms(summary.client_ttft_s)} ms · e2e {ms(summary.client_e2e_s)} ms · "
        f"TPOT {ms(summary.client_tpot_s, 2)} ms · ITL p50/p99 {ms(summary.itl_p50_s, 2)}/"
        f"{ms(summary.itl_p99_s, 2)} ms"
        + (
            f" · time to first answer {ms(summary.client_ttfa_s)} ms over "
            f"{summary.n_reasoned} reasoning run(s)"
            if summary.n_reasoned
            else ""
        )
    )
    basis = (
        f"{summary.n_server} run(s): {summary.n_server - summary.n_by_span} alone on it, "
        f"{summary.n_by_span} attributed by their own span"
        if summary.n_by_span
        else f"{summary.n_server} run(s) alone on it"
    )
    console.print(
        f"server (over {basis}): queue "
        f"{ms(summary.server_queue_s, 2)} ms · prefill "
        f"{ms(summary.server_prefill_s)} ms · decode {ms(summary.server_decode_s)} ms · "
        f"decode share of e2e {'—' if share is None else f'{share:.0%}'} · "
        f"client−server TTFT gap {ms(summary.ttft_gap_s)} ms"
    )
    if summary.outside_engine_s is not None:
        console.print(
            f"outside the engine (from the spans): client e2e − (queue + prefill + decode) "
            f"{ms(summary.outside_engine_s)} ms, of which arrival → queued on vLLM's clock "
            f"(HTTP, tokenization; with the first token's way back) "
            f"{ms(summary.pre_engine_s)} ms; "
            + (
                f"{'the router hop: send → the replica' if fleet else 'send → vLLM'}'s arrival "
                f"stamp {ms(summary.way_in_s)} ms and vLLM's end stamp "
                f"→ the client's last byte (delivery after the last token) "
                f"{ms(summary.delivery_s)} ms, on the two wall clocks"
                if summary.delivery_s is not None
                else "the rest is the network and delivery after the last token (the client's and "
                "vLLM's clocks disagree, so they are not split)"
            )
            + " (none of it is prefill)"
        )
    if any(r.status == "ok" and r.attributed and not client_consistent(r) for r in runs):
        console.print(
            "[yellow]†[/] left out of the client medians: its client timeline "
            "contradicts vLLM's phases (see the notes); its server phases count"
        )
    for note in notes:
        # escaped: notes quote server answers (a router's worker URL "http://[/]:8000" was
        # a rich MarkupError, a traceback; "[oops]" vanished from the note as a tag)
        console.print(f"[yellow]note:[/] {escape(note)}")
    bad = [r for r in runs if r.isolation.verified and not r.attributed]
    for r in bad:
        reasons = escape("; ".join(r.isolation.reasons))  # they quote server answers
        console.print(f"[red]run {r.seq + 1} not isolated:[/] {reasons}")


_KV_STYLE = {"transferred": "green", "recomputed": "red", "partial": "yellow"}


def render_pd_legs(console: Console, runs: Sequence[Run]) -> None:
    """Disaggregated prefill/decode: each run's two legs, the hand-over and its KV."""
    table = Table(
        title="prefill/decode legs (each instance's own histograms)",
        caption="hand-over = the prefill leg's end → the decode instance scheduling "
        "the request (gap between the legs + decode-side KV wait, where an "
        "asynchronous connector such as NIXL waits); D prompt = the decode "
        "side's prompt work: a synchronous connector's KV load (the "
        "ExampleConnector's), or the prompt recomputed",
    )
    for col in (
        "run",
        "P queue ms",
        "P prefill ms",
        "hand-over ms",
        "D KV wait ms",
        "D prompt ms",
        "D decode ms",
        "KV",
        "tokens moved / computed",
    ):
        table.add_column(col, justify="left" if col in ("KV",) else "right", no_wrap=True)
    for r in runs:
        p = r.pd
        if p is None:
            continue
        moved = (
            "—"
            if p.tokens_transferred is None
            else f"{p.tokens_transferred:.0f} / {p.tokens_computed or 0:.0f}"
        )
        kv = f"[{_KV_STYLE[p.kv]}]{p.kv}[/]" if p.kv in _KV_STYLE else p.kv
        table.add_row(
            str(r.seq + 1),
            ms(p.prefill_queue_s, 2),
            ms(p.prefill_s),
            ms(p.hand_over_s),
            ms(p.decode_kv_wait_s, 2),
            ms(p.decode_prompt_s),
            ms(p.decode_s),
            kv,
            moved,
        )
    console.print(table)
    _render_pd_spans(console, runs)
    for r in runs:
        if r.pd is not None and r.pd.kv in ("recomputed", "partial", "unknown"):
            console.print(f"[yellow]run {r.seq + 1} KV {r.pd.kv}:[/] {escape(r.pd.kv_reason)}")


def _render_pd_spans(console: Console, runs: Sequence[Run]) -> None:
    """The client-visible TTFT split from each run's two joined leg spans (parts add up)."""
    joined = [(r, r.pd.span_join) for r in runs if r.pd is not None and r.pd.span_join]
    if not joined:
        return
    table = Table(
        title="TTFT from the two legs' spans (each instance's own clock)",
        caption="P in = the prefill leg's arrival → queued; P return = its first "
        "token → its end; the parts add up to the TTFT (prefill leg's "
        "arrival → the decode leg's first token)",
    )
    for col in (
        "run",
        "joined by",
        "P in ms",
        "P queue ms",
        "P prefill ms",
        "P return ms",
        "hand-over ms",
        "D prompt ms",
        "TTFT ms",
        "hand-over share",
    ):
        table.add_column(col, justify="left" if col == "joined by" else "right", no_wrap=True)
    for r, j in joined:
        parts = j.get("ttft_parts_s") or {}
        share = j.get("hand_over_share")
        table.add_row(
            str(r.seq + 1),
            str(j.get("joined_by")),
            *(
                ms(parts.get(k))
                for k in (
                    "prefill_pre_engine_s",
                    "prefill_queue_s",
                    "prefill_s",
                    "prefill_return_s",
                    "hand_over_s",
                    "decode_prompt_s",
                )
            ),
            ms(j.get("ttft_s")),
            "—" if share is None else f"{share:.0%}",
        )
    console.print(table)


def replica_cell(run: Run) -> str:
    """A run's replica as the table shows it: its name, or '?' when it could not be told."""
    rep = run.replica
    if rep is None or rep.name is None:
        return "?" if rep is not None else "—"
    return rep.name if rep.source == "counters" else f"{rep.name} ({rep.source})"


def replica_line(runs: Sequence[Run]) -> str:
    """How many runs each replica served, and why any run's replica is unknown."""
    counts: dict[str, int] = {}
    unknown: list[str] = []
    for r in runs:
        if r.replica is not None and r.replica.name is not None:
            counts[r.replica.name] = counts.get(r.replica.name, 0) + 1
        elif r.status != "error":
            why = (
                r.replica.reason
                if r.replica is not None and r.replica.reason
                else ("no --replica counters and no span with service.instance.id")
            )
            unknown.append(f"run {r.seq + 1}: {why}")
    parts = [f"{name} {n} run{'' if n == 1 else 's'}" for name, n in sorted(counts.items())]
    text = "replicas: " + (", ".join(parts) if parts else "none told")
    if unknown:
        text += f"; replica not told for {len(unknown)} run(s): " + "; ".join(unknown[:3])
    return text


def render_experiments(console: Console, rows: Sequence[dict[str, Any]]) -> None:
    from phaseprobe.analysis.interplay import CONCURRENT_KINDS

    table = Table(title="stored experiments")
    for col in ("id", "name", "kind", "model", "endpoint", "runs", "ok", "isolated", "finished"):
        table.add_column(col)
    for row in rows:
        kind = row["kind"] + ("[yellow]*[/]" if row["kind"] in CONCURRENT_KINDS else "")
        table.add_row(
            str(row["id"]),
            row["name"],
            kind,
            row["model"],
            row["endpoint"],
            str(row["n_runs"]),
            str(row["n_ok"] or 0),
            str(row["n_isolated"] or 0),
            "yes" if row["finished_wall_ns"] else "no",
        )
    console.print(table)


def render_prom_comparison(console: Console, prom: PromSummaryDoc) -> None:
    """PromQL per-request means over the experiment window beside the direct-scrape ones."""
    if "error" in prom:
        # escaped: the error quotes the server ("[/x]" in it was a rich MarkupError)
        console.print(f"[yellow]Prometheus ({escape(prom['url'])}): {escape(str(prom['error']))}")
        return
    table = Table(
        title=f"Prometheus {prom['url']} · {{{prom['selector']}}} · "
        f"window {prom['window_s']:.1f} s",
        caption="per-request means: increase(_sum)/increase(_count) vs direct scrape",
    )
    for col in ("query", "PromQL", "direct scrape", "diff"):
        table.add_column(col, justify="left" if col == "query" else "right")
    for name, p in prom["prometheus"].items():
        d = prom["direct"].get(name)
        share = name == "decode_share"

        def fmt(v: float | None, share: bool = share) -> str:
            if v is None:
                return "—"
            return f"{v:.1%}" if share else f"{v * 1e3:.2f} ms"

        diff = "—" if p is None or d is None or not d else f"{(p - d) / d:+.1%}"
        table.add_row(name, fmt(p), fmt(d), diff)
    console.print(table)
    for note in prom["disagreements"]:
        console.print(f"[red]disagreement:[/] {escape(note)}")
    if not prom["disagreements"]:
        console.print("PromQL and the direct scrape agree.")


def render_efficiency(console: Console, eff: Mapping[str, Any]) -> None:
    """The roofline line: each phase's physical bound, measured time and efficiency; a phase
    that beat its bound gets no efficiency but a warning naming the underestimated peak."""
    if "skipped" in eff:
        console.print(f"[dim]roofline: {escape(str(eff['skipped']))}", highlight=False)
        return

    def verdict(phase: str) -> str:
        if eff.get(f"{phase}_bound_beaten"):
            return "[red]bound beaten[/] (see below)"
        v = eff.get(f"{phase}_efficiency")
        return f"efficiency {fmt_efficiency(v)}"

    console.print(
        f"roofline ({escape(str(eff['peaks']))}): decode bound "
        f"{fmt_duration(eff['decode_bound_s_per_token'])}/token vs measured "
        f"{fmt_duration(eff['decode_measured_s_per_token'])}/token → {verdict('decode')} · "
        f"prefill bound ({eff['prefill_bound_kind'] or '?'}) "
        f"{fmt_duration(eff['prefill_bound_s'])} vs {fmt_duration(eff['prefill_measured_s'])} "
        f"→ {verdict('prefill')}",
        highlight=False,
    )
    for warning in eff.get("warnings") or []:
        console.print(f"[yellow]roofline warning:[/] {escape(warning)}", highlight=False)


def render_work(console: Console, work: Mapping[str, Any] | None) -> None:
    """vLLM's own FLOPs and bytes per request beside phaseprobe's (medians, vLLM / phaseprobe),
    then each disagreement beyond 20 % with what each model counts; nothing when skipped."""
    if not work or "skipped" in work:
        return
    rows = work.get("runs") or []

    def median_of(key: str) -> str:
        values = sorted(r[key] for r in rows if r.get(key) is not None)
        return f"{values[len(values) // 2]:.3g}" if values else "—"

    def ratio(key: str) -> str:
        v = work.get(f"{key}_ratio")
        return "—" if v is None else f"×{v:.2f}"

    parts = [
        f"{label} vLLM {median_of('vllm_' + key)} / phaseprobe "
        f"{median_of('model_' + key)} ({ratio(key)})"
        for key, label in (
            ("flops", "FLOPs"),
            ("read_bytes", "bytes read"),
            ("write_bytes", "bytes written"),
        )
    ]
    console.print(
        f"work per request (vLLM's --enable-mfu-metrics counters beside phaseprobe's "
        f"model, {len(rows)} isolated run(s)): " + " · ".join(parts),
        highlight=False,
    )
    for finding in work.get("findings") or []:
        console.print(f"[yellow]two models disagree:[/] {escape(finding)}", highlight=False)


def prompt_sources_line(runs: Sequence[Run]) -> str | None:
    """Where the isolated runs' prompt tokens came from, summed (vLLM's
    prompt_tokens_by_source and prompt_tokens_cached_by_source deltas); None: not exported."""
    from phaseprobe.analysis.vllm_work import prompt_sources_summary

    summary = prompt_sources_summary(runs)
    return None if summary is None else "prompt tokens by source " + summary.text()
