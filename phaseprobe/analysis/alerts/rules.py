"""The rule groups: recording rules for the phase quantiles and the SLIs, and the alerts.

Every expression names vLLM 0.32's metrics (the newest spellings); ``names`` (built from a
``/metrics`` page or a Prometheus by :func:`~phaseprobe.sources.query_catalog.resolve_names`)
rewrites them to what an older server or a ``vllm_`` exporter has. ``selector`` is added to
every vLLM series the rules read, so one rule file can serve one job or namespace.

The SLO alerts are the SRE workbook's multi-window, multi-burn-rate alerts (chapter 5,
"Alerting on SLOs"): a page when the last hour and the last 5 minutes both burn the error budget
14.4 times faster than allowed (2 % of a 30-day budget in an hour), a ticket when the last 6 hours
and 30 minutes burn it 6 times faster (5 % in 6 hours). The short window makes the alert stop
soon after the burn does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from phaseprobe.analysis.alerts.buckets import (
    VLLM_032_BUCKETS,
    BucketChoice,
    choose_bucket,
    le_matcher,
)
from phaseprobe.analysis.alerts.slo import SloTargets
from phaseprobe.errors import ConfigError
from phaseprobe.sources.query_catalog import Query, bare_selector

__all__ = ["ALERT_NAMES", "AlertOptions", "Rule", "RuleGroup", "RuleSet", "build_rules"]

# Every alert the builder can write, in the order of the file; each has a runbook of the same
# name in playbooks/runbooks/.
ALERT_NAMES = (
    "VllmTtftSloBurn",
    "VllmTpotSloBurn",
    "VllmErrorSloBurn",
    "VllmEngineStalled",
    "VllmQueueGrowing",
    "VllmWaitingNothingRunning",
    "VllmKvPressure",
    "VllmStragglerReplica",
    "VllmAboveModelCapacity",
    "VllmPdRecomputeShareHigh",
    "VllmPdKvTransferFailures",
)
TPOT_FAMILIES = ("request_time_per_output_token_seconds", "inter_token_latency_seconds")
# (name in the recording rules, vLLM histogram family) of the phase quantiles
_PHASES = (
    ("queue", "request_queue_time_seconds"),
    ("prefill", "request_prefill_time_seconds"),
    ("decode", "request_decode_time_seconds"),
    ("ttft", "time_to_first_token_seconds"),
    ("itl", "inter_token_latency_seconds"),
    ("tpot", "request_time_per_output_token_seconds"),
    ("e2e", "e2e_request_latency_seconds"),
)
_QUANTILES = (0.5, 0.9, 0.99)
# (long window, short window, burn rate, for, severity): the workbook's table for 99.9 % and
# 99 % objectives over 30 days
# (severity critical pages someone; warning opens a ticket)
_BURNS = (("1h", "5m", 14.4, "2m", "critical"), ("6h", "30m", 6.0, "15m", "warning"))
_SLI_WINDOWS = ("5m", "30m", "1h", "6h")
_BY = "instance, model_name"


@dataclass(frozen=True)
class AlertOptions:
    """What the rules are built for: SLO targets, thresholds, selector, buckets, names."""

    slo: SloTargets = SloTargets()
    objective: float = 0.99
    selector: str = ""
    tpot_family: str = "request_time_per_output_token_seconds"
    stall_for_s: int = 120
    scrape_interval_s: int = 15  # Prometheus' scrape interval for vLLM (the stall's minimum)
    # the largest request rate one instance serves within the SLO (requests/s; None: no alert)
    # and where it came from, in words (a capacity fit and its workload, or "given")
    capacity_rate_per_s: float | None = None
    capacity_source: str = "given (--capacity-rate)"
    kv_usage_max: float = 0.9
    straggler_factor: float = 1.5
    recompute_max: float = 0.5
    runbook_base: str = "playbooks/runbooks"
    # histogram family → its bucket bounds (default: vLLM 0.32's)
    buckets: Mapping[str, tuple[float, ...]] = field(default_factory=lambda: VLLM_032_BUCKETS)
    names: Mapping[str, str] | None = None  # newest metric name → the spelling present


@dataclass(frozen=True)
class Rule:
    """One recording rule or alert."""

    name: str
    expr: str
    alert: bool = False
    for_: str | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The rule as Prometheus' rule file has it (``record``/``alert``, ``expr``, ...)."""
        out: dict[str, Any] = {"alert" if self.alert else "record": self.name, "expr": self.expr}
        if self.for_:
            out["for"] = self.for_
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out


