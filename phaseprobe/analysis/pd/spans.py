"""One request, two legs: join a disaggregated prefill/decode request's two ``llm_request`` spans.

A P/D request is served as a prefill leg (on the prefill instance, 1 output token) and a decode
leg (on the decode instance, the rest); each instance exports its own span. What ties them
(research/fleet_pd.md, vLLM 0.32, vllm-router 0.1.17), tried in this order:

1. **the shared request id**: both legs' ``gen_ai.request.id`` is ``cmpl-<X-Request-Id>-0``
   when a proxy sends the client's X-Request-Id to both (compared without vLLM's
   ``cmpl-``/``chatcmpl-`` prefix and the choice index ``-0``);
2. **the router's id**: vllm-router in P/D mode sends both legs
   ``___prefill_addr_HOST:PORT___decode_addr_HOST:PORT_<uuid32>`` instead of the client's id;
   the addresses name the two instances;
3. **the trace**: with a client ``traceparent`` both legs are in the client's trace under the
   same parent span (two spans of one trace with one parent).

A leg's role: from the user (instance name → "prefill"/"decode"), else from the router id's
addresses matched to the span's instance, else from the legs themselves (the prefill leg has
1 output token and no decode time). One leg known gives the other the other role.

From the two wall clocks (each span's start is its arrival; the phase windows are rebuilt from
its durations, :meth:`RequestSpan.windows`) a :class:`PdSpanRecord` gives the prefill side's
queue and prefill, the **hand-over** (prefill leg's end → the decode leg's scheduling: the gap
between the legs, the decode side's HTTP/tokenization and its queue, which is where vLLM books
an asynchronous connector's wait for the remote KV), the decode side's prompt work (a
synchronous connector's KV load such as the ExampleConnector's, or the prompt recomputed) and
decode, and the client-visible TTFT (prefill-leg arrival → decode leg's first token) split into
parts that add up to it. The two instances' clocks are assumed to agree: across hosts, their
skew lands in the hand-over (a negative one says so).

What cannot be joined is counted and named in :class:`PdJoin` (single legs, groups of more
than two spans, legs whose roles cannot be told), never dropped.

Pure: spans in, records out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from phaseprobe.records import RequestSpan, SpanWindows

__all__ = [
    "PdSpanRecord",
    "PdUnjoined",
    "PdJoin",
    "RouterId",
    "join_legs",
    "normalise_id",
    "parse_router_id",
    "ROLES",
]

ROLES = ("prefill", "decode")

_PREFIXES = ("chatcmpl-", "cmpl-")
_ROUTER_ID = re.compile(
    r"___prefill_addr_(?P<prefill>.+?)___decode_addr_(?P<decode>.+)_"
    r"(?P<uuid>[0-9a-fA-F]{32})"
)


@dataclass(frozen=True)
class RouterId:
    """A P/D router's request id: ``___prefill_addr_P___decode_addr_D_<uuid32>``."""

    prefill_addr: str
    decode_addr: str
    uuid: str


def normalise_id(request_id: str) -> str:
    """The id both legs share: without vLLM's ``cmpl-``/``chatcmpl-`` prefix and the choice
    index suffix ``-0`` (``cmpl-abc-0`` → ``abc``)."""
    rid = request_id.strip()
    for prefix in _PREFIXES:
        if rid.startswith(prefix):
            rid = rid[len(prefix) :]
            break
    if rid.endswith("-0") and len(rid) > 2:
        rid = rid[:-2]
    return rid


def parse_router_id(request_id: str) -> RouterId | None:
    """The prefill and decode addresses in a P/D router's id; None when it is not one."""
    m = _ROUTER_ID.search(request_id)
    if m is None:
        return None
    return RouterId(prefill_addr=m["prefill"], decode_addr=m["decode"], uuid=m["uuid"].lower())


