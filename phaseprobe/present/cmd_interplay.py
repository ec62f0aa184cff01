"""``phaseprobe prefix | batch | interfere``: effects that exist only between requests.

    phaseprobe prefix --endpoint URL --prefix-tokens 512
    phaseprobe batch --endpoint URL --concurrency 1,2,4,8 --max-tokens 128
    phaseprobe interfere --endpoint URL --b-prompt-tokens 2000 --at-token 16

Without ``--endpoint`` the local CPU vLLM with the tiny model is started, used and stopped, as
for ``phaseprobe probe``. Every probe is stored as an experiment of its own kind.
"""

from __future__ import annotations

import argparse
import json
from contextlib import ExitStack
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.collect.interplay import (
    BatchResult,
    InterfereResult,
    PrefixResult,
    Target,
    run_batch,
    run_interfere,
    run_prefix,
)
from phaseprobe.errors import ConfigError
from phaseprobe.paths import default_store_path
from phaseprobe.present.args import positive_int, store_and_json_args
from phaseprobe.present.endpoint import api_key_from_env, endpoint_or_local, first_model
from phaseprobe.store import Store, redact_url

__all__ = ["register", "run", "COMMANDS"]

COMMANDS = ("prefix", "batch", "interfere")


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of integers, e.g. 1,2,4"
                                         ) from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("concurrency levels must be at least 1")
    return levels


def _common(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument("--endpoint", help="base URL of an OpenAI-compatible vLLM server "
                   "(default: start the local CPU vLLM)")
    p.add_argument("--model", help="model name (default: the endpoint's first model)")
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                   help="per-request timeout (default: 120)")
    p.add_argument("--api-key-env", metavar="VAR", help="environment variable holding the "
                   "API key (default: OPENAI_API_KEY, then VLLM_API_KEY)")
    p.add_argument("--name", default=name, help=f"experiment name in the store (default: {name})")
    store_and_json_args(p)
    p.set_defaults(interplay=name)


