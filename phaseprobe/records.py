"""Data contracts: what one run and one experiment are, with units in every field name.

Definitions phaseprobe uses (they differ between tools, so they are stated once, here):

* ``client.ttft_s`` — request sent → arrival of the bytes of the first token event, reasoning
  or answer (a chat stream's leading role-only chunk is not a token).
* ``client.ttfa_s`` — request sent → arrival of the first event with *answer* text (``content``),
  after any reasoning (``delta.reasoning`` / ``reasoning_content``); equal to TTFT when nothing
  was reasoned, None when the stream ended while still reasoning.
* ``client.itl_s`` — gaps between consecutive token *events*, stamped when their bytes arrive.
  A streamed event can carry several tokens (vLLM merges them when the client lags, and
  speculative decoding emits several per step), so ``len(itl_s)`` can be smaller than
  ``completion_tokens − 1``. Stalls are judged on these gaps.
* ``client.itl_token_s`` — the inter-token latency per *token*: an event that brought k tokens
  after a gap g gives k values g/k (the tokens of the first event came with TTFT and give
  none). Needs ``event_tokens`` (tokens per event, read from the stream); without it, the
  event gaps.
* ``client.tpot_s`` — (e2e − ttft) / (completion_tokens − 1), with ``completion_tokens`` from the
  server's usage block, not from counting chunks. (GuideLLM's TPOT includes the first token;
  llmperf's ITL includes TTFT; phaseprobe's do not.)
* ``client.e2e_s`` — request sent → end of the stream (``[DONE]`` or connection close).
* ``server.*`` — per-request deltas of vLLM's own histograms (``_sum`` after − before, with
  ``_count`` moved by exactly one): queue = scheduled − queued, prefill = first token −
  scheduled, decode = last token − first token, inference = last token − scheduled, and server
  TTFT / e2e measured from arrival (they include tokenization).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, NotRequired, Required, TypedDict

__all__ = [
    "AbArmInfo",
    "AdapterUse",
    "ArmLaunch",
    "ArmOrigin",
    "CountedSpan",
    "PdLegs",
    "ReplicaAttribution",
    "ResponseTimings",
    "RunStatus",
    "RunSpec",
    "ClientTimeline",
    "ServerPhases",
    "Isolation",
    "ClientCheck",
    "Run",
    "Experiment",
    "InterfereArmInfo",
    "RedactedArm",
    "RequestSpan",
    "ServerInfo",
    "SpanWindows",
]

RunStatus = Literal["ok", "error", "isolation_failed", "cancelled"]
Api = Literal["completions", "chat"]


@dataclass(frozen=True)
class RunSpec:
    """What is asked of the server, identical for every run of an experiment."""

    endpoint: str
    model: str
    prompt: str
    max_tokens: int
    api: Api = "completions"
    # The length asked for with --prompt-tokens; such prompts differ per run from their first
    # words on, so prefix caching cannot shorten prefill. None: ``prompt`` is sent every run.
    prompt_tokens_target: int | None = None
    temperature: float = 0.0
    seed: int = 0
    ignore_eos: bool = True
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ClientTimeline:
    """What the client saw. ``event_offsets_ns`` are arrival times relative to the send."""

    sent_wall_ns: int  # time.time_ns() at send: joins with Prometheus / NVML series
    event_offsets_ns: tuple[int, ...]
    end_offset_ns: int
    http_status: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    complete: bool  # the stream ended normally ([DONE] seen)
    # The longest this client process went unscheduled while stamping (StallWatch): stamps
    # can be late by up to this. None: not watched (concurrent streams, older stores).
    client_stall_s: float | None = None
    # Tokens each token event carried (phaseprobe.sources.vllm.stream_tokens); None: the
    # stream did not say (older stores, servers without token ids or running usage).
    event_tokens: tuple[int, ...] | None = None
    # Reasoning streams: the first event with reasoning text and the first with answer text
    # (offsets like event_offsets_ns; None: there was none, or an older store), the reasoning
    # tokens and where that count came from ("usage" or "stream").
    first_reasoning_offset_ns: int | None = None
    first_answer_offset_ns: int | None = None
    reasoning_tokens: int | None = None
    reasoning_tokens_source: str | None = None

    @property
    def ttft_s(self) -> float | None:
        return self.event_offsets_ns[0] / 1e9 if self.event_offsets_ns else None

    @property
    def reasoned(self) -> bool:
        """The stream carried reasoning (shown, or counted by the server's usage)."""
        return self.first_reasoning_offset_ns is not None or bool(self.reasoning_tokens)

    @property
    def ttfa_s(self) -> float | None:
        """Time to the first answer token (None: no answer event, or an older store)."""
        t = self.first_answer_offset_ns
        return t / 1e9 if t is not None else None

    @property
    def answer_tokens(self) -> int | None:
        """completion_tokens − reasoning_tokens (marker tokens count as answer, as vLLM's
        usage counts them); None without both counts."""
        n, r = self.completion_tokens, self.reasoning_tokens
        return n - r if n is not None and r is not None and r <= n else None

    @property
    def itl_token_s(self) -> list[float]:
        """Inter-token latency per token (module doc); the event gaps when the tokens per
        event are unknown."""
        k, t = self.event_tokens, self.event_offsets_ns
        if k is None or len(k) != len(t):
            return self.itl_s
        out: list[float] = []
        last = t[0] if t else 0
        for at, n in zip(t[1:], k[1:]):
            if n > 0:  # an event with no token (a bare finish) ends no gap
                out.extend([(at - last) / 1e9 / n] * n)
                last = at
        return out

    @property
    def e2e_s(self) -> float:
        return self.end_offset_ns / 1e9

    @property
    def itl_s(self) -> list[float]:
        t = self.event_offsets_ns
        return [(b - a) / 1e9 for a, b in zip(t, t[1:])]

    @property
    def tpot_s(self) -> float | None:
        n = self.completion_tokens
        ttft = self.ttft_s
        if ttft is None or n is None or n < 2:
            return None
        return (self.e2e_s - ttft) / (n - 1)

    def to_dict(self) -> dict[str, Any]:
        return {
            "sent_wall_ns": self.sent_wall_ns,
            "event_offsets_ns": list(self.event_offsets_ns),
            "end_offset_ns": self.end_offset_ns,
            "http_status": self.http_status,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reason": self.finish_reason,
            "complete": self.complete,
            "client_stall_s": self.client_stall_s,
            "n_events": len(self.event_offsets_ns),
            "ttft_s": self.ttft_s,
            "e2e_s": self.e2e_s,
            "tpot_s": self.tpot_s,
            "itl_s": self.itl_s,
            "event_tokens": list(self.event_tokens) if self.event_tokens is not None else None,
            "itl_token_s": self.itl_token_s,
            "itl_basis": "tokens" if self.event_tokens is not None else "events",
            "first_reasoning_offset_ns": self.first_reasoning_offset_ns,
            "first_answer_offset_ns": self.first_answer_offset_ns,
            "ttfa_s": self.ttfa_s,
            "reasoning_tokens": self.reasoning_tokens,
            "reasoning_tokens_source": self.reasoning_tokens_source,
            "answer_tokens": self.answer_tokens,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClientTimeline:
        return cls(
            sent_wall_ns=d["sent_wall_ns"],
            event_offsets_ns=tuple(d["event_offsets_ns"]),
            end_offset_ns=d["end_offset_ns"],
            http_status=d["http_status"],
            prompt_tokens=d["prompt_tokens"],
            completion_tokens=d["completion_tokens"],
            finish_reason=d["finish_reason"],
            complete=d["complete"],
            client_stall_s=d.get("client_stall_s"),
            event_tokens=(tuple(d["event_tokens"]) if d.get("event_tokens") is not None else None),
            first_reasoning_offset_ns=d.get("first_reasoning_offset_ns"),
            first_answer_offset_ns=d.get("first_answer_offset_ns"),
            reasoning_tokens=d.get("reasoning_tokens"),
            reasoning_tokens_source=d.get("reasoning_tokens_source"),
        )


@dataclass(frozen=True)
class ServerPhases:
    """One request's phase times from vLLM's histogram deltas or its own span (None: absent)."""

    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    inference_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    count_deltas: dict[str, float]  # canonical histogram name → _count delta (1 when isolated)
    counter_deltas: dict[str, float]  # prompt/generation tokens, prefix-cache hits, preemptions
    # Where the figures came from: "histograms" (the /metrics deltas of an isolated run),
    # "span" (the request's own OpenTelemetry span: valid on a busy server too) or "response"
    # (vLLM ≥ 0.33's per-request metrics object in the response: ResponseTimings; busy too).
    source: str = "histograms"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ServerPhases:
        return cls(**d)


@dataclass(frozen=True)
class ResponseTimings:
    """vLLM's own timing of one request, sent in the response (vLLM ≥ 0.33 started with
    ``--enable-per-request-metrics``: a ``metrics`` object, on the final usage chunk when
    streaming). A third source of server timing beside the histogram deltas and the span,
    under vLLM's definitions for it (``vllm/entrypoints/openai/engine/serving.py``,
    ``build_per_request_timing_metrics``), from the engine's own stamps:

    * ``queue_s`` = scheduled − queued (``queue_time_ms``);
    * ``prefill_s`` = first token − scheduled (``time_to_first_token_ms``: its "TTFT" starts
      at scheduling, so it holds no queue and no tokenization: it is not the span's or the
      histogram's TTFT, which run from arrival, and it is never stored as a TTFT);
    * ``decode_s`` = last token − first token (``generation_time_ms``);
    * ``mean_itl_s`` = decode / (tokens − 1) (``mean_itl_ms``); ``tokens_per_s`` = tokens /
      (last token − scheduled) (``tokens_per_second``).

    None where the server sent null. Valid on a busy server: the stamps are the request's own.
    """

    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    mean_itl_s: float | None
    tokens_per_s: float | None

    def phases(self) -> ServerPhases:
        """The figures as a run's server phases (``source`` "response"; no TTFT or e2e: the
        object has none that runs from arrival)."""
        inference = (
            None
            if self.prefill_s is None or self.decode_s is None
            else self.prefill_s + self.decode_s
        )
        return ServerPhases(
            queue_s=self.queue_s,
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            inference_s=inference,
            ttft_s=None,
            e2e_s=None,
            count_deltas={},
            counter_deltas={},
            source="response",
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ResponseTimings:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Isolation:
    """Was this request alone on the server? ``reasons`` says why not, in words."""

    verified: bool  # False when it could not be checked (no vLLM metrics)
    isolated: bool
    reasons: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"verified": self.verified, "isolated": self.isolated, "reasons": list(self.reasons)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Isolation:
        return cls(verified=d["verified"], isolated=d["isolated"], reasons=tuple(d["reasons"]))


@dataclass(frozen=True)
class ClientCheck:
    """Is the client's timeline consistent with the server's own phases for this request?

    ``consistent`` False: the client stamped what it could not have seen on time (a stalled
    client, a buffering hop): such a run is kept and shown, but left out of medians and
    statistics like a non-isolated run. ``reasons`` quote the numbers that decided it;
    ``cause`` names who held the tokens back (``client``, ``api_server``, ``hop``) when known.
    ``checked`` False: nothing to check against (no server phases, not isolated).
    """

    checked: bool
    consistent: bool
    reasons: tuple[str, ...] = ()
    cause: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "checked": self.checked,
            "consistent": self.consistent,
            "reasons": list(self.reasons),
            "cause": self.cause,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ClientCheck:
        return cls(
            checked=bool(d.get("checked", True)),
            consistent=bool(d["consistent"]),
            reasons=tuple(d.get("reasons") or ()),
            cause=d.get("cause"),
        )


@dataclass(frozen=True)
class PdLegs:
    """One request served by a prefill instance and a decode instance (disaggregated P/D),
    from each instance's own histogram deltas (seconds; None where not measured).

    The prefill leg (1 output token on the prefill instance): ``prefill_queue_s`` and
    ``prefill_s``. The ``hand_over_s``: the prefill leg's end at the client to the decode
    instance scheduling the request = the gap between the legs plus the decode side's queue,
    which is where vLLM books the wait for the remote KV (``decode_kv_wait_s``). Then the
    decode side's prompt work (``decode_prompt_s``: loading the KV, or recomputing the prompt
    when it never arrived) and ``decode_s``. ``kv``: "transferred" (the decode instance took
    the prompt's tokens from the connector), "recomputed" (it computed them itself: the
    hand-over failed although the request succeeded), "partial", or "unknown"; ``kv_reason``
    quotes its numbers (the decode instance's ``prompt_tokens_by_source`` deltas)."""

    prefill_queue_s: float | None
    prefill_s: float | None
    hand_over_s: float | None
    decode_kv_wait_s: float | None
    decode_prompt_s: float | None
    decode_s: float | None
    tokens_transferred: float | None  # decode side: source="external_kv_transfer"
    tokens_computed: float | None  # decode side: source="local_compute"
    tokens_cached: float | None  # decode side: source="local_cache_hit"
    kv: str  # "transferred" | "recomputed" | "partial" | "cached" | "short_prompt" | "unknown"
    kv_reason: str
    legs_gap_s: float | None = None  # the client's gap between the two legs (self-sent legs)
    prefill_isolated: bool | None = None  # each leg alone on its instance
    decode_isolated: bool | None = None
    # the two legs' own spans joined (collect/pd/spans.py): how they were joined, each leg's
    # span id and instance, the hand-over and the client-visible TTFT split on the spans'
    # clocks, and which of the fields above came from the spans (none had counters)
    span_join: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PdLegs:
        return cls(**{k: d.get(k) for k in cls.__dataclass_fields__})  # type: ignore[arg-type]


@dataclass(frozen=True)
class ReplicaAttribution:
    """Which replica of a fleet served one run, and how that is known.

    ``source`` is ``"span"`` (the run's own span's ``service.instance.id`` / host), or
    ``"counters"`` (the one ``--replica`` whose ``/metrics`` counters moved by the run's usage);
    ``name`` None: it could not be told, and ``reason`` says why. ``url``: the replica's base URL
    when it was measured through its ``/metrics`` (credentials stripped)."""

    name: str | None
    source: str | None  # "span" | "counters" | None
    url: str | None = None
    reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ReplicaAttribution:
        return cls(
            name=d.get("name"), source=d.get("source"), url=d.get("url"), reason=d.get("reason")
        )


@dataclass(frozen=True)
class AdapterUse:
    """The LoRA adapter one run asked for (issue 41): the served name in the request's
    ``model``, its base model (``/v1/models``' ``parent``: vLLM's metrics carry the base's
    ``model_name``, never the adapter's), vLLM's ``max_lora`` (``vllm:lora_requests_info``
    after the run; None: not exported), and the adapters of the requests phaseprobe sent
    before it, most recent first, distinct, warm-ups included (base-model requests take no
    adapter slot and are skipped). Whether the run had to load its adapter is told from
    these (:mod:`phaseprobe.analysis.lora`)."""

    name: str
    base: str | None = None
    max_loras: int | None = None
    recent: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "recent": list(self.recent)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AdapterUse:
        m = d.get("max_loras")
        return cls(
            name=str(d.get("name")),
            base=d.get("base"),
            max_loras=int(m) if isinstance(m, (int, float)) else None,
            recent=tuple(str(x) for x in d.get("recent") or ()),
        )


@dataclass(frozen=True)
class Run:
    """One measured request: the spec's prompt as sent, what the client saw, what vLLM said."""

    seq: int
    status: RunStatus
    prompt: str
    client: ClientTimeline | None  # None only when not even a connection was made
    server: ServerPhases | None  # None: client-only run (no usable /metrics)
    isolation: Isolation
    error: str | None = None
    experiment_id: int | None = None
    run_id: int | None = None
    # The client/server consistency verdict taken when the run was measured; None: not
    # judged (stores written before it existed; see phaseprobe.analysis.client_check).
    client_check: ClientCheck | None = None
    # Correlation with vLLM's request span: the W3C trace id and X-Request-Id sent with the
    # request, and the span itself once it arrived (None: tracing off, or no span came).
    trace_id: str | None = None
    request_id: str | None = None
    span: RequestSpan | None = None
    # The replica that served it, behind a router (None: one server, not a fleet run, or an
    # older store)
    replica: ReplicaAttribution | None = None
    # Disaggregated prefill/decode: both legs and the hand-over (None: one instance served it)
    pd: PdLegs | None = None
    # vLLM's per-request metrics object from the response (vLLM ≥ 0.33; None: not read, or
    # the server sent none)
    reported: ResponseTimings | None = None
    # The LoRA adapter the request asked for (None: the base model, or a store written before)
    adapter: AdapterUse | None = None

    @property
    def isolated(self) -> bool:
        return self.isolation.isolated

    @property
    def attributed(self) -> bool:
        """Its server phases are its own: it was alone on the server (histogram deltas), or
        they come from its own span or its response's metrics object (so it counts on a busy
        server too)."""
        return self.isolation.isolated or (
            self.server is not None and self.server.source in ("span", "response")
        )

    def to_dict(self) -> dict[str, Any]:
        client = self.client.to_dict() if self.client else None
        return {
            "run_id": self.run_id,
            "experiment_id": self.experiment_id,
            "seq": self.seq,
            "status": self.status,
            "error": self.error,
            "isolated": self.isolation.isolated,
            "isolation": self.isolation.to_dict(),
            "client_check": self.client_check.to_dict() if self.client_check else None,
            "prompt_tokens": client["prompt_tokens"] if client else None,
            "completion_tokens": client["completion_tokens"] if client else None,
            "client": client,
            "server": self.server.to_dict() if self.server else None,
            "attributed_by": (self.server.source if self.server and self.attributed else None),
            "trace_id": self.trace_id,
            "request_id": self.request_id,
            "span": self.span.to_dict() if self.span else None,
            "replica": self.replica.name if self.replica else None,
            "replica_attribution": self.replica.to_dict() if self.replica else None,
            **({"pd": self.pd.to_dict()} if self.pd is not None else {}),
            **({"reported": self.reported.to_dict()} if self.reported is not None else {}),
            **({"adapter": self.adapter.to_dict()} if self.adapter is not None else {}),
        }


# What an experiment keeps about its server (``Experiment.server_info``): written by
# collect.connection's ``server_info`` and the commands that add their arm or pair to it;
# shown by probe and runs, compared between A/B arms. Plain JSON shapes, so they live here
# with the records that carry them, below every room that writes or reads them.


class ArmLaunch(TypedDict):
    """How phaseprobe starts an arm's server (a playbook's
    :class:`~phaseprobe.collect.ab.playbook.Launch`), secrets redacted."""

    command: tuple[str, ...] | None  # argv prefix; None: ``vllm serve`` or the local CPU vLLM
    args: list[str]  # the launch arguments, secret values replaced by <redacted>
    env: dict[str, str]  # the launch environment, secret values replaced by <redacted>
    pd: NotRequired[bool]  # a local prefill/decode pair (only said when true)
    router: NotRequired[bool]  # ... with vllm-router in P/D mode in front


class RedactedArm(TypedDict):
    """An A/B arm's endpoint and launch as the store keeps them (in the experiment's server
    info): no secrets, no URL credentials."""

    endpoint: str | None  # the arm's URL without credentials; None: phaseprobe launches it
    launch: ArmLaunch | None  # None: the arm is an endpoint already serving
    replicas: NotRequired[dict[str, str]]  # behind a router: replica name → URL (redacted)
    # a prefill/decode pair already up: "prefill", "decode" and "router" (None: phaseprobe
    # sends the two legs itself) URLs, redacted
    pd: NotRequired[dict[str, str | None]]


class AbArmInfo(RedactedArm):
    """Which A/B session and arm an ``ab-arm`` experiment measured (its ``server_info["ab"]``),
    with the arm's endpoint and launch as the store keeps them (no secrets)."""

    session_id: int  # the store's A/B session id
    arm: str  # the playbook's arm name
    role: str  # "A" or "B"


class ArmOrigin(TypedDict, total=False):
    """Where an interfere arm's server came from: an endpoint given on the command line
    (``endpoint`` alone), or a playbook's arm (all four, secrets redacted)."""

    playbook: str  # the playbook's name
    role: str  # "A" or "B"
    endpoint: str | None  # the URL without credentials; None: the playbook launched it
    launch: ArmLaunch | None
    replicas: dict[str, str]  # behind a router: replica name → URL (redacted)
    pd: dict[str, str | None]  # a prefill/decode pair: its instances' and router's URLs


class InterfereArmInfo(ArmOrigin, total=False):
    """Which arm of a two-arm interfere an experiment measured (its
    ``server_info["interfere_arm"]``)."""

    arm: Required[str]  # the arm's name
    group: Required[str]  # "<name>-<wall ns>": the experiments of one two-arm run share it


class ServerInfo(TypedDict):
    """What the server says about itself before any run, as an experiment's ``server_info``
    is written (kept with the experiment, shown by `probe` and `runs`, compared between
    arms). Read back, a stored one is any JSON object: older stores hold other shapes."""

    models: list[dict[str, Any]]  # /v1/models' ``data`` entries, as the server sent them
    vllm_version: str | None  # /version when it is a plain version string ("0.6.3.post1")
    # vllm:cache_config_info's labels, all strings (block counts, bytes, a 0–1 fraction for
    # gpu_memory_utilization); None: no /metrics or no such metric
    cache_config: dict[str, str] | None
    metrics_families: NotRequired[list[str]]  # the vllm* metric names /metrics exposes
    gpus: NotRequired[list[str]]  # a probe sampling GPUs: the device names, by index
    ab: NotRequired[AbArmInfo]  # an A/B arm's experiment
    interfere_arm: NotRequired[InterfereArmInfo]  # a two-arm interfere's experiment
    pd: NotRequired[dict[str, str | None]]  # a P/D pair: prefill, decode, router URLs
    router: NotRequired[bool]  # the endpoint is a router: runs name the replica that served them
    replicas: NotRequired[dict[str, str]]  # behind a router: replica name → its URL (redacted)
    replicas_down: NotRequired[dict[str, str]]  # replica name → why it did not answer


@dataclass(frozen=True)
class Experiment:
    """A named set of runs with the server as it was observed when they were taken."""

    name: str
    kind: str  # "probe" for now; later "ab-arm", ...
    spec: RunSpec
    # as written (connection.server_info and the arm or pair a command adds); read back from
    # a store an older phaseprobe wrote, a key may be missing, so readers use .get
    server_info: ServerInfo
    created_wall_ns: int
    experiment_id: int | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class SpanWindows:
    """Where one request's phases lay on the wall clock (ns since the epoch), rebuilt from its
    span: vLLM stamps the span's start at arrival and reports durations, so the first token is
    at start + TTFT, prefill ends there, decode follows it and the queue precedes prefill.
    ``pre_engine`` is arrival -> queued (HTTP, tokenization); none of it is prefill. It is
    TTFT − queue − prefill, and vLLM takes TTFT when the API server has the first token, so
    it also holds that token's way back from the engine (which overlaps decode's start)."""

    arrival_ns: int
    queued_ns: int
    prefill_start_ns: int
    first_token_ns: int
    last_token_ns: int
    end_ns: int


# RequestSpan's fields in the order every span store keeps them: the embedded store's
# request_spans columns (its INSERT), and the columns read back from ClickHouse. One tuple, so
# a field added to the record is added to both or to neither.
REQUEST_SPAN_COLUMNS = (
    "trace_id",
    "span_id",
    "parent_span_id",
    "request_id",
    "model",
    "service",
    "instance",
    "start_ns",
    "end_ns",
    "queue_s",
    "prefill_s",
    "decode_s",
    "inference_s",
    "ttft_s",
    "e2e_s",
    "prompt_tokens",
    "completion_tokens",
    "max_tokens",
)

# An OTLP span that is not a vLLM request ("other") or cannot be used ("rejected"), as counted
# in the store: (kind, service, span name or reason, start time in ns, key: trace + span id,
# or a digest of the span's bytes when it has none). The key lets a re-sent span count once.
CountedSpan = tuple[str, str, str, int, bytes]


@dataclass(frozen=True)
class RequestSpan:
    """One finished request as vLLM's ``llm_request`` OpenTelemetry span tells it.

    Durations are seconds (vLLM's own attribute units); None where the span lacks the attribute
    (older vLLM, other engines). Under concurrency ``prefill_s`` and ``decode_s`` are the wall
    time of the batches the request was part of, shared with the other requests in them: read
    them with the request's overlap context (phaseprobe.analysis.spans.context).
    """

    trace_id: str  # 32 lowercase hex digits
    span_id: str  # 16 lowercase hex digits
    request_id: str | None  # gen_ai.request.id (vLLM may prefix the client's X-Request-Id)
    model: str | None
    service: str | None  # resource service.name
    instance: str | None  # resource service.instance.id or host.name
    start_ns: int  # span start: the request's arrival at vLLM (wall clock, ns since the epoch)
    end_ns: int
    queue_s: float | None
    prefill_s: float | None
    decode_s: float | None
    inference_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    max_tokens: int | None = None
    parent_span_id: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """decode / (completion tokens - 1): the server's time per output token."""
        n = self.completion_tokens
        if self.decode_s is None or n is None or n < 2:
            return None
        return self.decode_s / (n - 1)

    def phases(self) -> ServerPhases:
        """The span's figures as a run's server phases (``source`` "span")."""
        return ServerPhases(
            queue_s=self.queue_s,
            prefill_s=self.prefill_s,
            decode_s=self.decode_s,
            inference_s=self.inference_s,
            ttft_s=self.ttft_s,
            e2e_s=self.e2e_s,
            count_deltas={},
            counter_deltas={},
            source="span",
        )

    def windows(self) -> SpanWindows | None:
        """The phase windows on the wall clock; None without TTFT, prefill and decode."""
        if self.ttft_s is None or self.prefill_s is None or self.decode_s is None:
            return None
        first = self.start_ns + round(self.ttft_s * 1e9)
        prefill_start = first - round(self.prefill_s * 1e9)
        queued = prefill_start - round((self.queue_s or 0.0) * 1e9)
        return SpanWindows(
            arrival_ns=self.start_ns,
            queued_ns=max(self.start_ns, queued),
            prefill_start_ns=prefill_start,
            first_token_ns=first,
            last_token_ns=first + round(self.decode_s * 1e9),
            end_ns=self.end_ns,
        )

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tpot_s"] = self.tpot_s
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RequestSpan:
        fields: dict[str, Any] = {k: d.get(k) for k in cls.__dataclass_fields__}
        return cls(**fields)