@dataclass(frozen=True)
class PdSpanRecord:
    """One P/D request from its two legs' spans (seconds; None where a span lacks a duration).

    ``joined_by``: "request_id", "router_id" or "trace"; ``roles_from``: "user", "router_id"
    or "legs". Phases: ``prefill_queue_s``, ``prefill_s`` (prefill side); ``hand_over_s`` =
    prefill leg's end → decode leg scheduled = ``legs_gap_s`` (prefill leg's end → decode
    leg's arrival) + ``decode_pre_engine_s`` (its HTTP, tokenization) + ``decode_kv_wait_s``
    (its queue: an asynchronous connector's KV wait); ``decode_prompt_s`` (the decode side's
    prefill: a synchronous connector's KV load, or the prompt recomputed); ``decode_s``.
    ``ttft_s`` = prefill-leg arrival → decode leg's first token, the sum of
    :meth:`ttft_parts_s`; ``e2e_s`` = prefill-leg arrival → decode leg's end."""

    key: str
    joined_by: str
    roles_from: str
    prefill: RequestSpan
    decode: RequestSpan
    prefill_addr: str | None = None  # from the router id
    decode_addr: str | None = None
    prefill_pre_engine_s: float | None = None  # prefill leg's arrival → queued
    prefill_queue_s: float | None = None
    prefill_s: float | None = None
    prefill_return_s: float | None = None  # prefill leg's first token → its end
    hand_over_s: float | None = None
    legs_gap_s: float | None = None
    decode_pre_engine_s: float | None = None
    decode_kv_wait_s: float | None = None
    decode_prompt_s: float | None = None
    decode_s: float | None = None
    ttft_s: float | None = None
    e2e_s: float | None = None

    def ttft_parts_s(self) -> dict[str, float | None]:
        """The client-visible TTFT in its parts, in order; they add up to ``ttft_s``."""
        return {
            "prefill_pre_engine_s": self.prefill_pre_engine_s,
            "prefill_queue_s": self.prefill_queue_s,
            "prefill_s": self.prefill_s,
            "prefill_return_s": self.prefill_return_s,
            "hand_over_s": self.hand_over_s,
            "decode_prompt_s": self.decode_prompt_s,
        }

    @property
    def hand_over_share(self) -> float | None:
        """hand-over / TTFT."""
        if self.hand_over_s is None or not self.ttft_s or self.ttft_s <= 0:
            return None
        return self.hand_over_s / self.ttft_s

    def to_dict(self) -> dict[str, Any]:
        """The request as a JSON-ready dict: its phases (s), both spans, the TTFT parts and the
        hand-over share (a fraction of TTFT)."""
        d: dict[str, Any] = {
            k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("prefill", "decode")
        }
        d["prefill_span"] = self.prefill.to_dict()
        d["decode_span"] = self.decode.to_dict()
        d["ttft_parts_s"] = self.ttft_parts_s()
        d["hand_over_share"] = self.hand_over_share
        return d


@dataclass(frozen=True)
class PdUnjoined:
    """Spans that could not be made one P/D request. ``kind``: "single_leg" (only one side's
    span), "more_than_two" (a key shared by more than two spans) or "unknown_roles" (two legs
    whose prefill and decode cannot be told apart); ``by``: the key's kind ("request_id",
    "router_id", "trace", or "none" for a span with no request id and no parent)."""

    kind: str
    key: str
    by: str
    request_ids: tuple[str | None, ...]
    instances: tuple[str | None, ...]
    span_ids: tuple[str, ...]
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The group as a JSON-ready dict."""
        return {
            "kind": self.kind,
            "key": self.key,
            "by": self.by,
            "request_ids": list(self.request_ids),
            "instances": list(self.instances),
            "span_ids": list(self.span_ids),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class PdJoin:
    """Every span given, either in a joined request or named in ``unjoined``."""

    records: tuple[PdSpanRecord, ...]
    unjoined: tuple[PdUnjoined, ...] = field(default=())

    def of_kind(self, kind: str) -> tuple[PdUnjoined, ...]:
        """The unjoined groups of ``kind`` (single_leg, more_than_two or unknown_roles)."""
        return tuple(u for u in self.unjoined if u.kind == kind)

    @property
    def single_legs(self) -> tuple[PdUnjoined, ...]:
        """The groups with only one side's span."""
        return self.of_kind("single_leg")

    @property
    def more_than_two(self) -> tuple[PdUnjoined, ...]:
        """The keys shared by more than two spans."""
        return self.of_kind("more_than_two")

    @property
    def unknown_roles(self) -> tuple[PdUnjoined, ...]:
        """The two-leg groups whose prefill and decode cannot be told apart."""
        return self.of_kind("unknown_roles")

    def counts(self) -> dict[str, int]:
        """Joined requests, and the groups (and spans) that could not be joined, by kind."""
        out = {"joined_requests": len(self.records)}
        for kind in ("single_leg", "more_than_two", "unknown_roles"):
            groups = self.of_kind(kind)
            out[f"{kind}_groups"] = len(groups)
            out[f"{kind}_spans"] = sum(len(u.span_ids) for u in groups)
        return out

    def to_dict(self) -> dict[str, Any]:
        """The join as a JSON-ready dict: counts, joined requests and unjoined groups."""
        return {
            "counts": self.counts(),
            "requests": [r.to_dict() for r in self.records],
            "unjoined": [u.to_dict() for u in self.unjoined],
        }


# -- joining --------------------------------------------------------------------------------


