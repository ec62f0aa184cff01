"""``phaseprobe model``: a step-cost model of one vLLM deployment, what load it serves within an
SLO, and a check of that prediction against a real load.

    phaseprobe model fit [--endpoint URL --step-log FILE] [--max-num-seqs N] [--quick]
    phaseprobe model fit --from-spans --window 15m [--spans-from URL] [--fit ID]
    phaseprobe model predict --rates 0.5,1,2 [--slo ttft=0.5,tpot=0.05] [--prompt-tokens 128]
    phaseprobe model predict --pd 1:2 [--hand-over-ms 20]   # a prefill/decode split, on paper
    phaseprobe model predict --replay bench.json | --replay-spans 15m
    phaseprobe model check --rates 1,3 [--endpoint URL] [--requests 40]
    phaseprobe model check --rates 1,3 --slo ttft=0.5 --search-slo [--search-rates 4]
    phaseprobe model check --from-bench bench.json          # vllm bench's own run as the truth

``fit`` runs probes phaseprobe designs (prompt lengths, concurrencies, a mixed burst) and fits
the engine step's cost from vLLM's step log and the client's timings; with no ``--endpoint`` it
starts the local CPU vLLM with its step log. ``predict`` simulates vLLM's scheduler with that
cost. ``check`` runs a real open-loop load and prints predicted against measured.
``fit --from-spans`` refits the step cost of a server already busy from its request spans in
a window (no probe, no step log), keeping a base fit's scheduler limits. ``fit --peaks`` refuses
a cost faster than the hardware can go.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from phaseprobe.errors import ConfigError
from phaseprobe.present.cli import jsonout
from phaseprobe.present.cli.args import (
    MAX_TOKENS,
    float_in,
    int_in,
    store_and_json_args,
)
from phaseprobe.present.cli.waiting import ConsoleNotices

if TYPE_CHECKING:
    from phaseprobe.collect.capacity.model_fit import LimitsGiven

__all__ = ["register", "run", "parse_slo", "parse_rates", "parse_split"]


def parse_slo(text: str) -> dict[str, float]:
    """``ttft=0.5,tpot=0.05`` (seconds; ``500ms`` also) → {"ttft": 0.5, "tpot": 0.05}."""
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.strip().partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot"):
            raise argparse.ArgumentTypeError(
                f"not an SLO term: {part!r} "
                "(use ttft=SECONDS,tpot=SECONDS, e.g. ttft=0.5,tpot=0.05)"
            )
        v = value.strip().lower()
        scale = 1e-3 if v.endswith("ms") else 1.0
        v = v.removesuffix("ms").removesuffix("s")
        try:
            seconds = float(v) * scale
        except ValueError:
            raise argparse.ArgumentTypeError(f"{key}: not a time: {value!r}") from None
        if not (0 < seconds < 3600):
            raise argparse.ArgumentTypeError(f"{key}: must be between 0 and 3600 s, not {value!r}")
        out[key] = seconds
    return out


def parse_rates(text: str) -> list[float]:
    """``0.5,1,2`` → request rates per second (each above 0, at most 10,000)."""
    rates = []
    for part in text.split(","):
        try:
            r = float(part)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a rate: {part!r}") from None
        if not (0 < r <= 10_000):
            raise argparse.ArgumentTypeError(
                f"a rate is requests per second in (0, 10000]: {part!r}"
            )
        rates.append(r)
    return rates


def parse_split(text: str) -> tuple[int, int]:
    """``2:3`` → (2 prefill instances, 3 decode instances), each 1 to 1024."""
    p, sep, d = text.partition(":")
    try:
        counts = (int(p), int(d)) if sep else None
    except ValueError:
        counts = None
    if counts is None or not all(1 <= c <= 1024 for c in counts):
        raise argparse.ArgumentTypeError(
            f"not a prefill:decode split: {text!r} (e.g. 1:2, each count 1 to 1024)"
        )
    return counts


def _workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt-tokens",
        type=int_in(1, MAX_TOKENS),
        default=128,
        metavar="N",
        help="prompt length in tokens (default: 128)",
    )
    p.add_argument(
        "--output-tokens",
        type=int_in(1, MAX_TOKENS),
        default=64,
        metavar="N",
        help="output length in tokens (default: 64)",
    )
    p.add_argument(
        "--slo",
        type=parse_slo,
        default=None,
        metavar="ttft=S,tpot=S",
        help="the SLO: TTFT and/or TPOT limits in seconds (e.g. ttft=0.5,tpot=0.05)",
    )
    p.add_argument(
        "--share",
        type=float_in(0.5, 0.999),
        default=0.9,
        metavar="F",
        help="DistServe's target share of requests meeting the SLO (default: 0.9)",
    )
    p.add_argument(
        "--fit",
        type=int_in(1, 2**62),
        default=None,
        metavar="ID",
        help="the stored fit to use (default: the newest)",
    )


def _limit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--max-num-seqs",
        type=int_in(1, 65536),
        default=None,
        metavar="N",
        help="vLLM's --max-num-seqs",
    )
    p.add_argument(
        "--max-num-batched-tokens",
        type=int_in(1, 1 << 24),
        default=None,
        metavar="N",
        help="vLLM's --max-num-batched-tokens (the token budget)",
    )
    p.add_argument(
        "--no-chunked-prefill", action="store_true", help="vLLM's --no-enable-chunked-prefill"
    )


def register(subparsers: Any) -> None:
    model = subparsers.add_parser(
        "model",
        help="capacity model: fit step costs, predict the largest SLO rate, check it",
        description="A step-cost model of one vLLM deployment fitted from phaseprobe's own "
        "probes, a simulation of vLLM's scheduler that says what load it serves within an "
        "SLO, and a check of that prediction against a real open-loop load.",
    )
    sub = model.add_subparsers(dest="model_command", required=True, metavar="ACTION")
    fit = sub.add_parser(
        "fit",
        help="fit the engine step's cost from probes and vLLM's step log",
        description="Run designed probes (prompt lengths, concurrencies, a mixed burst) and "
        "fit the step time from vLLM's step log (--enable-logging-iteration-details) and the "
        "client's timings. Without --endpoint, the local CPU vLLM is started with its step "
        "log and the limits given here.",
    )
    fit.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="a running vLLM (needs --step-log; default: start the local CPU vLLM)",
    )
    fit.add_argument(
        "--step-log",
        type=Path,
        default=None,
        metavar="FILE",
        help="that server's log, written with --enable-logging-iteration-details",
    )
    fit.add_argument("--model", default=None, help="served model name (default: the first listed)")
    fit.add_argument(
        "--quick",
        action="store_true",
        help="fewer probe points (about a third of the time; for a first look and CI)",
    )
    fit.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the API key"
    )
    spans = fit.add_argument_group(
        "refit from spans (a server already busy: no probe, no step log)"
    )
    spans.add_argument(
        "--from-spans",
        action="store_true",
        help="fit from the request spans that finished in --window instead of probes",
    )
    spans.add_argument(
        "--window",
        type=_age,
        default=900.0,
        metavar="AGE",
        help="the spans that finished this long ago until now (e.g. 15m, 2h; default: 15m)",
    )
    spans.add_argument(
        "--spans-from",
        default=None,
        metavar="URL",
        help="a fleet's span store (chdb:DIR, clickhouse://…, tempo://…, jaeger://…) "
        "instead of phaseprobe's store",
    )
    spans.add_argument(
        "--spans-store",
        type=Path,
        default=None,
        metavar="FILE",
        help="the phaseprobe store `watch` fills with spans (default: --store)",
    )
    spans.add_argument(
        "--fit",
        type=int_in(1, 2**62),
        default=None,
        metavar="ID",
        help="the base fit whose limits the refit keeps (default: the store's newest, if any)",
    )
    bound = fit.add_argument_group("roofline check (a fit faster than the hardware is refused)")
    bound.add_argument(
        "--peaks",
        default=None,
        metavar="GPU|calibrated",
        help="hardware peaks: a GPU from the datasheet table, or `calibrated` (this machine's "
        "`phaseprobe calibrate`)",
    )
    bound.add_argument(
        "--model-config",
        type=Path,
        default=None,
        metavar="PATH",
        help="the served model's config.json or directory (default for the local vLLM: its own)",
    )
    _limit_args(fit)
    store_and_json_args(fit)

    predict = sub.add_parser(
        "predict",
        help="simulate vLLM's scheduler with a stored fit: latency per rate, largest SLO rate",
        description="Simulate vLLM's scheduler over a workload with a stored fit: TTFT, TPOT, "
        "ITL and E2E percentiles per rate (with bootstrap bands), the saturation rate and what "
        "binds it, and the largest rate meeting the SLO. Limits given here are a what-if.",
    )
    predict.add_argument(
        "--rates",
        type=parse_rates,
        default=None,
        metavar="R1,R2",
        help="request rates per second to simulate (default: a sweep up to saturation)",
    )
    predict.add_argument(
        "--requests",
        type=int_in(50, 200_000),
        default=None,
        metavar="N",
        help="simulated requests per rate (default: 1000, or a replayed trace's length if more)",
    )
    replay = predict.add_mutually_exclusive_group()
    replay.add_argument(
        "--replay",
        type=Path,
        default=None,
        metavar="FILE",
        help="replay a `vllm bench serve --save-result --save-detailed` file: its send "
        "pattern (rescaled to each rate) and its requests' lengths (default rate: its own)",
    )
    replay.add_argument(
        "--replay-spans",
        type=_age,
        default=None,
        metavar="AGE",
        help="replay the requests whose spans finished this long ago until now (e.g. 15m), "
        "from --spans-from or --spans-store",
    )
    predict.add_argument(
        "--spans-from", default=None, metavar="URL", help="with --replay-spans: a span store URL"
    )
    predict.add_argument(
        "--spans-store",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --replay-spans: the phaseprobe store holding the spans (default: --store)",
    )
    predict.add_argument(
        "--arrivals",
        default="poisson",
        metavar="KIND",
        help="poisson (default), constant, or gamma:CV (bursty, e.g. gamma:2)",
    )
    predict.add_argument(
        "--replicas",
        type=int_in(1, 1024),
        default=1,
        metavar="N",
        help="what-if: N replicas behind round robin",
    )
    predict.add_argument(
        "--pd",
        type=parse_split,
        default=None,
        metavar="P:D",
        help="what-if: P prefill and D decode instances (disaggregated), each pool behind "
        "round robin; compared with the same P+D instances aggregated",
    )
    predict.add_argument(
        "--hand-over-ms",
        type=float_in(0, 600_000),
        default=None,
        metavar="MS",
        help="with --pd: the hand-over from the prefill leg's end to the decode instance's "
        "scheduling (default: the median measured by `probe --prefill --decode` in the store)",
    )
    _workload_args(predict)
    _limit_args(predict)
    store_and_json_args(predict)

    check = sub.add_parser(
        "check",
        help="run a real open-loop load and set it against the prediction",
        description="Send a real open-loop load at each rate (phaseprobe's own generator), "
        "time every request, and print predicted against measured for each percentile, with "
        "the relative error. The prediction uses the same arrival times the load achieved.",
    )
    check.add_argument(
        "--endpoint",
        default=None,
        metavar="URL",
        help="the server to load (default: start the local CPU vLLM with the fit's limits)",
    )
    check.add_argument(
        "--model", default=None, help="served model name (default: the first listed)"
    )
    check.add_argument(
        "--rates",
        type=parse_rates,
        default=None,
        metavar="R1,R2",
        help="request rates per second to run (required unless --from-bench)",
    )
    check.add_argument(
        "--from-bench",
        type=Path,
        default=None,
        metavar="FILE",
        help="no load: set the prediction against a `vllm bench serve --save-result "
        "--save-detailed` file, replaying its send times and lengths",
    )
    check.add_argument(
        "--requests",
        type=int_in(5, 100_000),
        default=40,
        metavar="N",
        help="requests per rate (default: 40)",
    )
    check.add_argument("--seed", type=int_in(0, 2**31), default=0, metavar="N", help="arrival seed")
    check.add_argument(
        "--alone",
        type=int_in(0, 100),
        default=3,
        metavar="N",
        help="requests sent one by one before the load, set against the model's cost for a "
        "request alone: a machine slower or faster than at fit time (2x or more) is said, "
        "not blamed on the model; 0 skips it (default: 3)",
    )
    search = check.add_argument_group(
        "measured largest SLO rate (a bisection over real loads of --requests each, after the "
        "--rates, set against the predicted one)"
    )
    search.add_argument(
        "--search-slo", action="store_true", help="search for the measured largest SLO rate"
    )
    search.add_argument(
        "--search-lo",
        type=float_in(0.001, 10_000),
        default=None,
        metavar="R",
        help="first rate to try when no --rates point meets the SLO (default: half the "
        "predicted largest SLO rate)",
    )
    search.add_argument(
        "--search-hi",
        type=float_in(0.001, 10_000),
        default=None,
        metavar="R",
        help="first rate to try when every --rates point meets it (default: 1.5 x predicted)",
    )
    search.add_argument(
        "--search-rates",
        type=int_in(1, 20),
        default=4,
        metavar="N",
        help="most loads the search sends (default: 4)",
    )
    search.add_argument(
        "--search-budget",
        type=float_in(1, 86_400),
        default=300.0,
        metavar="S",
        help="seconds the search may take; a load that would end later is not sent (default: 300)",
    )
    search.add_argument(
        "--search-tol",
        type=float_in(0.01, 0.9),
        default=0.1,
        metavar="F",
        help="stop when the bracket is narrower than this share of its top (default: 0.1)",
    )
    check.add_argument(
        "--api-key-env", metavar="VAR", help="environment variable holding the API key"
    )
    _workload_args(check)
    store_and_json_args(check)


def _age(text: str) -> float:
    from phaseprobe.collect.spans.retention import parse_age

    try:
        seconds = parse_age(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if seconds > 366 * 86400:
        raise argparse.ArgumentTypeError(f"{text!r}: a window of at most a year")
    return seconds


def run(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.model_command == "fit" and args.from_spans:
        return _fit_spans(args, out, err)
    if args.model_command == "fit":
        return _fit(args, out, err)
    if args.model_command == "predict":
        return _predict(args, out, err)
    return _check(args, out, err)


def _store(args: argparse.Namespace) -> Path:
    from phaseprobe.paths import default_store_path

    return Path(args.store) if args.store else default_store_path()


def _api_key(args: argparse.Namespace) -> str | None:
    from phaseprobe.collect.target import api_key_from_env

    return api_key_from_env(args.api_key_env)


def _limits_given(args: argparse.Namespace) -> LimitsGiven:
    """The scheduler limits given by _limit_args' flags (None: not given): what a fit starts
    the local vLLM with and records, and what a prediction changes in its fit's limits."""
    from phaseprobe.collect.capacity.model_fit import LimitsGiven

    return LimitsGiven(
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        chunked_prefill=False if args.no_chunked_prefill else None,
    )