def register(subparsers: Any) -> None:
    """Add ``prefix``, ``batch`` and ``interfere`` to the CLI's subparsers."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "prefix", help="measure prefix-cache reuse: the same long prefix, cold then warm",
        formatter_class=fmt,
        description="Per repetition, a fresh shared prefix is sent twice with different "
                    "suffixes: cold (nothing cached), then warm (the prefix's KV blocks can be "
                    "reused). Both are isolated runs: TTFT, vLLM's prefill time and the "
                    "prefix_cache_queries/hits deltas per request. vLLM caches whole KV blocks "
                    "(block size from cache_config_info): a prefix shorter than one block "
                    "never hits.")
    p.add_argument("--prefix-tokens", type=positive_int, default=512,
                   help="shared prefix length in tokens (default: 512)")
    p.add_argument("--suffix-tokens", type=positive_int, default=16,
                   help="distinct suffix per request (default: 16)")
    p.add_argument("--max-tokens", type=positive_int, default=4, help="tokens to generate "
                   "(default: 4: prefill is what is measured)")
    p.add_argument("--reps", type=positive_int, default=3, help="cold/warm pairs (default: 3)")
    _common(p, "prefix")

    p = subparsers.add_parser(
        "batch", help="measure decode throughput and ITL as concurrency rises",
        formatter_class=fmt,
        description="At each concurrency level, that many streams start together; the "
                    "aggregate output tokens/s is taken over the steady window when every "
                    "stream is decoding (ramp and tail excluded; the whole span when that "
                    "window is short or tokens arrive in bursts). Shows per-stream TPOT, ITL, "
                    "the scaling ratio vs the lowest level and where scaling stops, with the "
                    "server's waiting/running/KV-usage/preemption readings as the why.")
    p.add_argument("--concurrency", type=_levels, default=(1, 2, 4, 8, 16, 32),
                   metavar="N,N,…", help="levels (default: 1,2,4,8,16,32)")
    p.add_argument("--prompt-tokens", type=positive_int, default=32,
                   help="prompt length per stream (default: 32)")
    p.add_argument("--max-tokens", type=positive_int, default=128,
                   help="tokens per stream; sets how long each level runs (default: 128)")
    _common(p, "batch")

    p = subparsers.add_parser(
        "interfere", help="measure how a long prefill stalls a decoding request",
        formatter_class=fmt,
        description="Stream A decodes alone (baseline), then again while request B with a "
                    "long prompt arrives mid-decode (at A's token --at-token, timed from the "
                    "baseline). A's stall: the largest A gap overlapping B's prefill, and the "
                    "time A lost vs its baseline ITL; B's TTFT. JSON carries the swimlane "
                    "data (token arrival times of A and B per pair). To compare chunked "
                    "prefill on/off, run it against two endpoints (or two A/B arms).")
    p.add_argument("--a-prompt-tokens", type=positive_int, default=32,
                   help="A's prompt length (default: 32)")
    p.add_argument("--a-tokens", type=positive_int, default=64,
                   help="tokens A generates (default: 64)")
    p.add_argument("--b-prompt-tokens", type=positive_int, default=600,
                   help="B's prompt length: the long prefill (default: 600)")
    p.add_argument("--b-tokens", type=positive_int, default=1,
                   help="tokens B generates (default: 1)")
    p.add_argument("--at-token", type=positive_int, default=16,
                   help="send B when A is at about this token (default: 16)")
    p.add_argument("--reps", type=positive_int, default=3,
                   help="baseline runs and A/B pairs (default: 3)")
    _common(p, "interfere")


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    kind = getattr(args, "interplay", None)
    if kind not in COMMANDS:
        raise ConfigError(f"unknown interplay probe {kind!r}")
    api_key = api_key_from_env(args.api_key_env)

    def progress(line: str) -> None:
        err.print(f"[dim]{escape(line)}")

    with ExitStack() as stack:
        endpoint = endpoint_or_local(args.endpoint, stack, err)
        model = args.model or first_model(endpoint, api_key)
        target = Target(endpoint=endpoint, model=model, api_key=api_key, chat=args.chat,
                        timeout_s=args.timeout)
        store = stack.enter_context(Store(args.store or default_store_path()))
        result: PrefixResult | BatchResult | InterfereResult
        if kind == "prefix":
            result = run_prefix(target, store, prefix_tokens=args.prefix_tokens,
                                suffix_tokens=args.suffix_tokens, max_tokens=args.max_tokens,
                                reps=args.reps, name=args.name, progress=progress)
        elif kind == "batch":
            result = run_batch(target, store, levels=args.concurrency,
                               prompt_tokens=args.prompt_tokens, max_tokens=args.max_tokens,
                               name=args.name, progress=progress)
        else:
            result = run_interfere(target, store, a_prompt_tokens=args.a_prompt_tokens,
                                   a_tokens=args.a_tokens, b_prompt_tokens=args.b_prompt_tokens,
                                   b_tokens=args.b_tokens, at_token=args.at_token,
                                   reps=args.reps, name=args.name, progress=progress)
    if args.json:
        doc = {"kind": kind, "endpoint": redact_url(endpoint), "model": model,
               "server": result.server_info, **result.to_dict()}
        out.out(json.dumps(doc), highlight=False)  # plain: no markup, no wrapping
    elif isinstance(result, PrefixResult):
        render_prefix(out, result)
    elif isinstance(result, BatchResult):
        render_batch(out, result)
    else:
        render_interfere(out, result)
    return 0 if any(r.status != "error" for r in result.runs) else 1


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v * 1000:.1f}"


def _num(v: float | None, fmt: str = "{:g}") -> str:
    return "—" if v is None else fmt.format(v)


def _notes(out: Console, notes: list[str]) -> None:
    for note in notes:
        out.print(f"[yellow]note:[/] {escape(note)}")


def render_prefix(out: Console, r: PrefixResult) -> None:
    t = Table(title=f"prefix reuse (experiment {r.experiment_id}): shared prefix "
                    f"{_num(r.prefix_tokens)} tokens, KV block {_num(r.block_size)} tokens, "
                    f"up to {_num(r.expected_hit_tokens)} tokens can hit")
    for col in ("pass", "runs", "TTFT ms", "server prefill ms", "prefix queries", "prefix hits"):
        t.add_column(col, justify="left" if col == "pass" else "right")
    for name in ("cold", "warm"):
        s = r.summary[name]
        t.add_row(name, _num(s["runs"]), _ms(s["ttft_s"]), _ms(s["server_prefill_s"]),
                  _num(s["prefix_cache_queries"]), _num(s["prefix_cache_hits"]))
    out.print(t)
    cold, warm = r.summary["cold"]["ttft_s"], r.summary["warm"]["ttft_s"]
    if cold and warm:
        out.print(f"warm TTFT is {warm / cold * 100:.0f}% of cold")
    _notes(out, r.notes)


def render_batch(out: Console, r: BatchResult) -> None:
    t = Table(title=f"batch scaling (experiment {r.experiment_id})")
    for col in ("concurrency", "streams ok", "tokens/s", "over", "× vs lowest", "efficiency",
                "server tok/s", "server ×",
                "TPOT ms", "ITL p50 ms", "ITL p99 ms", "max waiting", "max KV %",
                "preemptions"):
        t.add_column(col, justify="right")
    for lv in r.levels:
        ratio = r.scaling.ratios.get(lv.concurrency)
        eff = r.scaling.efficiency.get(lv.concurrency)
        t.add_row(str(lv.concurrency), str(lv.streams_ok), _num(lv.tokens_per_s, "{:.1f}"),
                  lv.rate_basis,
                  _num(ratio, "{:.2f}"), _num(eff, "{:.0%}"),
                  _num(lv.server_tokens_per_s, "{:.1f}"),
                  _num(r.scaling.server_ratios.get(lv.concurrency), "{:.2f}"),
                  _ms(lv.tpot_median_s),
                  _ms(lv.itl_p50_s), _ms(lv.itl_p99_s), _num(lv.max_waiting),
                  _num(lv.max_kv_usage * 100 if lv.max_kv_usage is not None else None,
                       "{:.1f}"), _num(lv.preemptions))
    out.print(t)
    if r.scaling.stops_at is not None:
        out.print(f"scaling stops after concurrency {r.scaling.stops_at}:")
        for why in r.scaling.why:
            out.print(f"  - {escape(why)}")
    else:
        out.print("throughput still rose at every level tested")
    _notes(out, r.notes)


def render_interfere(out: Console, r: InterfereResult) -> None:
    t = Table(title=f"interference (experiment {r.experiment_id}): A decoding, B's long "
                    f"prefill arriving; A-alone TPOT {_ms(r.baseline_itl_s)} ms, "
                    f"TTFT {_ms(r.baseline_ttft_s)} ms")
    for col in ("pair", "B sent at ms", "B TTFT ms", "A max ITL ms", "× baseline",
                "A time lost ms", "A gaps in window"):
        t.add_column(col, justify="right")
    for i, s in enumerate(r.stalls):
        t.add_row(str(i), _ms(s.b_arrival_s), _ms(s.b_ttft_s), _ms(s.max_itl_s),
                  _num(s.ratio, "{:.1f}"), _ms(s.extra_s), str(s.gaps_in_window))
    out.print(t)
    sm = r.summary()
    out.print(f"A alone over the same window (control): max ITL {_ms(sm['control_max_itl_s'])} "
              f"ms, time lost {_ms(sm['control_extra_s'])} ms; with B: max ITL "
              f"{_ms(sm['max_itl_s'])} ms, time lost {_ms(sm['extra_s'])} ms (medians)")
    out.print(f"A's decode on vLLM's clock: alone {_ms(sm['server_decode_alone_s'])} ms, with B "
              f"{_ms(sm['server_decode_with_b_s'])} ms (medians; needs --b-tokens 1)")
    _notes(out, r.notes)