def join_legs(spans: Iterable[RequestSpan], roles: Mapping[str, str] | None = None) -> PdJoin:
    """Group request spans into P/D requests: by the shared request id (a P/D router's id
    among them), then the spans left alone by trace and parent span. ``roles`` maps an
    instance name (the span's ``instance``, or its ``service``) to "prefill" or "decode"."""
    roles = dict(roles or {})
    bad = {k: v for k, v in roles.items() if v not in ROLES}
    if bad:
        raise ValueError(f"roles must be 'prefill' or 'decode': {bad}")
    by_id: dict[str, list[RequestSpan]] = {}
    leftovers: list[RequestSpan] = []
    for s in spans:
        if s.request_id:
            by_id.setdefault(normalise_id(s.request_id), []).append(s)
        else:
            leftovers.append(s)
    records: list[PdSpanRecord] = []
    unjoined: list[PdUnjoined] = []
    for key, group in by_id.items():
        router = parse_router_id(key)
        by = "router_id" if router is not None else "request_id"
        if len(group) == 1:
            leftovers.append(group[0])  # its other leg may carry another id: try the trace
            continue
        if len(group) == 2:
            _pair(key, by, group, router, roles, records, unjoined)
            continue
        # The same id on more than two spans (a client re-using its X-Request-Id): the
        # traces may still tell the requests apart.
        subgroups = _by_trace(group)
        if len(subgroups) == 1:
            unjoined.append(
                _unjoined(
                    "more_than_two", key, by, group, f"{len(group)} spans share request id {key!r}"
                )
            )
            continue
        for (trace, parent), sub in subgroups.items():
            subkey = f"{key}@{trace}"
            if len(sub) == 2:
                _pair(subkey, by, sub, router, roles, records, unjoined)
            elif len(sub) == 1:
                unjoined.append(_unjoined("single_leg", subkey, by, sub, _single_reason(sub[0])))
            else:
                unjoined.append(
                    _unjoined(
                        "more_than_two",
                        subkey,
                        by,
                        sub,
                        f"{len(sub)} spans share request id {key!r} and "
                        f"trace {trace} (parent {parent})",
                    )
                )
    for (trace, parent), group in _by_trace(leftovers).items():
        key = f"{trace}/{parent or '-'}"
        if len(group) == 1:
            s = group[0]
            by = "request_id" if s.request_id else "none"
            unjoined.append(
                _unjoined(
                    "single_leg",
                    normalise_id(s.request_id) if s.request_id else key,
                    by,
                    group,
                    _single_reason(s),
                )
            )
        elif len(group) == 2:
            _pair(key, "trace", group, None, roles, records, unjoined)
        else:
            unjoined.append(
                _unjoined(
                    "more_than_two",
                    key,
                    "trace",
                    group,
                    f"{len(group)} spans of trace {trace} share parent "
                    f"{parent or '(none)'} and no request id in common",
                )
            )
    records.sort(key=lambda r: (r.prefill.start_ns, r.key))
    unjoined.sort(key=lambda u: (u.kind, u.key))
    return PdJoin(records=tuple(records), unjoined=tuple(unjoined))


def _by_trace(spans: list[RequestSpan]) -> dict[tuple[str, str | None], list[RequestSpan]]:
    out: dict[tuple[str, str | None], list[RequestSpan]] = {}
    for s in spans:
        out.setdefault((s.trace_id, s.parent_span_id), []).append(s)
    return out


def _single_reason(s: RequestSpan) -> str:
    return (
        f"only one leg (instance {s.instance or '?'}, {s.completion_tokens} output "
        "token(s)): its other leg's span is missing, or it was no P/D request"
    )


def _unjoined(kind: str, key: str, by: str, group: list[RequestSpan], reason: str) -> PdUnjoined:
    group = sorted(group, key=lambda s: (s.start_ns, s.span_id))
    return PdUnjoined(
        kind=kind,
        key=key,
        by=by,
        request_ids=tuple(s.request_id for s in group),
        instances=tuple(s.instance for s in group),
        span_ids=tuple(s.span_id for s in group),
        reason=reason,
    )


def _pair(
    key: str,
    by: str,
    group: list[RequestSpan],
    router: RouterId | None,
    roles: Mapping[str, str],
    records: list[PdSpanRecord],
    unjoined: list[PdUnjoined],
) -> None:
    a, b = sorted(group, key=lambda s: (s.start_ns, s.span_id))
    found = _roles(a, b, router, roles)
    if isinstance(found, str):
        unjoined.append(_unjoined("unknown_roles", key, by, [a, b], found))
        return
    prefill, decode, source = found
    records.append(pd_record(key, by, source, prefill, decode, router))


def _complement(ra: str | None, rb: str | None) -> tuple[str, str] | None:
    """Both roles when one or both are known and they differ; else None."""
    if ra is None and rb is None:
        return None
    if ra is None:
        ra = "decode" if rb == "prefill" else "prefill"
    if rb is None:
        rb = "decode" if ra == "prefill" else "prefill"
    return (ra, rb) if ra != rb else None