def _refuse_given(flags: tuple[tuple[Any, str], ...], message: str) -> None:
    """Raises ConfigError with ``message`` (``{flag}``: its name) for the first of ``flags``
    (value, name) that was given (not None): a flag that does not go with the others."""
    for given, name in flags:
        if given is not None:
            raise ConfigError(message.format(flag=name))


def _ms(v: float | None) -> str:
    return "–" if v is None else f"{v * 1e3:.2f}"


def _pct(v: float | None) -> str:
    return "–" if v is None else f"{v * 100:.1f} %"


def _peaks(args: argparse.Namespace) -> Any:
    from phaseprobe.collect.efficiency import resolve_peaks, validate_options

    if args.peaks is None:
        if args.model_config is not None:
            raise ConfigError("--model-config goes with --peaks (the roofline check)")
        return None
    validate_options(args.peaks, None)
    return resolve_peaks(args.peaks)


def _fit(args: argparse.Namespace, out: Console, err: Console) -> int:
    from phaseprobe.collect.capacity.fit_run import DEFAULT_DESIGN, QUICK_DESIGN
    from phaseprobe.collect.capacity.model_fit import fit_deployment

    if args.step_log is not None and args.endpoint is None:
        raise ConfigError("--step-log goes with --endpoint (the log of that server)")
    _refuse_given(
        (
            (args.spans_from, "--spans-from"),
            (args.spans_store, "--spans-store"),
            (args.fit, "--fit"),
        ),
        "{flag} goes with --from-spans",
    )
    notices = ConsoleNotices(err)
    fit, report = fit_deployment(
        args.endpoint,
        args.step_log,
        _store(args),
        given=_limits_given(args),
        design=QUICK_DESIGN if args.quick else DEFAULT_DESIGN,
        model=args.model,
        api_key=_api_key(args),
        progress=notices.detail,
        peaks=_peaks(args),
        model_config=args.model_config,
    )
    if args.json:
        doc = {k: v for k, v in fit.doc.items() if k != "data"}
        doc["analysis_id"] = fit.analysis_id
        doc["steps"] = len(fit.doc["data"]["steps"])
        doc["client_runs"] = len(fit.doc["data"]["clients"])
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    _print_fit(out, err, fit, report, _store(args))
    return 0


