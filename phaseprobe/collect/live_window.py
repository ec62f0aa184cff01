"""Take one window of live traffic for ``phaseprobe check --live``: no experiment, no requests.

Two ways to read the window, both ending in :class:`~phaseprobe.analysis.rules.live_base.
LiveEvidence`:

- **scrapes**: each replica's own ``/metrics`` (``--endpoint`` alone, or the ``--replica``
  URLs behind a router; never the router's, which answers from any replica) scraped at the
  start of the window, every ``sample_every_s`` while it lasts (the gauges: running, waiting,
  KV usage), and at its end. The counters' increase is last − first, per replica; a replica
  whose two scrapes come from different processes or whose counter went backwards is "cannot
  verify" (:func:`~phaseprobe.analysis.replica_match.unverifiable`), never a negative rate. A
  replica down at the start, or that stops answering during the window, is reported down and
  the others are measured.
- **Prometheus** (``--prom``): PromQL over the last ``window_s`` by ``instance`` (the replica's
  identity): ``increase`` of the counters and histograms, ``avg_over_time`` / ``max_over_time``
  of the gauges; an ``instance`` whose ``up`` is 0 is down. Nothing to wait for.

The request spans the store received over the window (``phaseprobe watch`` running beside
the fleet) come along when it holds any: the window waits ``span_grace_s`` more for the
exporters' batches (OTEL_BSP_SCHEDULE_DELAY is 5 s) before reading them. With ``spans_from``
(``--spans-from URL``) they are read instead where the fleet's collector keeps them
(ClickHouse, chdb, Tempo, Jaeger), checked before the window starts.
"""

from __future__ import annotations

import math
import time
from contextlib import ExitStack
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import requests

from phaseprobe.analysis.engine_stall import StallDetector, StallReading, progress_point
from phaseprobe.analysis.lora_gauge import lora_window
from phaseprobe.analysis.preemption import kv_at_preemptions
from phaseprobe.analysis.replica_match import process_identity, unverifiable
from phaseprobe.analysis.replica_window import (
    BUCKET_HISTOGRAMS,
    DELTA_COUNTERS,
    DELTA_HISTOGRAMS,
    GAUGES,
    NIXL_COUNTERS,
    NIXL_HISTOGRAMS,
    WAITING_REASONS,
    ReplicaWindow,
)
from phaseprobe.analysis.router_window import RouterWindow
from phaseprobe.analysis.rules.live_base import LiveEvidence
from phaseprobe.analysis.spec_decode import PER_POS_CANONICAL, PER_POS_KEY, SPEC_COUNTERS
from phaseprobe.collect.capacity.live_estimate import estimate_for_window
from phaseprobe.collect.fleet.scrape import FleetScraper, RouterPage
from phaseprobe.collect.fleet.targets import (
    ReplicaTarget,
    check_fleet,
    default_name,
    discover_replicas,
    router_workers,
)
from phaseprobe.collect.live_options import LiveOptions
from phaseprobe.collect.spec_costs import stored_step_costs
from phaseprobe.collect.stall_evidence import check_vllm_pid, keep_stall_evidence
from phaseprobe.errors import ConfigError, MetricsUnavailable, StoreError, UnknownMetric
from phaseprobe.records import RequestSpan
from phaseprobe.redact import redact_url
from phaseprobe.sources.query_catalog import CATALOG_ONLY, bare_selector
from phaseprobe.sources.vllm.metrics import (
    ALIASES,
    MetricSnapshot,
    sample_spellings,
)
from phaseprobe.sources.vllm.openai_stream import normalize_base_url
from phaseprobe.store import Store

if TYPE_CHECKING:
    from phaseprobe.collect.spans.source import SpanReader

__all__ = [
    "take_window",
    "snapshot_deltas",
    "replica_window",
    "SPAN_LOOKBACK_S",
]

SPAN_LOOKBACK_S = 600.0  # a span finishing in the window may have started this long before
_RECENT_SPANS_S = 600.0  # spans received this recently: a receiver is running, wait for spans