@dataclass(frozen=True)
class RuleGroup:
    """Rules Prometheus evaluates together, at one interval."""

    name: str
    interval: str
    rules: tuple[Rule, ...]

    def to_dict(self) -> dict[str, Any]:
        """The group as a rule file has it."""
        return {
            "name": self.name,
            "interval": self.interval,
            "rules": [r.to_dict() for r in self.rules],
        }


@dataclass(frozen=True)
class RuleSet:
    """What the builder made, with the buckets it chose and what it left out."""

    groups: tuple[RuleGroup, ...]
    buckets: tuple[BucketChoice, ...]  # the bucket each latency SLO is counted against
    left_out: tuple[tuple[str, str], ...]  # (alert or rule, why it is not in the file)

    @property
    def alerts(self) -> list[str]:
        """Alert names, once each (an SLO alert has a page and a ticket rule)."""
        return sorted({r.name for g in self.groups for r in g.rules if r.alert})

    @property
    def records(self) -> list[str]:
        """Recording rule names, in file order."""
        return [r.name for g in self.groups for r in g.rules if not r.alert]


class _Exprs:
    """Writes expressions: the selector added to each vLLM series, names respelled."""

    def __init__(self, options: AlertOptions) -> None:
        self.selector = bare_selector(options.selector)
        self.names = options.names

    def series(self, name: str, *matchers: str) -> str:
        inner = ", ".join(m for m in (self.selector, *matchers) if m)
        return f"{name}{{{inner}}}" if inner else name

    def done(self, expr: str) -> str:
        # Query.render respells the newest names into the present ones (its $window is unused)
        return Query("alert", "", "", expr).render("", "5m", self.names) if self.names else expr


def _ratio_text(value: float) -> str:
    return f"{value:.6g}"


def build_rules(options: AlertOptions) -> RuleSet:
    """The three groups: phase quantiles, SLIs, alerts."""
    if not 0.5 <= options.objective < 1.0:
        raise ConfigError(
            f"--objective {options.objective:g}: a share of good requests in [0.5, 1), e.g. 0.99"
        )
    if options.tpot_family not in TPOT_FAMILIES:
        raise ConfigError(f"--tpot-metric: one of {', '.join(TPOT_FAMILIES)}")
    if options.capacity_rate_per_s is not None and not options.capacity_rate_per_s > 0:
        raise ConfigError("--capacity-rate: a positive number of requests per second")
    if options.scrape_interval_s < 1:
        raise ConfigError("--scrape-interval: at least 1 s")
    if options.stall_for_s < 2 * options.scrape_interval_s:
        raise ConfigError(
            f"--stall-for {options.stall_for_s} s: at least {2 * options.scrape_interval_s} s "
            f"(two scrapes at --scrape-interval {options.scrape_interval_s} s are needed to "
            "see a counter stand still)"
        )
    x = _Exprs(options)
    recording = _phase_records(x)
    slis, choices = _sli_records(x, options)
    alerts = (
        _burn_alerts(options, choices)
        + _engine_alerts(x, options)
        + _fleet_alerts(x, options)
        + _capacity_alerts(x, options)
        + _pd_alerts(x, options)
    )
    left_out = [
        (
            "span loss",
            "phaseprobe watch computes span loss (spans received against vLLM's finished-"
            "request counter) but exports no metric for Prometheus to alert on: watch it with "
            "`phaseprobe watch --metrics URL` or `--replica NAME=URL`",
        )
    ]
    for key, value in (("ttft", options.slo.ttft_s), ("tpot", options.slo.tpot_s)):
        if value is None:
            left_out.append(
                (
                    f"Vllm{key.capitalize()}SloBurn",
                    f"no --slo {key}=SECONDS given",
                )
            )
    if options.capacity_rate_per_s is None:
        left_out.append(
            (
                "VllmAboveModelCapacity",
                "no --capacity (the store's capacity fit, for --workload and --slo) or "
                "--capacity-rate given",
            )
        )
    groups = (
        RuleGroup("phaseprobe-vllm-phases", "30s", tuple(_finish(x, recording))),
        RuleGroup("phaseprobe-vllm-slo", "30s", tuple(_finish(x, slis))),
        RuleGroup("phaseprobe-vllm-alerts", "30s", tuple(_finish(x, alerts))),
    )
    return RuleSet(groups, tuple(choices), tuple(left_out))


def _finish(x: _Exprs, rules: list[Rule]) -> list[Rule]:
    return [Rule(r.name, x.done(r.expr), r.alert, r.for_, r.labels, r.annotations) for r in rules]