def _fit_spans(args: argparse.Namespace, out: Console, err: Console) -> int:
    import time

    from phaseprobe.collect.capacity.span_refit import SpanWindow, refit_from_spans

    _refuse_given(
        (
            (args.endpoint, "--endpoint"),
            (args.step_log, "--step-log"),
            (args.quick or None, "--quick"),
        ),
        "{flag} does not go with --from-spans (no probe is run)",
    )
    until = time.time_ns()
    window = SpanWindow(
        spans_from=args.spans_from,
        spans_store=args.spans_store or _store(args),
        since_ns=until - round(args.window * 1e9),
        until_ns=until,
    )
    peaks = _peaks(args)
    if peaks is not None and args.model_config is None:
        raise ConfigError("--peaks with --from-spans needs --model-config PATH (its config.json)")
    fit, report, rng = refit_from_spans(
        window,
        _store(args),
        base_fit_id=args.fit,
        given=_limits_given(args),
        model=args.model,
        peaks=peaks,
        model_config=args.model_config if peaks is not None else None,
    )
    if args.json:
        doc = {k: v for k, v in fit.doc.items() if k != "data"}
        doc["analysis_id"] = fit.analysis_id
        doc["span_equations"] = len(fit.doc["data"]["span_equations"])
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    err.print(
        f"[dim]{rng.used} of {rng.spans} spans used ({rng.engines} engine(s)), window "
        f"{args.window:g} s",
        highlight=False,
    )
    _print_fit(out, err, fit, report, _store(args))
    return 0


