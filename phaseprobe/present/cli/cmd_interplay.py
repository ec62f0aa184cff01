"""``phaseprobe prefix | batch | interfere``: effects that exist only between requests.

    phaseprobe prefix --endpoint URL --prefix-tokens 512
    phaseprobe batch --endpoint URL --concurrency 1,2,4,8 --max-tokens 128
    phaseprobe interfere --endpoint URL --b-prompt-tokens 2000      # B timed automatically
    phaseprobe interfere --endpoint URL --at-token 16
    phaseprobe interfere --endpoint URL --endpoint-b URL2 --arm-names chunked,unchunked
    phaseprobe interfere --playbook cpu-interfere-chunked
    phaseprobe interfere --prefill URL_P --decode URL_D [--endpoint ROUTER]   # a P/D pair

Without ``--endpoint`` the local CPU vLLM with the tiny model is started, used and stopped, as
for ``phaseprobe probe``. Every probe is stored as an experiment of its own kind; a two-arm
interfere stores one experiment per arm. ``--prefill URL --decode URL`` (optionally with
``--endpoint ROUTER``, a router in P/D mode) run the probe on a disaggregated pair, as
``phaseprobe probe`` does; each instance's own /metrics is read where its work runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape

from phaseprobe.errors import ConfigError
from phaseprobe.paths import default_store_path
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import (
    MAX_CONCURRENCY,
    MAX_SECONDS,
    count,
    non_negative_seconds,
    seconds,
    store_and_json_args,
    tokens,
)
from phaseprobe.redact import redact_url

if TYPE_CHECKING:  # imported where used: a command's --help must not load it
    from phaseprobe.collect.interplay import ArmsResult, InterfereSettings

__all__ = ["register", "run"]


def _levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        raise argparse.ArgumentTypeError("a comma-separated list of integers, e.g. 1,2,4") from None
    if not levels or levels[0] < 1 or levels[-1] > MAX_CONCURRENCY:
        raise argparse.ArgumentTypeError(
            f"concurrency levels must be between 1 and {MAX_CONCURRENCY} streams"
        )
    return levels


# What each probe reads on a prefill/decode pair (the --prefill help of each command).
_PD_READS = {
    "prefix": "the prefix hits, server prefill time and KV residency are the prefill "
    "instance's (prompts are computed and cached there); beside them, both "
    "instances' prompt tokens by source (the decode instance's: received by KV "
    "transfer, from its own cache, or computed)",
    "batch": "the decode instance's readings (pace, waiting, running, KV usage, preemptions: "
    "every stream decodes there), with the prefill instance's most waiting/running "
    "requests per level",
    "interfere": "B's long prefill runs on the prefill instance while A decodes on the "
    "decode instance: A's stall is measured as on one server, beside what each "
    "instance did with B (its prefill time; the KV B's decode leg received or "
    "computed)",
}


def _common(p: argparse.ArgumentParser, name: str) -> None:
    p.add_argument(
        "--endpoint",
        help="base URL of an OpenAI-compatible vLLM server "
        "(default: start the local CPU vLLM); with --prefill/--decode: a router in "
        "P/D mode in front of them",
    )
    p.add_argument(
        "--prefill",
        metavar="URL",
        default=None,
        help="disaggregated prefill/decode: the prefill instance (with --decode). "
        "With --endpoint (a router in P/D mode) requests go through it; "
        "without, phaseprobe sends the two legs itself (prefill with "
        "max_tokens=1, then the whole request to the decode instance). On the "
        f"pair, {_PD_READS[name]}",
    )
    p.add_argument(
        "--decode",
        metavar="URL",
        default=None,
        help="disaggregated prefill/decode: the decode instance (with --prefill)",
    )
    p.add_argument("--model", help="model name (default: the endpoint's first model)")
    p.add_argument(
        "--replica",
        action="append",
        metavar="[NAME=]URL",
        default=None,
        help="a replica behind the --endpoint router (repeat for each): runs are "
        "attributed on the replica whose own /metrics moved, never through "
        "the router's /metrics",
    )
    p.add_argument("--chat", action="store_true", help="use /v1/chat/completions")
    p.add_argument(
        "--timeout",
        type=seconds,
        default=120.0,
        metavar="SECONDS",
        help="per-request timeout (default: 120)",
    )
    p.add_argument(
        "--deadline",
        type=seconds,
        default=600.0,
        metavar="SECONDS",
        help="the most one request may take in all, however the server trickles "
        "its bytes (default: 600)",
    )
    p.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the "
        "API key (default: OPENAI_API_KEY, then VLLM_API_KEY)",
    )
    p.add_argument("--name", default=name, help=f"experiment name in the store (default: {name})")
    store_and_json_args(p)
    p.set_defaults(interplay=name)


def register(subparsers: Any) -> None:
    """Add ``prefix``, ``batch`` and ``interfere`` to the CLI's subparsers."""
    fmt = argparse.RawDescriptionHelpFormatter
    p = subparsers.add_parser(
        "prefix",
        help="measure prefix-cache reuse: the same long prefix, cold then warm",
        formatter_class=fmt,
        description="Per repetition, a fresh shared prefix is sent twice with different "
        "suffixes: cold (nothing cached), then warm (the prefix's KV blocks can be "
        "reused). Both are isolated runs: TTFT, vLLM's prefill time and the "
        "prefix_cache_queries/hits deltas per request. vLLM caches whole KV blocks "
        "(block size from cache_config_info): a prefix shorter than one block "
        "never hits. With vLLM 0.32 or later, beside the timings: where each "
        "isolated run's prompt tokens came from (vllm:prompt_tokens_by_source: "
        "computed, local cache hit, external KV transfer; "
        "prompt_tokens_cached_by_source: by tier), and, when the server runs with "
        "--kv-cache-metrics, KV block residency over the experiment (lifetime, "
        "idle before eviction, reuse gap: the histograms' increases between the "
        "first and last scrape), judged as check --live judges it: blocks evicted "
        "sooner than their typical reuse gap mean the prefix cache is too small "
        "for the traffic.",
    )
    p.add_argument(
        "--prefix-tokens",
        type=tokens,
        default=512,
        help="shared prefix length in tokens (default: 512)",
    )
    p.add_argument(
        "--suffix-tokens", type=tokens, default=16, help="distinct suffix per request (default: 16)"
    )
    p.add_argument(
        "--max-tokens",
        type=tokens,
        default=4,
        help="tokens to generate (default: 4: prefill is what is measured)",
    )
    p.add_argument("--reps", type=count, default=3, help="cold/warm pairs (default: 3)")
    _common(p, "prefix")

    p = subparsers.add_parser(
        "batch",
        help="measure decode throughput and ITL as concurrency rises",
        formatter_class=fmt,
        description="At each concurrency level, that many streams start together; the "
        "aggregate output tokens/s is taken over the steady window when every "
        "stream is decoding (ramp and tail excluded; the whole span when that "
        "window is short or tokens arrive in bursts). Shows per-stream TPOT, ITL, "
        "the scaling ratio vs the lowest level and where scaling stops, with the "
        "server's waiting/running/KV-usage/preemption readings as the why.",
    )
    p.add_argument(
        "--concurrency",
        type=_levels,
        default=(1, 2, 4, 8, 16, 32),
        metavar="N,N,…",
        help="levels (default: 1,2,4,8,16,32)",
    )
    p.add_argument(
        "--prompt-tokens", type=tokens, default=32, help="prompt length per stream (default: 32)"
    )
    p.add_argument(
        "--max-tokens",
        type=tokens,
        default=128,
        help="tokens per stream; sets how long each level runs (default: 128)",
    )
    p.add_argument(
        "--repeats",
        type=count,
        default=1,
        metavar="R",
        help="rounds per level, round-robin over the levels; each level reports "
        "the median over its rounds (default: 1)",
    )
    _common(p, "batch")

    p = subparsers.add_parser(
        "interfere",
        help="measure how a long prefill stalls a decoding request",
        formatter_class=fmt,
        description="Stream A decodes alone (baseline), then again while request B with a "
        "long prompt arrives mid-decode: by default at A's first token + 25 percent of "
        "A's decode, both measured on the A-alone runs (so B's prefill has the "
        "rest of A's decode to run in); or when A's --at-token-th token reaches "
        "the client, or --at-time seconds after A's send. Only pairs whose B "
        "prefill ran inside A's decode count: others (B too late, A already done) "
        "are discarded, counted, and retried up to 2 × --reps pairs; the verdict "
        "quotes its numbers. A's stall: the largest A gap "
        "overlapping B's prefill, and the time A lost vs its baseline ITL; B's "
        "TTFT. JSON carries the swimlane data (token arrival times of A and B per "
        "pair). Two arms (--endpoint-b, or --playbook whose arms phaseprobe "
        "launches, e.g. chunked prefill on/off) run interleaved, one experiment "
        "per arm, and are compared: medians, ratio with a bootstrap interval, "
        "verdict.",
    )
    p.add_argument(
        "--a-prompt-tokens",
        type=tokens,
        default=None,
        help="A's prompt length (default: 32, or the playbook's prompt_tokens)",
    )
    p.add_argument(
        "--a-tokens",
        type=tokens,
        default=None,
        help="tokens A generates (default: 64, or the playbook's max_tokens)",
    )
    p.add_argument(
        "--b-prompt-tokens",
        type=tokens,
        default=600,
        help="B's prompt length: the long prefill (default: 600)",
    )
    p.add_argument("--b-tokens", type=tokens, default=1, help="tokens B generates (default: 1)")
    p.add_argument(
        "--at-token",
        type=tokens,
        default=None,
        metavar="K",
        help="send B when A's K-th token reaches the client (default: automatic "
        "timing from A's measured decode)",
    )
    p.add_argument(
        "--at-time",
        type=_at_time,
        default=None,
        metavar="SECONDS|auto",
        help="send B this long after A's send instead; 'auto': when A should "
        "reach --at-token, estimated from the baseline on vLLM's clock (for a "
        "starved API server that delivers tokens in bursts)",
    )
    p.add_argument(
        "--reps",
        type=count,
        default=None,
        help="baseline runs and A/B pairs per arm (default: 3, or the playbook's runs)",
    )
    p.add_argument(
        "--endpoint-b",
        metavar="URL",
        help="a second arm: the same experiment against this endpoint too",
    )
    p.add_argument("--model-b", help="model name at --endpoint-b (default: its first model)")
    p.add_argument(
        "--arm-names",
        type=_arm_names,
        default=("a", "b"),
        metavar="A,B",
        help="names of the two arms with --endpoint-b (default: a,b)",
    )
    p.add_argument(
        "--playbook",
        metavar="NAME|PATH",
        help="an A/B playbook (e.g. cpu-interfere-chunked): its arms are the two "
        "arms, launched by phaseprobe; [run] gives A's prompt_tokens, "
        "max_tokens (A's length), runs (pairs), warmup, pause_s, min_effect",
    )
    p.add_argument(
        "--pause",
        type=non_negative_seconds,
        default=None,
        metavar="SECONDS",
        help="quiet time before each step with two arms (default: the playbook's pause_s, else 0)",
    )
    p.add_argument(
        "--min-effect",
        type=_effect,
        default=None,
        metavar="PCT",
        help="smallest change worth calling between arms (default: the playbook's, else 5%%)",
    )
    _common(p, "interfere")