def take_window(
    opts: LiveOptions, *, session: requests.Session | None = None
) -> tuple[LiveEvidence, dict[str, str]]:
    """(LiveEvidence, its sources in words) of one window; raises ConfigError for bad options.

    See the module docstring for the two ways to read it. A bad ``--window``, endpoint/--prom
    pair or ``--prom-selector`` (parsed as PromQL label matchers) is refused before the window
    starts."""
    if opts.window_s <= 0 or not math.isfinite(opts.window_s):
        raise ConfigError(f"--window {opts.window_s:g}: give a positive number of seconds")
    if bool(opts.endpoint) == bool(opts.prom_url):
        raise ConfigError(
            "check --live reads either --endpoint URL (with --replica for the "
            "replicas behind a router) or --prom URL, one of the two"
        )
    if opts.replicas and not opts.endpoint:
        raise ConfigError("--replica needs --endpoint (the router the replicas are behind)")
    bare_selector(opts.prom_selector)  # a bad --prom-selector: refused before the window
    if opts.stall_pid is not None:
        check_vllm_pid(opts.stall_pid)  # not a vLLM process: refused before the window
    with ExitStack() as stack:
        reader = None
        if opts.spans_from is not None:  # unreachable, no table…: said before the window
            from phaseprobe.collect.spans.source import open_spans

            reader = stack.enter_context(open_spans(opts.spans_from, opts.store_path or Path(".")))
        return _take_window(opts, session, reader)


def _take_window(
    opts: LiveOptions, session: requests.Session | None, reader: SpanReader | None
) -> tuple[LiveEvidence, dict[str, str]]:
    sources: dict[str, str] = {}
    spans_wanted = reader is not None or _receiving_spans(opts.store_path)
    if opts.prom_url:
        if spans_wanted and opts.span_grace_s > 0:
            opts.progress(f"waiting {opts.span_grace_s:g} s for the spans' exporters")
            opts.sleep(opts.span_grace_s)
        end_s = time.time() - (opts.span_grace_s if spans_wanted else 0.0)
        replicas, down = _prometheus_window(opts, end_s, sources)
        window_s, target, source = (
            opts.window_s,
            f"Prometheus {redact_url(opts.prom_url)}",
            "prometheus",
        )
        fleet = True
        router = None
        stalls = {}
        if opts.router_metrics_url:
            opts.notes.add(
                "--router-metrics is read with --endpoint (two scrapes a window "
                "apart), not with --prom: scrape the router with Prometheus and "
                "query vllm_router_* there"
            )
    else:
        scraped = _scrape_window(opts, sources, session, spans_wanted)
        replicas, down, window_s, end_s = (
            scraped.windows,
            scraped.down,
            scraped.window_s,
            scraped.end_wall,
        )
        target, router, fleet = scraped.target, scraped.router, scraped.fleet
        source = "scrapes"
        stalls = scraped.stalls
    spans = None
    if reader is not None:
        spans = _reader_spans(reader, end_s - window_s, end_s, sources)
    elif spans_wanted:
        spans = _window_spans(opts.store_path, end_s - window_s, end_s, sources)
    ev = LiveEvidence(
        tuple(replicas),
        window_s,
        target=target,
        source=source,
        down=down,
        spans=spans,
        use_case=opts.use_case,
        ttft_target_s=opts.ttft_target_s,
        tpot_target_s=opts.tpot_target_s,
        fleet=fleet,
        router=router,
        stall_evidence=stalls,
    )
    # the headroom rule's input: cheap when there is no fit (a missing table), seconds of
    # simulation when there is one
    ev = replace(ev, capacity=estimate_for_window(ev, opts.store_path))
    if any(k in r.deltas for r in ev.replicas for k in SPEC_COUNTERS):
        # the break-even needs step costs a live window cannot separate: the store's
        costs, costs_from = stored_step_costs(opts.store_path)
        ev = replace(ev, spec_costs=costs, spec_costs_from=costs_from)
    return ev, sources


# -- scrapes ----------------------------------------------------------------------------------