def _print_fit(out: Console, err: Console, fit: Any, report: Any, store: Path) -> None:
    c = fit.cost
    t = Table(
        title=f"step cost · {escape(str(fit.fingerprint.get('model')))} "
        f"· fit: analysis {fit.analysis_id}"
    )
    t.add_column("term")
    t.add_column("value", justify="right")
    t.add_row("fixed per step", f"{_ms(c.base_s)} ms")
    t.add_row("per prefill token", f"{c.per_prefill_token_s * 1e6:.2f} µs")
    t.add_row("per decoding sequence", f"{c.per_decode_seq_s * 1e6:.1f} µs")
    t.add_row("per KV context token", f"{c.per_context_token_s * 1e9:.2f} ns")
    t.add_row("between steps", f"{_ms(c.gap_s)} ms")
    t.add_row("before the engine (per request)", f"{_ms(fit.overheads.before_s)} ms")
    out.print(t)
    h = Table(title="held-out error (median relative, on data not fitted on)")
    h.add_column("kind")
    h.add_column("error", justify="right")
    h.add_column("n", justify="right")
    for kind, e in report.held_out_error.items():
        h.add_row(kind, _pct(e), str(report.held_out_counts.get(kind, 0)))
    out.print(h)
    lim = Table(title="scheduler limits")
    lim.add_column("limit")
    lim.add_column("value", justify="right")
    lim.add_column("from")
    for k, v in fit.doc["limits"].items():
        lim.add_row(k, escape(str(v["value"])), escape(v["source"]))
    out.print(lim)
    for note in report.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    unit = "span windows" if fit.doc.get("source") == "spans" else "steps"
    err.print(
        f"[dim]{report.steps_used} {unit} fitted, {report.steps_dropped} left out as pauses; "
        f"stored as analysis {fit.analysis_id} in {escape(str(store))} "
        f"(model predict/check --fit {fit.analysis_id} name it; they take the newest fit unasked)",
        highlight=False,
    )