def _at_time(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("seconds (e.g. 0.5) or 'auto'") from None
    # nan, inf (1e400) or a negative time would reach int() and the trigger's arithmetic
    if not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(
            f"seconds from 0 to {MAX_SECONDS:g} (a week) or 'auto', not {text}"
        )
    return value


def _effect(text: str) -> float:
    """--min-effect checked as ``ab`` checks it (a positive effect, "5%" or 0.05), at the
    command line: before any server is started or asked."""
    from phaseprobe.collect.ab.playbook import PlaybookError, parse_effect

    try:
        return parse_effect(text)
    except PlaybookError:
        raise argparse.ArgumentTypeError(
            f'{text!r} is not a positive effect such as "5%" or 0.05'
        ) from None


def _arm_names(text: str) -> tuple[str, str]:
    names = [x.strip() for x in text.split(",")]
    if len(names) != 2 or not all(names) or names[0] == names[1]:
        raise argparse.ArgumentTypeError("two different names, e.g. chunked,unchunked")
    return names[0], names[1]


def _interfere_settings(args: argparse.Namespace) -> InterfereSettings:
    from phaseprobe.collect.interplay import InterfereSettings, Trigger

    at = args.at_time
    if at is None:
        trigger = Trigger() if args.at_token is None else Trigger("token", args.at_token)
    elif at == "auto":
        trigger = Trigger("estimate", args.at_token or 16)
    else:
        trigger = Trigger("time", at)
    return InterfereSettings(
        a_prompt_tokens=args.a_prompt_tokens or 32,
        a_tokens=args.a_tokens or 64,
        b_prompt_tokens=args.b_prompt_tokens,
        b_tokens=args.b_tokens,
        trigger=trigger,
        reps=args.reps or 3,
    )


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect.fleet.targets import parse_replicas
    from phaseprobe.collect.interplay import (
        ArmsResult,
        BatchResult,
        InterfereArm,
        InterfereResult,
        PrefixResult,
        Target,
        run_batch,
        run_interfere,
        run_interfere_arms,
        run_prefix,
    )
    from phaseprobe.collect.pd.topology import pd_pair
    from phaseprobe.collect.session import Session, SessionOptions
    from phaseprobe.collect.target import (
        api_key_from_env,
        endpoint_url,
        served_model,
    )
    from phaseprobe.present.cli.render_interplay import (
        render_batch,
        render_interfere,
        render_prefix,
    )
    from phaseprobe.present.cli.waiting import ConsoleNotices

    kind = args.interplay
    api_key = api_key_from_env(args.api_key_env)

    def progress(line: str) -> None:
        err.print(f"[dim]{escape(line)}")

    # both or neither, never with --replica: before anything starts
    topo = pd_pair(args.prefill, args.decode, args.endpoint, replicas=bool(args.replica))
    if topo is not None and kind == "interfere" and (args.playbook or args.endpoint_b):
        raise ConfigError("--prefill/--decode measure one pair: drop --endpoint-b/--playbook")
    if kind == "interfere" and args.playbook:
        return _run_playbook(args, out, api_key, progress)
    replicas = parse_replicas(args.replica)
    if replicas and not args.endpoint:
        raise ConfigError("--replica needs --endpoint (the router the replicas are behind)")
    if replicas and kind == "batch":
        # a level's streams would be spread over the replicas by the router: its readings
        # (waiting, KV usage, the server's decode rate) belong to one server
        raise ConfigError(
            "batch measures one server's concurrency: give one replica's own URL "
            "as --endpoint (behind a router the streams of a level are split "
            "over the replicas)"
        )
    # on a pair the session checks the model where requests go: the router, or the decode leg
    endpoint_given = (topo.router or topo.decode) if topo is not None else args.endpoint
    options = SessionOptions(
        store_path=str(args.store or default_store_path()),
        endpoint=endpoint_given,
        api_key=api_key,
        model=args.model,
    )
    # the session checks a wrong --model before any run
    with Session(options, ConsoleNotices(err)) as session:
        endpoint, model, store = session.endpoint, session.model, session.store
        target = Target(
            endpoint=endpoint,
            model=model,
            api_key=api_key,
            chat=args.chat,
            timeout_s=args.timeout,
            deadline_s=args.deadline,
            replicas=replicas,
            pd=topo,
        )
        result: PrefixResult | BatchResult | InterfereResult | ArmsResult
        if kind == "prefix":
            result = run_prefix(
                target,
                store,
                prefix_tokens=args.prefix_tokens,
                suffix_tokens=args.suffix_tokens,
                max_tokens=args.max_tokens,
                reps=args.reps,
                name=args.name,
                progress=progress,
            )
        elif kind == "batch":
            result = run_batch(
                target,
                store,
                levels=args.concurrency,
                prompt_tokens=args.prompt_tokens,
                max_tokens=args.max_tokens,
                rounds=args.repeats,
                name=args.name,
                progress=progress,
            )
        elif args.endpoint_b:
            endpoint_b = endpoint_url(args.endpoint_b)
            model_b = served_model(endpoint_b, api_key, args.model_b, "--model-b")
            target_b = replace(target, endpoint=endpoint_b, model=model_b)
            arms = [
                InterfereArm(n, t, {"endpoint": redact_url(t.endpoint)})
                for n, t in zip(args.arm_names, (target, target_b))
            ]
            result = run_interfere_arms(
                arms,
                store,
                _interfere_settings(args),
                name=args.name,
                pause_s=args.pause or 0.0,
                min_effect=args.min_effect or 0.05,
                progress=progress,
            )
        else:
            result = run_interfere(
                target, store, _interfere_settings(args), name=args.name, progress=progress
            )
    if isinstance(result, ArmsResult):
        endpoints = [redact_url(endpoint), redact_url(endpoint_url(args.endpoint_b))]
        return _emit_arms(args, out, result, {"endpoints": endpoints})
    if args.json:
        doc = {
            "kind": kind,
            "endpoint": redact_url(endpoint),
            "model": model,
            **({"pd": topo.to_dict()} if topo is not None else {}),
            "server": result.server_info,
            **result.to_dict(),
        }
        out.out(jsonout.dumps(doc), highlight=False)  # plain: no markup, no wrapping
    elif isinstance(result, PrefixResult):
        render_prefix(out, result)
    elif isinstance(result, BatchResult):
        render_batch(out, result)
    else:
        render_interfere(out, result)
    return 0 if any(r.status != "error" for r in result.runs) else 1


def _run_playbook(
    args: argparse.Namespace, out: Console, api_key: str | None, progress: Callable[[str], None]
) -> int:
    from phaseprobe.collect.ab.playbook import load_playbook
    from phaseprobe.collect.interplay import interfere_playbook, playbook_settings
    from phaseprobe.store import Store

    if args.endpoint or args.endpoint_b:
        raise ConfigError("--playbook brings its own arms: drop --endpoint/--endpoint-b")
    playbook = load_playbook(args.playbook)
    settings = playbook_settings(playbook, _interfere_settings(args))
    overrides = {
        k: v
        for k, v in (
            ("a_prompt_tokens", args.a_prompt_tokens),
            ("a_tokens", args.a_tokens),
            ("reps", args.reps),
        )
        if v is not None
    }
    settings = replace(settings, **overrides)
    if args.pause is not None or args.min_effect is not None:
        playbook = replace(
            playbook,
            run=replace(
                playbook.run,
                pause_s=playbook.run.pause_s if args.pause is None else args.pause,
                min_effect=playbook.run.min_effect if args.min_effect is None else args.min_effect,
            ),
        )
    with Store(args.store or default_store_path()) as store:
        result = interfere_playbook(
            playbook,
            store,
            settings,
            name=None if args.name == "interfere" else args.name,
            api_key=api_key,
            progress=progress,
        )
    return _emit_arms(args, out, result, {"playbook_path": playbook.path})


def _emit_arms(
    args: argparse.Namespace, out: Console, result: ArmsResult, extra: dict[str, Any]
) -> int:
    from phaseprobe.present.cli.render_interplay import render_arms

    if args.json:
        doc = {"kind": "interfere", "mode": "arms", **extra, **result.to_dict()}
        out.out(jsonout.dumps(doc), highlight=False)
    else:
        render_arms(out, result)
    ok = all(any(r.status != "error" for r in res.runs) for res in result.arms.values())
    return 0 if ok else 1