def _targets(
    opts: LiveOptions, session: requests.Session, headers: dict[str, str]
) -> tuple[list[ReplicaTarget], dict[str, str], str, bool]:
    """The replicas to scrape, those down, the target in words, and whether it is a fleet
    (replicas named by the user or by the router: spans are then grouped per replica even
    when one replica is left)."""
    endpoint = normalize_base_url(opts.endpoint or "")
    if opts.replicas:
        checked = check_fleet(endpoint, opts.replicas, headers=headers)
        return (
            list(checked.up),
            dict(checked.down),
            f"{len(opts.replicas)} replicas behind {redact_url(endpoint)}",
            True,
        )
    workers = router_workers(endpoint, session, headers)
    if workers is not None:
        # a vllm-router names its workers: each is read on its own /metrics, as --replica
        found, left_out = discover_replicas(workers)
        opts.notes.extend(left_out)
        if not found:
            raise ConfigError(
                f"{redact_url(endpoint)} is a vllm-router whose /list_workers "
                "names no worker phaseprobe can read: give each replica with "
                "--replica NAME=URL (its own /metrics is read), or --prom URL"
            )
        checked = check_fleet(endpoint, found, headers=headers)
        return (
            list(checked.up),
            dict(checked.down),
            f"{len(found)} replicas behind {redact_url(endpoint)} (from its /list_workers)",
            True,
        )
    return [ReplicaTarget(default_name(endpoint), endpoint)], {}, redact_url(endpoint), False


class _Scraped(NamedTuple):
    windows: list[ReplicaWindow]
    down: dict[str, str]
    window_s: float
    end_wall: float
    target: str
    router: RouterWindow | None
    fleet: bool
    stalls: dict[str, str]  # replica → where its stalled engine's evidence was kept