def _slo(args: argparse.Namespace) -> Any:
    from phaseprobe.analysis.capacity_model.slo import Slo

    if not args.slo:
        return None
    return Slo(ttft_s=args.slo.get("ttft"), tpot_s=args.slo.get("tpot"), share=args.share)


def _predict(args: argparse.Namespace, out: Console, err: Console) -> int:
    from dataclasses import asdict, replace

    from phaseprobe.analysis.capacity_model.predict import predict_deployment
    from phaseprobe.analysis.capacity_model.workload import Fixed, WorkloadSpec
    from phaseprobe.collect.capacity.model_fit import load_fit
    from phaseprobe.store import Store

    kind, _, cv = args.arrivals.partition(":")
    if kind not in ("poisson", "constant", "gamma") or (kind == "gamma") != bool(cv):
        raise ConfigError(f"--arrivals {args.arrivals}: use poisson, constant or gamma:CV")
    try:
        cv_value = float(cv) if cv else 1.0
    except ValueError:
        cv_value = -1.0
    if not 0.05 <= cv_value <= 20:
        raise ConfigError(f"--arrivals {args.arrivals}: gamma:CV needs a CV between 0.05 and 20")
    store_path = _store(args)
    if not store_path.exists():
        raise ConfigError(f"no experiment store at {store_path}: run `phaseprobe model fit` first")
    with Store(store_path, readonly=True) as store:
        fit = load_fit(store, args.fit)
    # the limits given are a what-if over the fit's own
    what_if = {k: v for k, v in asdict(_limits_given(args)).items() if v is not None}
    limits = replace(fit.limits, **what_if) if what_if else fit.limits
    spec, rates, replay_note = _replay_spec(args, store_path)
    if spec is None:
        spec = WorkloadSpec(
            prompt=Fixed(args.prompt_tokens),
            output=Fixed(args.output_tokens),
            n=args.requests or 1000,
            arrivals=kind,
            cv=cv_value,
        )
    split = None
    if args.pd is None and args.hand_over_ms is not None:
        raise ConfigError("--hand-over-ms goes with --pd P:D")
    if args.pd is not None:
        from phaseprobe.analysis.capacity_model.pd_split import PdSplit
        from phaseprobe.collect.capacity.hand_over import measured_hand_over

        if args.hand_over_ms is not None:
            hand_over, source = args.hand_over_ms / 1e3, "given"
        else:
            hand_over, source = measured_hand_over(store_path)
        split = PdSplit(args.pd[0], args.pd[1], hand_over, source)
    with ConsoleNotices(err).waiting("simulating vLLM's scheduler…"):
        pred = predict_deployment(
            fit.cost,
            limits,
            fit.overheads,
            spec,
            rates,
            slo=_slo(args),
            replicas=args.replicas,
            fitted_range=fit.fitted_range,
            fitted_limits=fit.limits,
            pd=split,
        )
    doc = pred.to_dict()
    doc["fit_id"] = fit.analysis_id
    doc["workload"] = spec.to_dict()
    if replay_note:
        doc["notes"].insert(0, replay_note)
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    _print_prediction(out, doc, fit.analysis_id)
    for note in doc["notes"]:
        if not note.startswith("extrapolation: "):  # printed with the prediction
            err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    return 0