def _phase_records(x: _Exprs) -> list[Rule]:
    rules = []
    for phase, family in _PHASES:
        for q in _QUANTILES:
            bucket = x.series(f"vllm:{family}_bucket")
            rules.append(
                Rule(
                    f"model_name:vllm_{phase}_seconds:p{q * 100:g}_5m",
                    f"histogram_quantile({q:g}, sum by (le, model_name) (rate({bucket}[5m])))",
                )
            )
    # The straggler alert compares each replica's mean decode time per output token with the
    # fleet's median: a mean (sum/count) is steadier than a bucket quantile over 5 minutes.
    tpot = "vllm:request_time_per_output_token_seconds"
    rules.append(
        Rule(
            "instance_model_name:vllm_tpot_seconds:mean_5m",
            f"sum by ({_BY}) (rate({x.series(tpot + '_sum')}[5m])) / "
            f"sum by ({_BY}) (rate({x.series(tpot + '_count')}[5m]))",
        )
    )
    return rules


def _sli_name(sli: str, window: str) -> str:
    return f"model_name:vllm_{sli}_slo_bad_ratio:rate{window}"


def _sli_records(x: _Exprs, options: AlertOptions) -> tuple[list[Rule], list[BucketChoice]]:
    rules: list[Rule] = []
    choices: list[BucketChoice] = []
    latency = (
        ("ttft", "time_to_first_token_seconds", options.slo.ttft_s),
        ("tpot", options.tpot_family, options.slo.tpot_s),
    )
    for sli, family, threshold in latency:
        if threshold is None:
            continue
        bounds = options.buckets.get(family)
        if not bounds:
            raise ConfigError(f"no bucket bounds known for vLLM's {family}")
        choice = choose_bucket(family, threshold, bounds)
        choices.append(choice)
        good = x.series(f"vllm:{family}_bucket", le_matcher(choice.used_s))
        total = x.series(f"vllm:{family}_count")
        for w in _SLI_WINDOWS:
            # 1 - good/all; with no request in the window it is NaN, and no alert compares true
            rules.append(
                Rule(
                    _sli_name(sli, w),
                    f"1 - (sum by (model_name) (rate({good}[{w}])) / "
                    f"sum by (model_name) (rate({total}[{w}])))",
                )
            )
    errors = x.series("vllm:request_success_total", 'finished_reason="error"')
    finished = x.series("vllm:request_success_total")
    for w in _SLI_WINDOWS:
        # "or ... * 0": a server that never exported the error series still has a ratio of 0
        rules.append(
            Rule(
                _sli_name("error", w),
                f"(sum by (model_name) (rate({errors}[{w}])) or "
                f"sum by (model_name) (rate({finished}[{w}])) * 0) / "
                f"sum by (model_name) (rate({finished}[{w}]))",
            )
        )
    return rules, choices


def _annotations(
    options: AlertOptions, alert: str, summary: str, description: str
) -> dict[str, str]:
    base = options.runbook_base.rstrip("/")
    return {
        "summary": summary,
        "description": description,
        "runbook_url": f"{base}/{alert}.md",
    }


def _alert(
    options: AlertOptions,
    name: str,
    expr: str,
    summary: str,
    description: str,
    *,
    for_: str,
    severity: str,
    **labels: str,
) -> Rule:
    """An alert: its name given once, for the rule and its runbook's address."""
    return Rule(
        name,
        expr,
        alert=True,
        for_=for_,
        labels={"severity": severity, **labels},
        annotations=_annotations(options, name, summary, description),
    )