def _scrape_window(
    opts: LiveOptions, sources: dict[str, str], session: requests.Session | None, spans_wanted: bool
) -> _Scraped:
    session = session or requests.Session()
    headers = {"Authorization": f"Bearer {opts.api_key}"} if opts.api_key else {}
    targets, down, target, fleet = _targets(opts, session, headers)
    reader = FleetScraper(targets, session, headers)
    series: dict[str, list[MetricSnapshot]] = {t.name: [] for t in targets}

    def scrape_all() -> None:
        gone = set(reader.lost)
        snap = reader.scrape()
        for name in [n for n in reader.lost if n not in gone]:  # lost in this scrape
            when = "at the start of the window" if not series[name] else "during the window"
            down[name] = f"/metrics stopped answering {when}: {reader.lost[name]}"
            del series[name]
        for name, one in snap.by_replica.items() if snap is not None else ():
            series[name].append(one)

    router = _router_page(opts, session, headers, {t.url: t.name for t in targets})
    if router is not None:
        router.start()
    scrape_all()
    if not reader.names:
        raise MetricsUnavailable(
            target,
            "no /metrics answers (" + "; ".join(f"{n}: {why}" for n, why in down.items()) + ")",
        )
    opts.progress(
        f"waiting {opts.window_s:g} s for the window ({len(reader.names)} "
        f"replica{'s' if len(reader.names) != 1 else ''}, /metrics every "
        f"{opts.sample_every_s:g} s)"
    )
    start = opts.clock()
    while reader.names:
        left = opts.window_s - (opts.clock() - start)
        if left <= 0:
            break
        opts.sleep(min(opts.sample_every_s, left))
        scrape_all()
    end_wall = time.time()
    stall_after = min(opts.stall_after_s, 0.9 * opts.window_s)
    windows = [
        replica_window(name, snaps, stall_after)
        for name, snaps in series.items()
        if len(snaps) >= 2
    ]
    for name, snaps in series.items():
        if len(snaps) < 2:
            down.setdefault(name, "only one /metrics scrape in the window")
    if not windows:
        raise MetricsUnavailable(target, "no replica answered /metrics twice in the window")
    lengths = sorted((s[-1].wall_ns - s[0].wall_ns) / 1e9 for s in series.values() if len(s) >= 2)
    window_s = lengths[len(lengths) // 2]
    sources["metrics"] = (
        f"/metrics of {', '.join(w.name for w in windows)}: first and last "
        f"of {max(w.samples for w in windows)} scrapes over {window_s:.1f} s"
    )
    if down:
        sources["down"] = "; ".join(f"{n}: {why}" for n, why in down.items())
    router_doc = _router_window(router, sources)  # its last scrape: the window's end
    if spans_wanted and opts.span_grace_s > 0:
        opts.progress(f"waiting {opts.span_grace_s:g} s for the spans' exporters")
        opts.sleep(opts.span_grace_s)
    urls = {t.name: t.url for t in targets}
    stalls = {
        w.name: keep_stall_evidence(
            w.name,
            urls[w.name],
            w.progress,
            series[w.name],
            store_path=opts.store_path,
            pid=opts.stall_pid if len(urls) == 1 else None,
            server_log=opts.server_log if len(urls) == 1 else None,
        )
        for w in windows
        if w.progress is not None and w.progress.state == "stalled"
    }
    return _Scraped(windows, down, window_s, end_wall, target, router_doc, fleet, stalls)


def _router_page(
    opts: LiveOptions, session: requests.Session, headers: dict[str, str], names: dict[str, str]
) -> RouterPage | None:
    """The router's own metrics page (``--router-metrics``), read at the window's edges."""
    url = opts.router_metrics_url
    return RouterPage(url, session, names, headers) if url else None


def _router_window(page: RouterPage | None, sources: dict[str, str]) -> RouterWindow | None:
    """The router's window, and in the sources what was read or why not (the router rule is
    then skipped; the replicas are measured all the same)."""
    if page is None:
        return None
    window = page.window()
    sources["router"] = (
        f"{page.shown_url}: scraped at the window's edges" if window else "; ".join(page.notes)
    )
    return window


def snapshot_deltas(
    before: MetricSnapshot, after: MetricSnapshot
) -> tuple[dict[str, float], str | None]:
    """Counter and histogram increases between two scrapes of one replica (keys as
    :class:`ReplicaWindow` documents) and why they cannot be trusted (None: they can)."""
    why = unverifiable(before, after, None)
    if why:
        return {}, why
    out: dict[str, float] = {}

    def put(key: str, b: float | None, a: float | None, shown: str) -> str | None:
        if a is None or b is None:
            return None
        if a < b:
            return (
                f"{shown} went backwards ({b:g} -> {a:g}): another process answered "
                "/metrics or vLLM restarted; cannot verify"
            )
        out[key] = a - b
        return None

    checks: list[str | None] = []
    for hist in DELTA_HISTOGRAMS:
        for part in ("_sum", "_count"):
            checks.append(
                put(hist + part, before.value(hist, part), after.value(hist, part), hist + part)
            )
    for counter in DELTA_COUNTERS:
        checks.append(put(counter, before.value(counter), after.value(counter), counter))
    checks.append(
        put(
            "finished",
            before.value("request_success"),
            after.value("request_success"),
            "request_success",
        )
    )
    b_reasons = before.by_label("request_success", "finished_reason") or {}
    a_reasons = after.by_label("request_success", "finished_reason") or {}
    for reason in sorted(set(a_reasons) | set(b_reasons)):
        checks.append(
            put(
                "finished_" + reason,
                b_reasons.get(reason, 0.0),
                a_reasons.get(reason, 0.0),
                f"request_success{{{reason}}}",
            )
        )
    b_src = before.by_label("prompt_tokens_by_source", "source") or {}
    a_src = after.by_label("prompt_tokens_by_source", "source") or {}
    for source in sorted(set(a_src) | set(b_src)):
        checks.append(
            put(
                "prompt_source_" + source,
                b_src.get(source, 0.0),
                a_src.get(source, 0.0),
                f"prompt_tokens_by_source{{{source}}}",
            )
        )
    # speculative decoding (absent: not enabled), its per-position counter by label
    for key, canonical in SPEC_COUNTERS.items():
        checks.append(put(key, before.value(canonical), after.value(canonical), canonical))
    b_pos = before.by_label(PER_POS_CANONICAL, "position") or {}
    a_pos = after.by_label(PER_POS_CANONICAL, "position") or {}
    for pos in sorted(set(a_pos) | set(b_pos)):
        checks.append(
            put(
                PER_POS_KEY + pos,
                b_pos.get(pos, 0.0),
                a_pos.get(pos, 0.0),
                f"{PER_POS_CANONICAL}{{position={pos}}}",
            )
        )
    for key, catalog in (*NIXL_COUNTERS.items(), *NIXL_HISTOGRAMS.items()):
        parts = ("_sum", "_count") if key in NIXL_HISTOGRAMS else ("",)
        for part in parts:
            b_name, a_name = _family(before, key, part), _family(after, key, part)
            if b_name and a_name:
                checks.append(
                    put(
                        key + part,
                        before.total(b_name + part),
                        after.total(a_name + part),
                        catalog + part,
                    )
                )
    bad = next((c for c in checks if c), None)
    return ({}, bad) if bad else (out, None)


def _family(snap: MetricSnapshot, key: str, part: str = "") -> str | None:
    """The name this server gives a window key's metric (histograms: the family, without
    ``_sum``/``_count``/``_bucket``), found by ``part``'s sample; None when not exported. The
    NIXL series are not in the scrapes' alias table: the query catalog spells them."""
    if key in ALIASES:
        try:
            name = snap.resolve(key)
        except UnknownMetric:
            return None
        return name if name + part in snap.samples else None
    catalog = NIXL_COUNTERS.get(key) or NIXL_HISTOGRAMS.get(key)
    if catalog is None:
        return None
    kind, bases = CATALOG_ONLY[catalog]
    probe = part or ("_count" if kind == "histogram" else "")
    return next(
        (
            name
            for base in bases
            for name in sample_spellings(kind, base)
            if name + probe in snap.samples
        ),
        None,
    )


def _buckets(snap: MetricSnapshot, family: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by ``le``, summed over engines."""
    out: dict[float, float] = {}
    for labels, value in snap.samples.get(family + "_bucket", []):
        try:
            le = float(labels.get("le", ""))
        except ValueError:
            continue
        out[le] = out.get(le, 0.0) + value
    return out


def bucket_deltas(
    before: MetricSnapshot, after: MetricSnapshot
) -> dict[str, tuple[tuple[float, float], ...]]:
    """Each of :data:`BUCKET_HISTOGRAMS`' bucket increases between two scrapes (left out when
    not exported, or when a bucket went backwards: another process answered)."""
    out: dict[str, tuple[tuple[float, float], ...]] = {}
    for hist in BUCKET_HISTOGRAMS:
        b_name, a_name = _family(before, hist, "_bucket"), _family(after, hist, "_bucket")
        if not b_name or not a_name:
            continue
        b, a = _buckets(before, b_name), _buckets(after, a_name)
        rows = tuple(sorted((le, a[le] - b.get(le, 0.0)) for le in a))
        if rows and all(d >= 0 for _, d in rows):
            out[hist] = rows
    return out


def replica_window(
    name: str, snaps: list[MetricSnapshot], stall_after_s: float | None = None
) -> ReplicaWindow:
    """One replica's window from its scrapes (first and last for counters, all for gauges);
    with ``stall_after_s``, every scrape goes through the stalled-engine detector too."""
    deltas, why = snapshot_deltas(snaps[0], snaps[-1])
    mean: dict[str, float] = {}
    peak: dict[str, float] = {}
    for gauge in (*GAUGES, *WAITING_REASONS.values()):
        values = [v for s in snaps if (v := _gauge(s, gauge)) is not None]
        if values:
            mean[gauge] = sum(values) / len(values)
            peak[gauge] = max(values)
    models = sorted(
        {
            labels["model_name"]
            for labels in snaps[-1].labels_of("request_success")
            if "model_name" in labels
        }
    )
    return ReplicaWindow(
        name,
        deltas,
        mean,
        peak,
        buckets={} if why else bucket_deltas(snaps[0], snaps[-1]),
        samples=len(snaps),
        unverifiable=why,
        model=", ".join(models) or None,
        progress=None if stall_after_s is None else _progress(snaps, stall_after_s),
        preemption_kv=()
        if why
        else kv_at_preemptions(
            [(s.value("num_preemptions"), _gauge(s, "kv_cache_usage")) for s in snaps]
        ),
        lora=lora_window(snaps),
    )


def _progress(snaps: list[MetricSnapshot], stall_after_s: float) -> StallReading | None:
    detector = StallDetector(stall_after_s)
    for snap in snaps:
        detector.observe(progress_point(snap, process_identity(snap)))
    return detector.reading


_REASON_OF = {key: reason for reason, key in WAITING_REASONS.items()}


def _gauge(snap: MetricSnapshot, gauge: str) -> float | None:
    if gauge in _REASON_OF:  # None when the server has no num_requests_waiting_by_reason
        by = snap.by_label("requests_waiting_by_reason", "reason")
        return None if by is None else by.get(_REASON_OF[gauge], 0.0)
    if gauge != "kv_cache_usage":
        return snap.value(gauge)
    try:
        rows = snap.samples.get(snap.resolve(gauge), [])
    except UnknownMetric:
        return None
    return max((v for _, v in rows), default=None)  # one fraction per engine: the fullest


# -- Prometheus -------------------------------------------------------------------------------


def _prometheus_window(
    opts: LiveOptions, end_s: float, sources: dict[str, str]
) -> tuple[list[ReplicaWindow], dict[str, str]]:
    from phaseprobe.sources.prometheus import PrometheusClient  # its client library is heavy

    url = opts.prom_url or ""
    label = opts.prom_replica_label  # instance: every scrape target; pod: where relabeled
    w = f"{max(1, math.ceil(opts.window_s))}s"
    bare = bare_selector(opts.prom_selector)  # parsed label matchers, like query's --selector
    sel = f"{{{bare}}}" if bare else ""
    deltas: dict[str, dict[str, float]] = {}
    mean: dict[str, dict[str, float]] = {}
    peak: dict[str, dict[str, float]] = {}
    buckets: dict[str, dict[str, list[tuple[float, float]]]] = {}
    down: dict[str, str] = {}
    with PrometheusClient(url) as client:
        names = client.names_map()

        def name(newest: str) -> str:
            return names.get(newest, newest)

        def by_instance(
            expr: str, into: dict[str, dict[str, float]], key: str, extra: str = ""
        ) -> None:
            for s in client.instant_query(expr, at=end_s):
                inst = s.labels.get(label)
                if inst is None or math.isnan(s.value) or (extra and not s.labels.get(extra)):
                    continue
                k = key + (s.labels.get(extra, "") if extra else "")
                into.setdefault(inst, {})
                into[inst][k] = into[inst].get(k, 0.0) + s.value

        for hist in DELTA_HISTOGRAMS:
            base = _newest(hist)
            for part in ("_sum", "_count"):
                by_instance(
                    f"sum by ({label}) (increase({name(base + part)}{sel}[{w}]))",
                    deltas,
                    hist + part,
                )
        for counter in DELTA_COUNTERS:
            by_instance(
                f"sum by ({label}) (increase({name(_newest(counter))}{sel}[{w}]))", deltas, counter
            )
        success = name(_newest("request_success"))
        by_instance(f"sum by ({label}) (increase({success}{sel}[{w}]))", deltas, "finished")
        by_instance(
            f"sum by ({label}, finished_reason) (increase({success}{sel}[{w}]))",
            deltas,
            "finished_",
            extra="finished_reason",
        )
        by_source = name(_newest("prompt_tokens_by_source"))
        by_instance(
            f"sum by ({label}, source) (increase({by_source}{sel}[{w}]))",
            deltas,
            "prompt_source_",
            extra="source",
        )
        for gauge in GAUGES:
            g = name(_newest(gauge))
            agg = "max" if gauge == "kv_cache_usage" else "sum"
            by_instance(f"{agg} by ({label}) (avg_over_time({g}{sel}[{w}]))", mean, gauge)
            by_instance(f"max by ({label}) (max_over_time({g}{sel}[{w}]))", peak, gauge)
        for key, canonical in SPEC_COUNTERS.items():  # no series: not enabled, key left out
            by_instance(
                f"sum by ({label}) (increase({name(_newest(canonical))}{sel}[{w}]))", deltas, key
            )
        per_pos = name(_newest(PER_POS_CANONICAL))
        by_instance(
            f"sum by ({label}, position) (increase({per_pos}{sel}[{w}]))",
            deltas,
            PER_POS_KEY,
            extra="position",
        )
        for key, catalog in NIXL_COUNTERS.items():  # no series: not exported, key left out
            by_instance(
                f"sum by ({label}) (increase({name(_newest(catalog))}{sel}[{w}]))", deltas, key
            )
        for key, catalog in NIXL_HISTOGRAMS.items():
            for part in ("_sum", "_count"):
                by_instance(
                    f"sum by ({label}) (increase({name(_newest(catalog) + part)}{sel}[{w}]))",
                    deltas,
                    key + part,
                )
        reasons = name(_newest("requests_waiting_by_reason"))
        for reason, key in WAITING_REASONS.items():
            r_sel = "{" + ",".join(filter(None, (bare, f'reason="{reason}"'))) + "}"
            by_instance(f"sum by ({label}) (avg_over_time({reasons}{r_sel}[{w}]))", mean, key)
            by_instance(f"max by ({label}) (max_over_time({reasons}{r_sel}[{w}]))", peak, key)
        for hist in BUCKET_HISTOGRAMS:
            bucket = name(_newest(hist) + "_bucket")
            for s in client.instant_query(
                f"sum by ({label}, le) (increase({bucket}{sel}[{w}]))", at=end_s
            ):
                inst, le = s.labels.get(label), s.labels.get("le")
                if inst is None or le is None or math.isnan(s.value):
                    continue
                buckets.setdefault(inst, {}).setdefault(hist, []).append((float(le), s.value))
        vllm = {
            s.labels.get(label)
            for s in client.instant_query(
                f"count by ({label}) (count_over_time({success}{sel}[1h]))", at=end_s
            )
        }
        for s in client.instant_query(f"up{sel}", at=end_s):
            inst = s.labels.get(label)
            if inst is not None and inst in vllm and s.value == 0:
                down[inst] = "Prometheus' last scrape of it failed (up = 0)"
    instances = sorted((set(deltas) | set(mean)) - set(down))
    if not instances:
        raise ConfigError(
            f"Prometheus {redact_url(url)} holds no vLLM series "
            f"{'matching ' + sel + ' ' if sel else ''}over the last {w}: check "
            "--prom-selector and that it scrapes the replicas"
        )
    sources["prom"] = (
        f"{redact_url(url)}: increase/avg_over_time over {w} by {label} ({', '.join(instances)})"
    )
    windows = [
        ReplicaWindow(
            inst,
            deltas.get(inst, {}),
            mean.get(inst, {}),
            peak.get(inst, {}),
            samples=0,
            buckets={h: tuple(sorted(rows)) for h, rows in buckets.get(inst, {}).items()},
        )
        for inst in instances
    ]
    return windows, down


def _newest(canonical: str) -> str:
    """The newest spelling of a canonical metric's base sample (``vllm:`` prefix, counters
    with ``_total``); NIXL's from the query catalog."""
    kind, bases = ALIASES[canonical] if canonical in ALIASES else CATALOG_ONLY[canonical]
    return next(iter(sample_spellings(kind, bases[0])))