def _replay_spec(args: argparse.Namespace, store_path: Path) -> tuple[Any, Any, str | None]:
    """(workload, rates, note) for --replay / --replay-spans; (None, --rates, None) without."""
    import time

    from phaseprobe.analysis.capacity_model.workload import WorkloadSpec

    if args.replay is None and args.replay_spans is None:
        _refuse_given(
            ((args.spans_from, "--spans-from"), (args.spans_store, "--spans-store")),
            "{flag} goes with --replay-spans",
        )
        return None, args.rates, None
    if args.arrivals != "poisson":
        raise ConfigError("--arrivals does not go with a replay: the trace's own pattern is used")
    if args.replay is not None:
        from phaseprobe.collect.capacity.replay import read_bench_detailed

        rec = read_bench_detailed(args.replay)
        trace, where = rec.trace, f"{args.replay} ({rec.failed} failed requests left out)"
    else:
        from phaseprobe.collect.capacity.replay import span_trace

        until = time.time_ns()
        trace, where = span_trace(
            args.spans_from,
            args.spans_store or store_path,
            until - round(args.replay_spans * 1e9),
            until,
        )
    spec = WorkloadSpec.replay(trace, args.requests)
    recorded = spec.recorded_rate
    rates = args.rates or ([recorded] if recorded else None)
    note = (
        f"replayed: {len(trace)} requests from {where}, recorded at "
        f"{recorded or float('nan'):.3g} req/s; each rate rescales their send times"
        + (f", and repeats them to {spec.n} requests" if spec.n > len(trace) else "")
    )
    return spec, rates, note