def _burn_alerts(options: AlertOptions, choices: list[BucketChoice]) -> list[Rule]:
    budget = 1.0 - options.objective
    slis: list[tuple[str, str, str, BucketChoice]] = []
    by_family = {c.family: c for c in choices}
    if options.slo.ttft_s is not None:
        ttft = by_family["time_to_first_token_seconds"]
        slis.append(("ttft", "VllmTtftSloBurn", "time to first token", ttft))
    if options.slo.tpot_s is not None:
        slis.append(
            ("tpot", "VllmTpotSloBurn", "time per output token", by_family[options.tpot_family])
        )
    rules: list[Rule] = []
    for sli, alert, words, choice in slis:
        for long_w, short_w, burn, hold, severity in _BURNS:
            limit = _ratio_text(burn * budget)
            rules.append(
                _alert(
                    options,
                    alert,
                    f"{_sli_name(sli, long_w)} > {limit} and {_sli_name(sli, short_w)} > {limit}",
                    f"{{{{ $labels.model_name }}}}: {words} SLO burning its error budget "
                    f"{burn:g}x too fast ({long_w} and {short_w})",
                    f"{{{{ $value | humanizePercentage }}}} of requests over the last "
                    f"{long_w} missed {words} <= {choice.asked_s:g} s (allowed: "
                    f"{budget:.3g} of them, objective {options.objective:g}). Counted "
                    f"against bucket {choice.text}.",
                    for_=hold,
                    severity=severity,
                    slo=sli,
                    window=f"{long_w}/{short_w}",
                )
            )
    for long_w, short_w, burn, hold, severity in _BURNS:
        limit = _ratio_text(burn * budget)
        rules.append(
            _alert(
                options,
                "VllmErrorSloBurn",
                f"{_sli_name('error', long_w)} > {limit} and "
                f"{_sli_name('error', short_w)} > {limit}",
                f"{{{{ $labels.model_name }}}}: request errors burning the error budget "
                f"{burn:g}x too fast ({long_w} and {short_w})",
                f"{{{{ $value | humanizePercentage }}}} of requests finished with "
                f'finished_reason="error" over the last {long_w} (allowed: {budget:.3g}, '
                f"objective {options.objective:g}).",
                for_=hold,
                severity=severity,
                slo="error",
                window=f"{long_w}/{short_w}",
            )
        )
    return rules


def _engine_alerts(x: _Exprs, options: AlertOptions) -> list[Rule]:
    by = "instance, model_name, engine"
    n = f"{options.stall_for_s}s"
    # Progress is a token, step or finished-request counter, vLLM's FLOP counter, or the KV
    # usage changing. Measured on vLLM 0.32: the token and step counters move only when a
    # request emits its first token, so a long chunked prefill holds them still; its steps
    # move estimated_flops_per_gpu (with --enable-mfu-metrics) and claim KV blocks.
    moved = " or ".join(
        [
            f"sum by ({by}) (increase({x.series(c)}[{n}])) > 0"
            for c in (
                "vllm:generation_tokens_total",
                "vllm:prompt_tokens_total",
                "vllm:iteration_tokens_total_count",
                "vllm:request_success_total",
                "vllm:estimated_flops_per_gpu_total",
            )
        ]
        + [f"sum by ({by}) (changes({x.series('vllm:kv_cache_usage_perc')}[{n}])) > 0"]
    )
    running = x.series("vllm:num_requests_running")
    # "unless ... > 0": any mark that moved clears it, and one this vLLM does not export
    # (iteration_tokens_total before 0.7, the FLOP counter without --enable-mfu-metrics)
    # cannot keep it from firing. min_over_time: requests were running for the whole window,
    # not only at its end.
    stalled = _alert(
        options,
        "VllmEngineStalled",
        f"min by ({by}) (min_over_time({running}[{n}])) > 0 unless on ({by}) ({moved})",
        "{{ $labels.instance }} engine {{ $labels.engine }}: requests running, no token "
        f"produced for {n}",
        "{{ $value }} request(s) running while vLLM's token, engine-step, finished and "
        f"FLOP counters and its KV usage stood still for {n} (then "
        f"{4 * options.scrape_interval_s}s more). /health may still answer 200: the "
        "engine core is hung (a long prefill moves the FLOP counter and KV usage).",
        # a new series has one sample and no increase() yet: wait a few scrapes more (1m at
        # Prometheus' usual 15 s)
        for_=f"{4 * options.scrape_interval_s}s",
        severity="critical",
    )
    waiting = x.series("vllm:num_requests_waiting")
    growing = _alert(
        options,
        "VllmQueueGrowing",
        f"sum by ({_BY}) ({waiting}) > 0 and sum by ({_BY}) (deriv({waiting}[10m])) > 0",
        "{{ $labels.instance }}: the waiting queue has grown for 10 minutes",
        "{{ $value }} request(s) waiting and still growing: arrivals exceed what the "
        "engine finishes (queue time, then TTFT, will follow).",
        for_="10m",
        severity="warning",
    )
    nothing = _alert(
        options,
        "VllmWaitingNothingRunning",
        f"sum by ({_BY}) ({waiting}) > 0 and on ({_BY}) sum by ({_BY}) ({running}) == 0",
        "{{ $labels.instance }}: requests waiting and none running",
        "{{ $value }} request(s) waiting for 2 minutes with nothing scheduled: the "
        "scheduler admits nothing (KV cache held, a request too large, a stalled KV "
        "transfer).",
        for_="2m",
        severity="critical",
    )
    usage = x.series("vllm:kv_cache_usage_perc")
    preempt = x.series("vllm:num_preemptions_total")
    kv = _alert(
        options,
        "VllmKvPressure",
        f"max by ({_BY}) (avg_over_time({usage}[5m])) > {options.kv_usage_max:g} and on ({_BY}) "
        f"sum by ({_BY}) (rate({preempt}[5m])) > 0",
        "{{ $labels.instance }}: KV cache full and requests preempted",
        f"KV-cache usage {{{{ $value | humanizePercentage }}}} (over "
        f"{options.kv_usage_max:g}) with preemptions in the last 5 minutes: running "
        "requests are evicted and their prefill recomputed.",
        for_="5m",
        severity="warning",
    )
    return [stalled, growing, nothing, kv]


