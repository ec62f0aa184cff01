"""vLLM's request spans against the real local CPU vLLM: matched, true, and useful under load.

The session's vLLM exports over OTLP/gRPC to the session receiver (conftest). A second vLLM in
this module exports over OTLP/HTTP with ``--max-num-seqs 1``: requests run one at a time there,
so the client can measure the queue each one must have seen (ground truth for the queue
bucket).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace

import pytest
import requests

from phaseprobe.analysis.interfere_cost import PrefillTokenCost
from phaseprobe.analysis.phases import engine_edges, outside_engine, summarize
from phaseprobe.analysis.spans.context import InterferenceEstimate, overlap_context
from phaseprobe.collect.experiment import run_probe
from phaseprobe.collect.open_loop import LoadSettings, OpenLoopLoad
from phaseprobe.collect.run_loop import ProbeSettings
from phaseprobe.collect.spans.attribution import new_tags
from phaseprobe.collect.spans.receiver import SpanReceiver, SpanSink, wait_for
from phaseprobe.local import LocalVllm
from phaseprobe.records import RunSpec
from phaseprobe.store import Store

pytestmark = pytest.mark.integration

SPAN_WAIT_S = 15.0  # the local exporter's batch delay is 0.5 s; a loaded machine is slow


@pytest.fixture()
def spans_on(span_target):
    if span_target is None:
        pytest.skip("an external endpoint exports its spans elsewhere")
    return span_target


def _spec(target, prompt_tokens: int = 64, max_tokens: int = 16) -> RunSpec:
    return RunSpec(
        endpoint=target.base_url,
        model=target.model,
        prompt="",
        max_tokens=max_tokens,
        prompt_tokens_target=prompt_tokens,
    )


def test_every_probe_request_is_matched_to_its_span_over_grpc(local_vllm, spans_on):
    with Store(spans_on.store_path) as store:
        result = run_probe(
            _spec(local_vllm),
            store,
            settings=ProbeSettings(runs=5, warmup=1, span_wait_s=SPAN_WAIT_S, name="spans-idle"),
        )
        stored = store.runs(result.experiment_id)
    ok = [r for r in result.runs if r.status == "ok"]
    assert len(ok) == 5, [r.error for r in result.runs]
    assert all(r.span is not None for r in ok), result.notes  # 100 % matched
    for run in stored:  # what the store kept is what the probe returned
        assert run.span is not None and run.span.trace_id == run.trace_id
        span, client = run.span, run.client
        assert client is not None and run.request_id is not None
        assert span.request_id is not None and run.request_id in span.request_id
        assert span.prompt_tokens == client.prompt_tokens
        assert span.completion_tokens == client.completion_tokens
        # vLLM's clock sits inside the client's: its phases fit in what the client waited.
        assert span.queue_s + span.prefill_s + span.decode_s <= client.e2e_s + 0.002
        assert span.prefill_s <= client.ttft_s + 0.002
        # Time outside the engine's phases (HTTP, tokenizing, detokenizing) is never negative,
        # and the part before the engine queued the request fits inside it.
        outside, pre = outside_engine(run)
        assert outside > 0 and pre is not None and 0 <= pre <= outside + 0.002
        # One host, one clock: the way in and the delivery after the last token are split out,
        # and they fit inside what was outside the engine. With the time before the queue they
        # fit too, but for one overlap: `pre` is vLLM's TTFT − queue − prefill, and vLLM's TTFT
        # ends when the API server has the first token, so `pre` holds that token's way back
        # from the engine, which decode also covers. Idle, that trip is well under a
        # millisecond; on a loaded 2-core CI machine it took 4 ms (the sum came out 4.0014 ms
        # over), so the allowance for it is 10 ms.
        edges = engine_edges(run)
        assert edges is not None, (span.start_ns - client.sent_wall_ns, span.end_ns)
        way_in, delivery = edges
        assert way_in + delivery <= outside + 0.002, (way_in, delivery, outside)
        assert way_in + pre + delivery <= outside + 0.010, (way_in, pre, delivery, outside)
    summary = summarize(stored)
    # The summary takes it from the runs whose client timeline agrees with the server; on a
    # loaded 2-core machine the API server can hold every first token back (each run is then
    # rightly left out), so the summary has the figure exactly when a clean run exists.
    assert (summary.outside_engine_s is not None) == (summary.n_clean > 0), summary
    if summary.outside_engine_s is not None:
        assert summary.outside_engine_s > 0
        assert summary.way_in_s is not None and summary.delivery_s is not None


class SteadyCompany:
    """Two long requests in flight beside the open-loop load, each in a closed loop of its
    own. The probe's runs are short (~40 ms of prefill and
    decode): with the open loop alone at 4 req/s about three in four found nobody inside those
    windows, and one CI run had no run with company at all. One closed loop was not enough
    either: between two of its requests this VM leaves 100 ms gaps, and a probe run tends to
    start in one (it starts when the previous request, often the company's, has finished).
    With two, one is decoding whenever the other is between requests, and their own spans
    (tagged by request id) say exactly when."""

    TAG = "steady-company"

    # Different lengths: two loops of equal requests fall into step (batched together, they
    # end together) and leave their gaps at the same moment.
    LENGTHS = (256, 163)

    def __init__(self, target) -> None:
        self.url = f"{target.base_url}/v1/completions"
        self.model = target.model
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._loop, args=(n,), daemon=True) for n in self.LENGTHS
        ]
        self.sent = 0

    def _loop(self, max_tokens: int) -> None:
        body = {
            "model": self.model,
            "prompt": f"keep the engine company {max_tokens} " * 8,
            "max_tokens": max_tokens,
            "ignore_eos": True,
        }
        with requests.Session() as s:
            while not self.stop.is_set():
                with self.lock:
                    self.sent += 1
                    rid = f"{self.TAG}-{self.sent}"
                s.post(
                    self.url, json=body, timeout=120, headers={"X-Request-Id": rid}
                ).raise_for_status()

    def __enter__(self) -> SteadyCompany:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=120)


def test_probe_under_load_is_attributed_by_span(local_vllm, spans_on, capsys):
    """An open-loop load shares the server with the probe: runs that were not alone take
    their phases from their own span, count in the medians, and their overlap context shows
    what they shared the engine with."""
    settings = ProbeSettings(runs=8, warmup=1, span_wait_s=SPAN_WAIT_S, name="spans-load")
    load = OpenLoopLoad(
        local_vllm.base_url,
        local_vllm.model,
        LoadSettings(rate_per_s=4.0, long_share=0.3, max_tokens=(16, 48)),
    )
    with Store(spans_on.store_path) as store, load, SteadyCompany(local_vllm) as company:
        time.sleep(1.0)  # the load is running before the first measured run
        result = run_probe(_spec(local_vllm), store, settings=settings)
    # The company's and the load's last requests end after the last run; their spans leave
    # in the exporter's next batches: wait until the company's last one is in the store.
    since = min(r.client.sent_wall_ns for r in result.runs if r.client) - 60 * 10**9

    def company_spans() -> list:
        with Store(spans_on.store_path) as s:
            return [
                sp
                for sp in s.spans(since_ns=since)
                if sp.request_id and SteadyCompany.TAG in sp.request_id
            ]

    assert wait_for(lambda: len(company_spans()) >= company.sent, SPAN_WAIT_S), (
        company.sent,
        len(company_spans()),
    )
    time.sleep(1.0)  # the open loop's stragglers
    with Store(spans_on.store_path) as store:
        stored = store.runs(result.experiment_id)
        neighbours = store.spans(since_ns=since)
    assert load.stats.ok > 0, load.stats
    ok = [r for r in stored if r.status == "ok"]
    assert len(ok) == 8, [(r.status, r.error, r.isolation.reasons) for r in stored]
    shared = [r for r in ok if not r.isolated]
    assert len(shared) >= 4, "the load and the company overlapped few runs: little was tested"
    assert all(r.attributed and r.server.source == "span" for r in shared)
    summary = summarize(stored)
    assert summary.n_by_span == len(shared) and summary.n_server == 8
    context = overlap_context(neighbours)
    # The company's own spans say how many of it were decoding during each run's decode (time
    # weighted): the context counts them and the load's requests too, so never fewer.
    company = [w for w in (sp.windows() for sp in company_spans()) if w is not None]
    with_company = 0
    for r in shared:
        w = r.span.windows()
        c = context[(r.span.trace_id, r.span.span_id)]
        length = w.last_token_ns - w.first_token_ns
        if length <= 0:
            continue
        known = (
            sum(
                max(
                    0,
                    min(w.last_token_ns, cw.last_token_ns)
                    - max(w.first_token_ns, cw.first_token_ns),
                )
                for cw in company
            )
            / length
        )
        if known > 0:
            with_company += 1
            assert c.decoding_during_decode_mean_reqs is not None
            assert c.decoding_during_decode_mean_reqs >= known - 1e-6, (known, c)
            assert c.decoding_during_decode_max_reqs >= 1, c
    with capsys.disabled():
        print(
            f"\nruns with the company decoding beside their decode: {with_company} of "
            f"{len(shared)} shared"
        )
    assert with_company >= 1, "the company never decoded beside a run: nothing was tested"
    # The same probe on the idle server (the load stopped): under load the span-attributed
    # prefill stays within the noise of the idle one (prefill runs whole as one batch step),
    # and decode may rise (batched with the load) but never falls far below idle.
    with Store(spans_on.store_path) as store:
        idle = run_probe(
            _spec(local_vllm),
            store,
            settings=ProbeSettings(
                runs=5, warmup=1, span_wait_s=SPAN_WAIT_S, name="spans-idle-reference"
            ),
        )
    idle_summary = summarize(idle.runs)
    assert idle_summary.server_decode_s is not None and summary.server_decode_s is not None
    print(
        f"\nunder load (by span) vs idle: prefill {summary.server_prefill_s * 1e3:.1f} vs "
        f"{idle_summary.server_prefill_s * 1e3:.1f} ms, decode "
        f"{summary.server_decode_s * 1e3:.1f} vs {idle_summary.server_decode_s * 1e3:.1f} ms"
    )
    assert summary.server_decode_s >= 0.5 * idle_summary.server_decode_s
    assert summary.server_prefill_s <= 20 * idle_summary.server_prefill_s
    # The checklist's span rules work on those runs: each reads the experiment's spans and
    # reaches a verdict that quotes its numbers (not "skipped" for want of evidence).
    from phaseprobe.present.cli import main

    capsys.readouterr()
    main(
        [
            "check",
            "--experiment",
            str(result.experiment_id),
            "--store",
            str(spans_on.store_path),
            "--json",
            "--rule",
            "queue_dominated",
            "--rule",
            "prefill_interference",
            "--rule",
            "ttft_outliers",
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert report["sources"].get("spans"), report["sources"]
    verdicts = {v["rule"]: v for v in report["verdicts"]}
    print(
        f"span rules on the loaded experiment: "
        f"{ {k: (v['status'], v['summary'][:90]) for k, v in verdicts.items()} }"
    )
    for rule in ("queue_dominated", "ttft_outliers"):
        v = verdicts[rule]
        assert v["status"] in ("pass", "warn", "fail"), v
        assert any(ch.isdigit() for ch in v["summary"]), v
    # The interference estimate needs 8 requests with another's prefill inside their decode:
    # a short experiment may not have them, and then it says how many it had.
    v = verdicts["prefill_interference"]
    assert v["status"] in ("pass", "warn", "fail") or (
        v["status"] == "skipped" and "need 8" in v["summary"]
    ), v


@pytest.fixture(scope="module")
def one_at_a_time(tmp_path_factory) -> Iterator[tuple[str, str, SpanSink]]:
    """A second local vLLM exporting over OTLP/HTTP protobuf, one sequence at a time."""
    if os.environ.get("PHASEPROBE_TEST_ENDPOINT"):
        pytest.skip("starts its own local vLLM")
    sink = SpanSink(tmp_path_factory.mktemp("spans-http") / "s.sqlite")
    with SpanReceiver(sink, http=("127.0.0.1", 0), grpc=None) as receiver:
        env = {
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }
        args = ["--otlp-traces-endpoint", receiver.http_url or "", "--max-num-seqs", "1"]
        with LocalVllm(extra_args=args, extra_env=env) as server:
            yield server.base_url, server.model, sink
    sink.close()


def test_queue_time_matches_the_client_when_requests_run_one_at_a_time(one_at_a_time):
    base, model, sink = one_at_a_time
    session = requests.Session()
    session.post(
        f"{base}/v1/completions",
        json={"model": model, "prompt": "warm up", "max_tokens": 4},
        timeout=60,
    )
    n = 4
    sent: dict[str, int] = {}
    ended: dict[str, int] = {}
    tags = [new_tags() for _ in range(n)]
    barrier = threading.Barrier(n)

    def one(i: int) -> None:
        body = {
            "model": model,
            "prompt": f"request {i} " + "word " * 40,
            "max_tokens": 24,
            "ignore_eos": True,
        }
        with requests.Session() as s:
            barrier.wait()
            sent[tags[i].trace_id] = time.time_ns()
            r = s.post(f"{base}/v1/completions", json=body, headers=tags[i].headers, timeout=120)
            ended[tags[i].trace_id] = time.time_ns()
            r.raise_for_status()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ids = [t.trace_id for t in tags]
    assert wait_for(lambda: len(sink.store.spans_by_trace(ids)) == n, SPAN_WAIT_S), (
        "spans over OTLP/HTTP did not arrive"
    )
    spans = sink.store.spans_by_trace(ids)
    # Served in order of scheduling (arrival + queue): each waited for the ones before it.
    order = sorted(ids, key=lambda i: spans[i].start_ns + spans[i].queue_s * 1e9)
    assert spans[order[0]].queue_s < 0.05
    errors = []
    for prev, cur in zip(order, order[1:]):
        # Ground truth from the client: the request ahead finished (its last byte reached
        # the client) this long after this one was sent; vLLM scheduled this one then. It
        # cannot have waited longer than that.
        truth_s = (ended[prev] - sent[cur]) / 1e9
        queue_s = spans[cur].queue_s
        errors.append(queue_s - truth_s)
        assert queue_s <= truth_s + 0.06, (prev, cur, truth_s, queue_s)
        # The client's figure also holds what is not queueing, measured on the same wall
        # clock: this request's way in (send → vLLM's arrival stamp) and the delivery of the
        # last byte ahead (vLLM's end stamp → client). On a loaded 2-core box the API server
        # alone can add 200 ms of delivery; the rest must be queue.
        way_in = max(0, spans[cur].start_ns - sent[cur]) / 1e9
        delivery = max(0, ended[prev] - spans[prev].end_ns) / 1e9
        assert queue_s >= (truth_s - way_in - delivery) * 0.75 - 0.06, (
            prev,
            cur,
            truth_s,
            queue_s,
            way_in,
            delivery,
        )
    # The queue grows along the line: each waited for more work than the one before. That
    # holds for requests that arrived together; this VM stalls a thread 100+ ms now and then,
    # and a request that arrives after the one ahead has finished waits for nothing (one CI
    # run: 25 µs, then 17 µs, 40 ms, 84 ms). So: along the requests that reached vLLM within
    # 5 ms of the first (far less than one request's service), to 1 ms. The bounds above hold
    # for every request whatever the stalls.
    first = min(spans[i].start_ns for i in ids)
    together = [i for i in order if spans[i].start_ns - first < 5_000_000]
    queues = [spans[i].queue_s for i in together]
    assert all(b >= a - 1e-3 for a, b in zip(queues, queues[1:])), (together, queues)
    print(
        f"queue − client ground truth: {[f'{e * 1e3:.1f} ms' for e in errors]}; "
        f"median {statistics.median(errors) * 1e3:.1f} ms"
    )


def test_every_probe_request_is_matched_to_its_span_over_http(one_at_a_time, tmp_path):
    """The same 100 % over the other protocol: the probe's runs against a vLLM exporting
    OTLP/HTTP protobuf, attributed from the store the HTTP receiver writes."""
    base, model, sink = one_at_a_time
    spec = RunSpec(endpoint=base, model=model, prompt="", max_tokens=8, prompt_tokens_target=32)
    store = sink.store  # the receiver commits there; the probe reads its spans from it
    result = run_probe(
        spec,
        store,
        settings=ProbeSettings(runs=4, warmup=1, span_wait_s=SPAN_WAIT_S, name="spans-http"),
    )
    ok = [r for r in result.runs if r.status == "ok"]
    assert len(ok) == 4, [r.error for r in result.runs]
    assert all(r.span is not None and r.span.trace_id == r.trace_id for r in ok), result.notes
    assert all(r.span.completion_tokens == r.client.completion_tokens for r in ok)


def test_watch_demo_shows_live_phases(tmp_path):
    """The newcomer's command: `watch --demo` starts the local vLLM exporting to the watch,
    drives a load, and summarises the spans it received."""
    if os.environ.get("PHASEPROBE_TEST_ENDPOINT"):
        pytest.skip("starts its own local vLLM")
    store = tmp_path / "watch.sqlite"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "phaseprobe",
            "watch",
            "--demo",
            "--duration",
            "15",
            "--rate",
            "3",
            "--grpc",
            "127.0.0.1:0",
            "--http",
            "127.0.0.1:0",
            "--store",
            str(store),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    received = doc["receiver"]["request_spans"]
    assert received > 0 and doc["summary"]["count"] == received
    assert doc["load"]["ok"] > 0
    # Every request the load completed came back as a span (none lost on loopback).
    loss = doc["span_loss"]
    assert loss is not None and loss["finished"] is not None
    assert loss["received"] >= loss["finished"] - 1, loss
    with Store(store) as s:
        assert s.span_stats()["requests"] == received


def test_live_interference_estimate_agrees_with_the_interfere_probe(local_vllm, spans_on, tmp_path):
    """The live estimate (from spans of an open-loop load) and the controlled interference
    probe measure the same cost: decode time a decoding request loses per prefill token of
    another request. They must agree in sign and order of magnitude."""
    from phaseprobe.analysis.spans.context import prefill_interference
    from phaseprobe.collect.interplay import Target
    from phaseprobe.collect.interplay.interfere import InterfereSettings, Trigger, run_interfere

    # The probe's default (three pairs of a 600-token B) is a difference of medians of three,
    # and A's decode varies by more than B's prefill adds on a busy box (CI runs measured
    # +171, -60, +352 and -4.7 µs per token with it). Here B is as long as the model allows
    # (950 of 1024 positions) and leaves 30 ms after A, inside A's 64-token decode; each pair
    # is read against the A-alone runs just before and after it (the probe's paired cost).
    # Beside a process keeping one core busy neither trigger holds: 30 ms after A's send put
    # 1 pair of 24 inside (8 late, 15 early); A's first token reaching the client (vLLM then
    # decodes A) put 2 of 24 inside in the clean-clone CI (22 late: the starved API server
    # delivered all of A at once, so B left after A). There, when vLLM's clock shows too few
    # pairs inside in every attempt, the test says so and skips (issue 38 item 7).
    settings = InterfereSettings(
        a_tokens=64, b_prompt_tokens=950, reps=12, trigger=Trigger("time", 0.03)
    )
    # A starved client can make pairs miss A's decode (see interplay): up to three attempts,
    # until one detects the cost on at least half its pairs. The figure compared is that
    # attempt's, else the one that rests on the most pairs.
    cost = None
    said: list[str] = []
    for attempt in range(3):
        with Store(tmp_path / f"interfere-{attempt}.sqlite") as store:
            res = run_interfere(Target(local_vllm.base_url, local_vllm.model), store, settings)
        got = res.token_cost()
        pairs = Counter(f"{p.overlap} ({p.overlap_clock}'s clock)" for p in res.stalls)
        said.append(f"attempt {attempt}: {got.text}; pairs: {dict(pairs)}")
        if got.per_token_s is not None and (cost is None or got.n_with_b >= cost.n_with_b):
            cost = got
        if got.detected and got.n_with_b >= settings.reps // 2:
            break  # decided, on at least half the pairs asked for (3 of 24 decided once)
    if (cost is None or cost.per_token_s is None) and os.getloadavg()[0] > (os.cpu_count() or 1):
        # The probe's own account (the pairs' overlap classes on vLLM's clock, the decodes it
        # knows) says why it has no figure: on a machine running more than it has cores the
        # starved API server hands B on early or late whatever the trigger, so B's prefill
        # seldom lands inside A's decode. The precondition did not happen: said with the
        # probe's account, not concluded either way.
        pytest.skip(
            f"the probe has no cost to compare at load {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} cores: {said}"
        )
    assert cost is not None and cost.per_token_s is not None, said
    assert cost.ci_low_s is not None and cost.ci_high_s is not None
    live = None
    start = time.time_ns()
    # Long prompts of ~700 tokens in 40 % of the arrivals: each that lands in another request's
    # decode moves its rate by tens of ms, so the estimate has overlaps with a visible effect
    # (with 30 % of ~300-token prompts at 3/s it found its interval around 0 in two of five
    # runs). More load until it decides, all of it counted: the spans since the first second.
    load = LoadSettings(rate_per_s=4.0, long_share=0.4, long_words=300, max_tokens=(24, 64))
    for _ in range(4):
        with OpenLoopLoad(local_vllm.base_url, local_vllm.model, load) as running:
            time.sleep(30)
        assert running.stats.ok > 0, running.stats
        time.sleep(2.0)  # the last spans leave in the exporter's next batch
        with Store(spans_on.store_path) as store:
            spans = store.spans(since_ns=start)
        live = prefill_interference(spans)
        if live.detected:
            break
        load = replace(load, seed=load.seed + 1)
    assert live is not None and live.decided, live.text if live else None
    assert live.slope_s_per_token is not None and live.ci_high is not None, live.text
    long = [sp.prompt_tokens for sp in spans if (sp.prompt_tokens or 0) > 200]
    print(
        f"\ninterfere probe: {said}\nlive: {live.text}\nlong prompts: {len(long)}, "
        f"median {statistics.median(long) if long else None} tokens; load {running.stats}"
    )
    # The same sign and order of magnitude, asked of the evidence rather than of two points
    # (either can miss on a busy 2-core box: the probe rests on a dozen pairs, the live figure
    # on a couple of minutes of Poisson load). The sign must be established by at least one of
    # them and contradicted by neither; where both see the cost their points are of one order;
    # where one does, the other's interval still reaches a tenth of its figure.
    disagreement = _interference_disagreement(live, cost)
    load = os.getloadavg()[0]
    if disagreement is not None and load > (os.cpu_count() or 1):
        # A machine running more than it has cores does not measure the same thing twice: the
        # live figure then holds the CPU its long prompts take from the engine (the API server
        # tokenizes them on the engine's core: seen 597 µs [109, 955] per token against the
        # probe's 46.7), and the probe's ~8 ms is within A's decode's ±20 ms (both undecided).
        # Said, not concluded either way.
        pytest.skip(f"not comparable at load {load:.1f} on {os.cpu_count()} cores: {disagreement}")
    assert disagreement is None, disagreement


def _interference_disagreement(live: InterferenceEstimate, cost: PrefillTokenCost) -> str | None:
    """Why the live estimate and the probe's cost per token do not agree (None: they do)."""
    said = f"live: {live.text}; probe: {cost.text}"
    if not (live.detected or cost.detected):
        return f"neither decided the cost ({said})"
    if cost.ci_high_s <= 0 or live.ci_high <= 0:
        return f"one excludes a positive cost ({said})"
    if live.detected and cost.detected:
        ratio = live.slope_s_per_token / cost.per_token_s
        if not 0.1 <= ratio <= 10:
            return f"live / probe = {ratio:.2f}: not the same order of magnitude ({said})"
    elif live.detected:
        slope = live.slope_s_per_token
        if not (cost.ci_high_s >= slope / 10 and cost.ci_low_s <= slope * 10):
            return f"the probe's interval misses the live figure by over 10x ({said})"
    elif not (live.ci_high >= cost.per_token_s / 10 and live.ci_low <= cost.per_token_s * 10):
        return f"the live interval misses the probe's figure by over 10x ({said})"
    return None