def _band(m: dict[str, Any] | str, p: int) -> str:
    if not isinstance(m, dict):
        return "unstable"
    for b in m["percentiles"]:
        if b["p"] == p:
            return f"{b['value_s'] * 1e3:.1f} [{b['lo_s'] * 1e3:.1f}–{b['hi_s'] * 1e3:.1f}]"
    return "–"


def _print_prediction(out: Console, doc: dict[str, Any], fit_id: int | None) -> None:
    t = Table(
        title=f"predicted per rate · fit: analysis {fit_id} · ms, p50 and p99 with 95 % bands"
    )
    for col in (
        "req/s",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "TPOT p99",
        "E2E p99",
        "busy",
        "SLO met",
    ):
        t.add_column(col, justify="right")
    for r in doc["rates"]:
        m = r["metrics"]
        ttft = m["ttft"] if isinstance(m, dict) else m
        tpot = m["tpot"] if isinstance(m, dict) else m
        e2e = m["e2e"] if isinstance(m, dict) else m
        share = r["slo_share"]
        t.add_row(
            f"{r['rate']:g}",
            _band(ttft, 50),
            _band(ttft, 99),
            _band(tpot, 50),
            _band(tpot, 99),
            _band(e2e, 99),
            f"{r['utilisation'] * 100:.0f} %",
            "–" if share is None else share if isinstance(share, str) else f"{share * 100:.0f} %",
        )
    out.print(t)
    sat = doc["saturation"]
    out.print(
        f"saturation: [bold]{sat['rate']:.3g} req/s[/], bound by {escape(sat['binding'])} "
        f"({escape(sat['explanation'])})",
        highlight=False,
    )
    for name, lr in doc["largest_slo_rate"].items():
        slo = lr["slo"]
        limits = ", ".join(
            f"{k.removesuffix('_s').upper()} ≤ {v * 1e3:g} ms"
            for k, v in slo.items()
            if k != "share" and v is not None
        )
        label = (
            f"largest rate with {slo['share'] * 100:.0f} % meeting {limits}"
            if name == "distserve"
            else f"best goodput ({limits})"
        )
        if lr["rate"] is None:
            out.print(f"{label}: [red]none[/] — {escape(str(lr.get('binding')))}", highlight=False)
            for note in lr["notes"]:
                out.print(f"  {escape(note)}", highlight=False)
        elif name == "distserve":
            out.print(f"{label}: [bold]{lr['rate']:.3g} req/s[/]", highlight=False)
        else:
            out.print(
                f"{label}: {lr['goodput_rps']:.3g} good req/s at {lr['rate']:.3g} req/s",
                highlight=False,
            )
    for e in doc.get("extrapolation") or ():
        out.print(f"[yellow]extrapolation:[/] {escape(e['text'])}", highlight=False)


def _check(args: argparse.Namespace, out: Console, err: Console) -> int:
    if args.from_bench is not None:
        if args.rates is not None or args.endpoint is not None:
            raise ConfigError("--from-bench sends no load: --rates and --endpoint go without it")
        if args.search_slo:
            raise ConfigError("--from-bench sends no load: --search-slo needs real loads")
        from phaseprobe.collect.capacity.model_check import check_bench

        result = check_bench(_store(args), args.from_bench, slo=args.slo, fit_id=args.fit)
    elif args.rates is None:
        raise ConfigError("model check needs --rates R1,R2 (or --from-bench FILE)")
    else:
        result = _check_load(args, err)
    return _print_check(args, result, out, err)