def _fleet_alerts(x: _Exprs, options: AlertOptions) -> list[Rule]:
    mean = "instance_model_name:vllm_tpot_seconds:mean_5m"
    factor = f"{options.straggler_factor:g}"
    two = ""
    if options.straggler_factor < 2:  # with two replicas, s > f * (s + o) / 2: s/o > f/(2-f)
        ratio = options.straggler_factor / (2 - options.straggler_factor)
        two = f" (with two replicas the median is their mean: the slow one must be {ratio:.3g}x"
        two += " the other)"
    return [
        _alert(
            options,
            "VllmStragglerReplica",
            f"{mean} > on (model_name) group_left () ({factor} * quantile by (model_name) "
            f"(0.5, {mean})) and on (model_name) count by (model_name) ({mean}) >= 2",
            f"{{{{ $labels.instance }}}}: decode per token over {factor}x the fleet median",
            "Mean time per output token {{ $value | humanizeDuration }} on this replica, "
            f"over {factor} times the median of the replicas of {{{{ $labels.model_name }}}}"
            f"{two}.",
            for_="10m",
            severity="warning",
        )
    ]


def _capacity_alerts(x: _Exprs, options: AlertOptions) -> list[Rule]:
    """Each instance's finished-request rate against the largest rate the capacity model
    (``phaseprobe model fit``) says one instance serves within the SLO."""
    rate = options.capacity_rate_per_s
    if rate is None:
        return []
    done = x.series("vllm:request_success_total")
    return [
        _alert(
            options,
            "VllmAboveModelCapacity",
            f"sum by ({_BY}) (rate({done}[5m])) > {rate:.6g}",
            f"{{{{ $labels.instance }}}}: above the {rate:.3g} req/s one instance serves "
            "within the SLO",
            "{{ $value | humanize }} requests/s finished over 5 minutes, for 10 minutes, "
            f"above the largest rate that meets the SLO: {rate:.3g} req/s, "
            f"{options.capacity_source}. TTFT, then TPOT, will miss their targets.",
            for_="10m",
            severity="warning",
        )
    ]


def _pd_alerts(x: _Exprs, options: AlertOptions) -> list[Rule]:
    source = "vllm:prompt_tokens_by_source_total"
    limit = f"{options.recompute_max:g}"
    local = x.series(source, 'source="local_compute"')
    external = x.series(source, 'source="external_kv_transfer"')
    recompute = _alert(
        options,
        "VllmPdRecomputeShareHigh",
        f"(sum by ({_BY}) (rate({local}[15m])) / "
        f"sum by ({_BY}) (rate({x.series(source)}[15m]))) > {limit} and on ({_BY}) "
        f"sum by ({_BY}) (increase({external}[1h]))"
        " > 0",
        "{{ $labels.instance }}: decode instance recomputing its prompts",
        "{{ $value | humanizePercentage }} of prompt tokens computed locally on an instance "
        "that receives KV from a prefill instance (external_kv_transfer in the last hour): "
        "the transfers are failing or missing and prefill is done twice.",
        for_="15m",
        severity="warning",
    )
    failed = x.series("vllm:nixl_num_failed_transfers_total")
    transfers = _alert(
        options,
        "VllmPdKvTransferFailures",
        f"sum by ({_BY}) (rate({failed}[5m])) > 0",
        "{{ $labels.instance }}: NIXL KV transfers failing",
        "{{ $value }} failed KV transfers per second (NIXL connector; vLLM 0.32 exports "
        "this only with --kv-transfer-config NixlConnector). Each failed request is "
        "recomputed on the decode side: it succeeds, slower.",
        for_="5m",
        severity="warning",
    )
    return [recompute, transfers]