# -- spans ------------------------------------------------------------------------------------


def _receiving_spans(path: Path | None) -> bool:
    """Does the store hold spans received lately (a span receiver is running beside)?"""
    if path is None or not Path(path).exists():
        return False
    try:
        with Store(path, readonly=True) as store:
            since = time.time_ns() - round(_RECENT_SPANS_S * 1e9)
            return bool(store.spans(received_since_ns=since, limit=1))
    except StoreError:
        return False


def _window_spans(
    path: Path | None, lo_s: float, hi_s: float, sources: dict[str, str]
) -> list[RequestSpan] | None:
    if path is None:
        return None
    lo_ns, hi_ns = round(lo_s * 1e9), round(hi_s * 1e9)
    try:
        with Store(path, readonly=True) as store:
            found = [
                s
                for s in store.spans(since_ns=lo_ns - round(SPAN_LOOKBACK_S * 1e9), until_ns=hi_ns)
                if lo_ns < s.end_ns <= hi_ns
            ]
    except StoreError as exc:
        sources["spans"] = f"unavailable: {exc}"
        return None
    sources["spans"] = (
        f"{len(found)} request spans that finished in the {hi_s - lo_s:.0f} s window, from {path}"
    )
    return found


def _reader_spans(
    reader: SpanReader, lo_s: float, hi_s: float, sources: dict[str, str]
) -> list[RequestSpan]:
    """The requests that finished in the window, from the fleet's span store (its errors are
    typed and name it: the user asked for it, so they end the check)."""
    found = reader.finished_spans(since_ns=round(lo_s * 1e9), until_ns=round(hi_s * 1e9))
    sources["spans"] = (
        f"{len(found)} request spans that finished in the {hi_s - lo_s:.0f} s "
        f"window, from {reader.where}"
    )
    return found