def _check_load(args: argparse.Namespace, err: Console) -> Any:
    from phaseprobe.analysis.capacity_model.slo_search import SearchBounds
    from phaseprobe.collect.capacity.model_check import check_deployment

    search = None
    if args.search_slo:
        search = SearchBounds(
            lo=args.search_lo,
            hi=args.search_hi,
            max_rates=args.search_rates,
            budget_s=args.search_budget,
            rel_tol=args.search_tol,
        )
    elif any(
        getattr(args, k) is not None for k in ("search_lo", "search_hi")
    ):  # the bounds without the search would be ignored silently
        raise ConfigError("--search-lo/--search-hi go with --search-slo")
    notices = ConsoleNotices(err)
    return check_deployment(
        _store(args),
        args.endpoint,
        args.rates,
        requests=args.requests,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        slo=args.slo,
        fit_id=args.fit,
        model=args.model,
        api_key=_api_key(args),
        seed=args.seed,
        progress=notices.detail,
        share=args.share,
        search=search,
        alone_requests=args.alone,
    )


def _print_check(args: argparse.Namespace, result: Any, out: Console, err: Console) -> int:
    doc = result.to_dict()
    if args.json:
        out.out(jsonout.dumps(doc), highlight=False)
        return 0
    if result.alone is not None and result.alone.answered:
        a = result.alone
        err.print(
            f"alone first ({a.answered} of {a.requests}): "
            + ", ".join(
                f"{m.upper()} {_ms(a.measured[m])} ms (model {_ms(a.predicted[m])})"
                for m in ("ttft", "tpot")
            ),
            highlight=False,
        )
    for diff in result.differences:
        err.print(f"[yellow]unlike the fit:[/] {escape(diff)}", highlight=False)
    t = Table(
        title=f"predicted vs measured · fit: analysis {result.fit_id} "
        "· ms (error = (pred − meas) / meas)"
    )
    for col in ("req/s", "metric", "p", "predicted", "measured", "error"):
        t.add_column(col, justify="right")
    for p in result.points:
        for row in p.rows:
            t.add_row(
                f"{p.rate:g}",
                row.metric.upper(),
                str(row.percentile),
                _ms(row.predicted_s),
                _ms(row.measured_s),
                row.withheld or ("–" if row.error is None else f"{row.error * 100:+.0f} %"),
            )
        t.add_section()
    out.print(t)
    for p in result.points:
        if p.slo_share_measured is not None:
            out.print(
                f"{p.rate:g} req/s: SLO met by {p.slo_share_measured * 100:.0f} % measured, "
                f"{(p.slo_share_predicted or 0) * 100:.0f} % predicted",
                highlight=False,
            )
        for note in p.notes:
            err.print(f"[dim]{p.rate:g} req/s: {escape(note)}", highlight=False)
    if result.slo_search is not None:
        _print_search(out, result.slo_search)
    for note in result.notes:
        err.print(f"[yellow]note:[/] {escape(note)}", highlight=False)
    err.print(f"[dim]stored as analysis {result.analysis_id}", highlight=False)
    return 0


def _print_search(out: Console, found: Any) -> None:
    """The measured largest SLO rate beside the predicted one, with the relative error."""
    lo, hi = found.bracket
    measured = "none" if found.rate is None else f"{found.rate:.3g} req/s"
    if found.rate is not None and lo is not None and hi is not None:
        measured += f" (between {lo:.3g} and {hi:.3g})"
    elif found.rate is not None:
        measured += " (at least: the SLO was never missed)"
    pred = found.predicted_rate
    line = (
        f"largest rate with {found.share * 100:.0f} % meeting the SLO: measured "
        f"[bold]{measured}[/], predicted "
        + ("none" if pred is None else f"[bold]{pred:.3g} req/s[/]")
    )
    if found.error is not None:
        line += f", error {found.error * 100:+.0f} %"
        if found.predicted_in_bracket:
            line += " (inside the measured bracket)"
    out.print(line, highlight=False)
    own = [p for p in found.points if not p.from_check]
    out.print(
        f"  {len(own)} search load(s) in {found.seconds:.0f} s: "
        + ", ".join(f"{p.rate:.3g} req/s {p.share * 100:.0f} % met" for p in own)
        + f"; stopped: {escape(found.stopped)}",
        highlight=False,
    )