def _roles(
    a: RequestSpan, b: RequestSpan, router: RouterId | None, roles: Mapping[str, str]
) -> tuple[RequestSpan, RequestSpan, str] | str:
    """(prefill leg, decode leg, where the roles came from), or why they cannot be told."""

    def order(pair: tuple[str, str], source: str) -> tuple[RequestSpan, RequestSpan, str]:
        return (a, b, source) if pair[0] == "prefill" else (b, a, source)

    if roles:
        ua, ub = _user_role(a, roles), _user_role(b, roles)
        if ua is not None or ub is not None:
            pair = _complement(ua, ub)
            if pair is None:
                return (
                    f"both legs are on {ua} instances as given "
                    f"({a.instance or '?'}, {b.instance or '?'})"
                )
            return order(pair, "user")
    if router is not None:
        pair = _complement(_addr_role(a, router), _addr_role(b, router))
        if pair is not None:
            return order(pair, "router_id")
    la, lb = _looks_prefill(a), _looks_prefill(b)
    if la != lb:
        return order(("prefill", "decode") if la else ("decode", "prefill"), "legs")
    what = "both have" if la else "neither has"
    hint = (
        f"; the router id names prefill {router.prefill_addr} and decode "
        f"{router.decode_addr}, matching neither instance"
        if router is not None
        else ""
    )
    return (
        f"{what} 1 output token and no decode time (instances {a.instance or '?'}, "
        f"{b.instance or '?'}){hint}: name the instances' roles "
        "(--prefill-instance / --decode-instance)"
    )


def _user_role(s: RequestSpan, roles: Mapping[str, str]) -> str | None:
    for name in (s.instance, s.service):
        if name is not None and name in roles:
            return roles[name]
    return None


def _addr_role(s: RequestSpan, router: RouterId) -> str | None:
    inst = s.instance
    if not inst:
        return None

    def names(addr: str) -> bool:  # the address in the instance's name, port not cut short
        return re.search(re.escape(addr) + r"(?![0-9])", inst) is not None

    p, d = names(router.prefill_addr), names(router.decode_addr)
    if p == d:  # neither, or both (one address inside the other)
        return None
    return "prefill" if p else "decode"


def _looks_prefill(s: RequestSpan) -> bool:
    return s.completion_tokens == 1 and not s.decode_s


def _windows(s: RequestSpan) -> SpanWindows | None:
    w = s.windows()
    if w is None and s.decode_s is None and s.ttft_s is not None and s.prefill_s is not None:
        w = replace(s, decode_s=0.0).windows()  # a prefill leg that reports no decode
    return w


def _s(ns: int) -> float:
    return ns / 1e9


def pd_record(
    key: str,
    joined_by: str,
    roles_from: str,
    prefill: RequestSpan,
    decode: RequestSpan,
    router: RouterId | None = None,
) -> PdSpanRecord:
    """The P/D record of one request from its prefill-leg and decode-leg spans."""
    wp, wd = _windows(prefill), _windows(decode)
    rec = PdSpanRecord(
        key=key,
        joined_by=joined_by,
        roles_from=roles_from,
        prefill=prefill,
        decode=decode,
        prefill_addr=router.prefill_addr if router is not None else None,
        decode_addr=router.decode_addr if router is not None else None,
        prefill_queue_s=prefill.queue_s,
        prefill_s=prefill.prefill_s,
        legs_gap_s=_s(decode.start_ns - prefill.end_ns),
        decode_kv_wait_s=decode.queue_s,
        decode_prompt_s=decode.prefill_s,
        decode_s=decode.decode_s,
        e2e_s=_s(decode.end_ns - prefill.start_ns),
    )
    if wp is not None:
        rec = replace(
            rec,
            prefill_pre_engine_s=_s(wp.queued_ns - wp.arrival_ns),
            prefill_queue_s=_s(wp.prefill_start_ns - wp.queued_ns),
            prefill_s=_s(wp.first_token_ns - wp.prefill_start_ns),
            prefill_return_s=_s(wp.end_ns - wp.first_token_ns),
        )
    if wd is not None:
        rec = replace(
            rec,
            hand_over_s=_s(wd.prefill_start_ns - prefill.end_ns),
            decode_pre_engine_s=_s(wd.queued_ns - wd.arrival_ns),
            decode_kv_wait_s=_s(wd.prefill_start_ns - wd.queued_ns),
            decode_prompt_s=_s(wd.first_token_ns - wd.prefill_start_ns),
            ttft_s=_s(wd.first_token_ns - prefill.start_ns),
        )
    return rec
