"""Stream one completion from an OpenAI-compatible endpoint and stamp every token event.

Timing is the point of this module, so it reads the socket the cheap way: with
``requests`` in stream mode, one HTTP chunk at a time (``iter_content(chunk_size=None)``, which
for a chunked response yields each chunk as soon as it is complete — vLLM/uvicorn send one SSE
event per chunk), or ``read1`` for a close-delimited body. The stamp is taken right after the
bytes arrive, before any JSON parsing. ``iter_lines``' default 512-byte reads are avoided: they
can hold a finished event back until more bytes arrive, which merges tokens and corrupts ITL.

Faults are data, not exceptions: an HTTP error, a cut stream or a timeout returns a
``StreamOutcome`` with ``error`` set and the partial timeline kept. Only "nothing answers at
all" is raised, by :func:`check_endpoint`, before any run starts.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import requests
import urllib3

from phaseprobe.endpoint_url import EndpointUrl
from phaseprobe.errors import EndpointUnreachable
from phaseprobe.records import ClientTimeline, ResponseTimings
from phaseprobe.redact import register_secret
from phaseprobe.sources.http_deadline import (
    AnswerTooLarge,
    bounded_request,
    mount_deadlines,
    within,
)
from phaseprobe.sources.vllm.stream_tokens import (
    EventKind,
    TokenTally,
    listed_tokens,
    reasoning_count,
    reasoning_text,
    running_total,
)

__all__ = [
    "small_json",
    "StreamClient",
    "DEFAULT_DEADLINE_S",
    "MAX_EVENT_BYTES",
    "StreamOutcome",
    "TokenEventCounter",
    "check_endpoint",
    "normalize_base_url",
    "build_body",
    "usage_counts",
    "MAX_USAGE_TOKENS",
    "response_timings",
]

_ERROR_EXCERPT = 500
# One SSE event of vLLM is a JSON chunk of a few hundred bytes (tens of KB with top logprobs):
# an event this large is a broken or hostile server, and is not buffered further.
MAX_EVENT_BYTES = 8 * 1024 * 1024
# The whole request, when the caller sets no other: a probe's request (tens to thousands of
# tokens) takes seconds; one that has not ended after ten minutes is a server trickling bytes.
DEFAULT_DEADLINE_S = 600.0
CONNECT_TIMEOUT_S = 10.0  # a server that does not accept within this is not there
_MAX_ERROR_BODY = 64 * 1024  # an error answer is read this far, never whole


def _bounded_text(resp: requests.Response) -> str:
    """An error answer's text, at most _MAX_ERROR_BODY bytes of it (a 50 MB error page is
    not read whole)."""
    data = resp.raw.read(_MAX_ERROR_BODY, decode_content=True) or b""
    return data.decode(resp.encoding or "utf-8", "replace")


@dataclass(frozen=True)
class StreamOutcome:
    """One streamed request's outcome: its client timeline, the error that ended it (None:
    completed), the generated text and the server's own timings where it sent them."""

    timeline: ClientTimeline
    error: str | None  # None: the stream completed normally
    text: str  # generated text (for a human glance; never used for token counts)
    # What was wrong with an answer that still counts (a usage block whose counts are not
    # token counts: they are dropped, as if the server had sent no usage)
    notes: tuple[str, ...] = ()
    # vLLM ≥ 0.33's per-request metrics object (--enable-per-request-metrics), on the final
    # usage chunk; None: the server sent none (or one that is not timings: see notes)
    reported: ResponseTimings | None = None


# The per-request metrics object's fields (vLLM 0.33, PerRequestTimingMetrics) → the
# ResponseTimings field and the factor to its unit (ms → s)
_REPORTED_FIELDS = {
    "queue_time_ms": ("queue_s", 1e-3),
    "time_to_first_token_ms": ("prefill_s", 1e-3),
    "generation_time_ms": ("decode_s", 1e-3),
    "mean_itl_ms": ("mean_itl_s", 1e-3),
    "tokens_per_second": ("tokens_per_s", 1.0),
}
# A request's timing in ms above this (a year) is not a timing
_MAX_REPORTED = 3.2e10


def response_timings(metrics: Any) -> tuple[ResponseTimings | None, str | None]:
    """``(timings, note)`` from a response's ``metrics`` object (vLLM ≥ 0.33). Each field is
    a finite number from 0 up, or null (vLLM sends null, or leaves it out when streaming, where
    it has no stamp); anything else makes the whole object ignored, and ``note`` says why.
    An object with no known field is no timings (None, no note)."""
    if not isinstance(metrics, dict):
        return None, (f"the response's metrics is not an object ({_short(repr(metrics))}): ignored")
    values: dict[str, float | None] = {}
    for key, (field_name, scale) in _REPORTED_FIELDS.items():
        value = metrics.get(key)
        if value is None:
            values[field_name] = None
            continue
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not 0 <= value <= _MAX_REPORTED
        ):  # NaN fails both comparisons
            return None, (
                f"the response's metrics {key} {_short(repr(value))} is not a "
                f"timing: its metrics object is ignored"
            )
        values[field_name] = float(value) * scale
    if all(v is None for v in values.values()):
        return None, None
    return ResponseTimings(**values), None


# The most tokens one request's usage may claim: far above any context window served, far
# below what would overflow a SQLite INTEGER or make TPOT meaningless.
MAX_USAGE_TOKENS = 1 << 32


def usage_counts(usage: dict[str, Any] | None) -> tuple[int | None, int | None, str | None]:
    """``(prompt_tokens, completion_tokens, note)`` from a server's usage block. A count must
    be a whole number from 0 to :data:`MAX_USAGE_TOKENS` (not a bool, a string, a float, NaN
    or Infinity); otherwise the usage is treated as missing (both None) and ``note`` says why.
    """
    if usage is None:
        return None, None, None
    counts: list[int | None] = []
    for key in ("prompt_tokens", "completion_tokens"):
        value = usage.get(key)
        if value is None:
            counts.append(None)
        elif (
            isinstance(value, int)
            and not isinstance(value, bool)
            and 0 <= value <= MAX_USAGE_TOKENS
        ):
            counts.append(value)
        else:
            huge = isinstance(value, int) and abs(value) >= 10**30
            shown = f"a {len(str(abs(value)))}-digit number" if huge else _short(repr(value))
            return (
                None,
                None,
                (
                    f"usage {key} {shown} is not a token count (0 .. "
                    f"{MAX_USAGE_TOKENS}): the server's usage is ignored"
                ),
            )
    return counts[0], counts[1], None


def build_body(
    *,
    model: str,
    prompt: str,
    max_tokens: int,
    chat: bool,
    temperature: float = 0.0,
    seed: int = 0,
    ignore_eos: bool = True,
) -> dict[str, Any]:
    """The request body of a controlled run: fixed length, greedy, usage reported, and the
    token ids of every chunk (so that an event carrying several tokens counts as several)."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
        "stream": True,
        # n_out comes from the server's usage, never from counting chunks.
        "stream_options": {"include_usage": True},
        "ignore_eos": ignore_eos,  # vLLM extension: decode exactly max_tokens
        # vLLM >= 0.10.2 extension: each chunk lists its token ids, so ITL is per token when
        # an event carries several (merged, or speculative decoding); older servers ignore it
        "return_token_ids": True,
    }
    if chat:
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    return body


def normalize_base_url(url: str) -> str:
    """The server's base URL as phaseprobe appends paths to it: ``host:8000`` and
    ``http://host:8000/v1/`` both become ``http://host:8000``. What newcomers type (the
    OpenAI client's ``base_url`` ends in ``/v1``; a bare host has no scheme) would otherwise
    end in ``…/v1/v1/models (HTTP 404)`` or requests' "No connection adapters". The rules are
    :meth:`EndpointUrl.parse`'s; a refusal is its UrlError (a ConfigError)."""
    return str(
        EndpointUrl.parse(
            url,
            what="endpoint",
            query_hint="pass an API key through the environment (--api-key-env VAR)",
            drop_suffix="/v1",
        )
    )


# /v1/models is kept with each experiment: a server answering megabytes (or thousands of
# models) must not go into the store whole. What a model entry keeps, and how many entries.
MAX_MODELS_ANSWER_BYTES = 1024 * 1024
# The preflight's own limits: /v1/models answers in milliseconds when the server is up.
PREFLIGHT_TIMEOUT_S = 10.0
PREFLIGHT_DEADLINE_S = 30.0
MAX_MODELS_KEPT = 32
_MODEL_FIELDS = ("id", "object", "owned_by", "root", "parent", "max_model_len", "created")


def check_endpoint(
    base_url: str,
    *,
    session: requests.Session,
    headers: dict[str, str],
    timeout_s: float = PREFLIGHT_TIMEOUT_S,
    deadline_s: float | None = PREFLIGHT_DEADLINE_S,
) -> list[dict[str, Any]]:
    """Fail early and clearly if nothing usable answers; return ``/v1/models``' model list:
    validated (objects with a string ``id``), at most MAX_MODELS_KEPT entries of their small
    known fields (strings cut at 512 characters); the answer is read at most 1 MB, with no gap
    over ``timeout_s`` and within ``deadline_s`` (and three gaps) in all: a probe's
    --timeout/--deadline shorten the preflight's own 10 s and 30 s, never lengthen them."""
    target = EndpointUrl.known(base_url).join("/v1/models")
    url, shown = str(target), target.redacted
    timeout_s = min(timeout_s, PREFLIGHT_TIMEOUT_S)
    # three reads' worth in all (a trickling answer ends too), never past the asked deadline
    deadline_s = min(
        3 * timeout_s,
        PREFLIGHT_DEADLINE_S,
        PREFLIGHT_DEADLINE_S if deadline_s is None else deadline_s,
    )
    try:
        resp = bounded_request(
            session,
            "GET",
            url,
            headers=headers,
            timeout_s=timeout_s,
            deadline_s=deadline_s,
            max_bytes=MAX_MODELS_ANSWER_BYTES,
        )
        body = resp.content
    except AnswerTooLarge:
        raise EndpointUnreachable(
            shown,
            f"answer over {MAX_MODELS_ANSWER_BYTES} bytes: not an "
            "OpenAI model list phaseprobe will read",
        ) from None
    except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
        raise EndpointUnreachable(shown, type(exc).__name__ + ": " + _short(str(exc))) from None
    if resp.status_code != 200:
        raise EndpointUnreachable(
            shown, f"HTTP {resp.status_code}: {_short(body.decode('utf-8', 'replace'))}"
        )
    try:
        doc = json.loads(body)
    except RecursionError:
        raise EndpointUnreachable(shown, "answer nested too deeply") from None
    except ValueError:
        raise EndpointUnreachable(shown, "answer is not JSON (not an OpenAI model list)") from None
    data = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(data, list):
        raise EndpointUnreachable(shown, "answer is not an OpenAI model list (no 'data' list)")
    models: list[dict[str, Any]] = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("id"), str) or not item["id"]:
            raise EndpointUnreachable(shown, f"model {i} of the answer has no string 'id'")
        if len(models) < MAX_MODELS_KEPT:
            models.append(
                {
                    k: (v[:512] if isinstance(v, str) else v)
                    for k, v in item.items()
                    if k in _MODEL_FIELDS and isinstance(v, (str, int, float))
                }
            )
    if len(data) > MAX_MODELS_KEPT:
        models[-1] = {
            **models[-1],
            "phaseprobe_note": f"{len(data) - MAX_MODELS_KEPT} more model(s) not kept",
        }
    return models


MAX_SMALL_ANSWER_BYTES = 64 * 1024  # /version, /tokenize: a few dozen bytes when sane


def small_json(
    session: requests.Session,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    timeout_s: float,
    body: Any = None,
    max_bytes: int = MAX_SMALL_ANSWER_BYTES,
) -> Any:
    """A small JSON answer (``/version``, ``/tokenize``) or None: not 200, not JSON, over
    ``max_bytes``, nested too deeply, or unreachable. These answers are optional extras, so
    any of that means "not available", never a traceback; callers still validate the shape of
    what comes back. An answer that grows with its question (``/tokenize`` lists every token)
    needs a ``max_bytes`` that grows with it: past the cap, a true answer reads as none."""
    try:
        resp = bounded_request(
            session,
            method,
            url,
            headers=headers,
            timeout_s=timeout_s,
            deadline_s=max(timeout_s, 1.0) * 3,
            json=body,
            max_bytes=max_bytes,
        )
        data = resp.content
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError):
        return None
    if resp.status_code != 200:
        return None
    try:
        return json.loads(data)
    except (ValueError, RecursionError):
        return None


class StreamClient:
    """Sends streaming completion requests; the clock is injectable for tests."""

    def __init__(
        self,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout_s: float = 120.0,
        deadline_s: float | None = None,
        max_event_bytes: int = MAX_EVENT_BYTES,
        session: requests.Session | None = None,
        clock_ns: Callable[[], int] = time.perf_counter_ns,
        wall_ns: Callable[[], int] = time.time_ns,
    ) -> None:
        self._base = EndpointUrl.known(base_url)  # redacted once, for every message
        self.base_url = str(self._base)
        self.timeout_s = timeout_s  # connect, and each read (no byte for this long)
        self.deadline_s = deadline_s  # the whole request, first byte to last (None: none)
        self.max_event_bytes = max_event_bytes
        # mounted so that --deadline reaches the socket from the connection on: a server
        # trickling its response headers is cut at the deadline too
        self.session = mount_deadlines(session or requests.Session())
        self._clock_ns = clock_ns
        self._wall_ns = wall_ns
        # The key lives only in this header dict: never logged, stored or put in a message.
        self.headers = {"Accept": "text/event-stream"}
        register_secret(api_key)
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"
        # requests sends a URL's user:password as Basic auth in place of our Authorization
        # header, whatever it holds: say that the key is not sent (never what the secrets are).
        self.auth_note: str | None = None
        if api_key and self._base.sends_basic_auth:
            self.auth_note = (
                "the endpoint URL carries user:password, so HTTP Basic auth is "
                "sent and the API key (Bearer) is not: drop one of the two"
            )

    def stream(
        self,
        body: dict[str, Any],
        on_events: Callable[[list[bytes]], None] | None = None,
        headers: dict[str, str] | None = None,
    ) -> StreamOutcome:
        """Send ``body`` and stamp every event. ``on_events(raw)`` is called from this thread
        with the SSE events each read completed, right after they are stamped (a
        :class:`TokenEventCounter` tells which carry tokens); it must be quick. ``headers``
        are added to this request's (e.g. a trace's ``traceparent``)."""
        chat = "messages" in body
        target = self._base.join("/v1/chat/completions" if chat else "/v1/completions")
        url, shown = str(target), target.redacted  # messages quote shown: no credentials
        events: list[int] = []
        state = _StreamState()
        status: int | None = None
        error: str | None = None
        wall0 = self._wall_ns()
        t0 = self._clock_ns()
        sent = {**self.headers, **headers} if headers else self.headers
        connect_s = min(self.timeout_s, CONNECT_TIMEOUT_S)
        # The deadline runs from before the connection: a server trickling its headers (or
        # bytes inside one chunk, where the read loop never looks at the clock) has its
        # socket shut from outside at the deadline, and the blocked read fails at once.
        with within(self.deadline_s, f"POST {shown}", quiet=True) as deadline:
            try:
                with self.session.post(
                    url, json=body, headers=sent, stream=True, timeout=(connect_s, self.timeout_s)
                ) as resp:
                    status = resp.status_code
                    if status >= 400:
                        error = f"HTTP {status}: {_short(_bounded_text(resp))}"
                    else:
                        self._read_events(resp, t0, chat, events, state, on_events)
                        if deadline.fired:
                            error = self._deadline_text()
                        elif state.error:
                            error = state.error
                        elif not state.done:
                            error = _unfinished(resp, events, state)
                        elif not events and state.usage is None:
                            error = (
                                "the stream held no token and no usage before [DONE]: "
                                "not a completion"
                            )
            except (requests.RequestException, urllib3.exceptions.HTTPError) as exc:
                if deadline.fired:
                    error = self._deadline_text()
                elif isinstance(exc, requests.ConnectTimeout):
                    error = f"timeout: could not connect to {shown} within {connect_s:g} s"
                elif _is_timeout(exc) and not events:
                    error = (
                        f"timeout: no first byte from {shown} within {self.timeout_s:g} "
                        "s (--timeout)"
                    )
                elif _is_timeout(exc):
                    error = (
                        f"timeout: the stream stalled: no bytes for {self.timeout_s:g} s "
                        f"after {len(events)} token events at {shown} (--timeout)"
                    )
                else:
                    error = (
                        f"stream cut after {len(events)} token events: "
                        f"{type(exc).__name__}: {_short(str(exc))}"
                    )
        end = self._clock_ns() - t0
        prompt_tokens, completion_tokens, usage_note = usage_counts(state.usage)
        reported, metrics_note = (
            response_timings(state.metrics) if state.metrics is not None else (None, None)
        )
        tally = state.tally
        event_tokens, tokens_note = tally.per_event(completion_tokens)
        reasoning, reasoning_source, reasoning_note = reasoning_count(
            tally, event_tokens, state.usage if usage_note is None else None
        )
        first_reasoning, first_answer = (
            tally.first("reasoning", "both"),
            tally.first("answer", "both"),
        )
        timeline = ClientTimeline(
            sent_wall_ns=wall0,
            event_offsets_ns=tuple(events),
            end_offset_ns=end,
            http_status=status,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=state.finish_reason,
            complete=state.done and error is None,
            event_tokens=event_tokens,
            first_reasoning_offset_ns=_at(events, first_reasoning),
            first_answer_offset_ns=_at(events, first_answer),
            reasoning_tokens=reasoning,
            reasoning_tokens_source=reasoning_source,
        )
        no_answer = (
            f"the stream ended while still reasoning (finish reason "
            f"{state.finish_reason or 'none'}): no answer token, so no time to first answer"
            if first_reasoning is not None and first_answer is None and error is None
            else None
        )
        notes = tuple(
            n for n in (usage_note, metrics_note, tokens_note, reasoning_note, no_answer) if n
        )
        return StreamOutcome(
            timeline=timeline, error=error, text="".join(state.text), notes=notes, reported=reported
        )

    def _deadline_text(self) -> str:
        return f"deadline: the whole request took more than {self.deadline_s:g} s (--deadline)"

    def _read_events(
        self,
        resp: requests.Response,
        t0: int,
        chat: bool,
        events: list[int],
        state: _StreamState,
        on_events: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        # Hot path: stamp, split, keep the raw event. JSON is parsed after the stream ends, so
        # the next event's stamp never waits on the previous one's parsing.
        clock = self._clock_ns
        raw_events: list[tuple[int, bytes]] = []
        # Linear in the stream: bytes are appended to one buffer, and each search for the
        # event boundary starts where the previous one stopped (an event split over many
        # chunks is not rescanned from its start, which made a 64 MB event take 42 s).
        buf = bytearray()
        pos = 0  # start of the first unconsumed byte
        scanned = 0  # boundaries cannot start before this (minus the separator's length)
        received = 0
        cap = self.max_event_bytes
        lf_pending = False  # the last chunk ended in CR: a LF opening the next one is its pair
        deadline_ns = None if self.deadline_s is None else self.deadline_s * 1e9
        head_open = True  # state.head still shorter than _HEAD_BYTES
        try:
            for chunk in _chunks(resp):
                t = clock() - t0
                received += len(chunk)
                if head_open:
                    state.head += chunk[: _HEAD_BYTES - len(state.head)]
                    head_open = len(state.head) < _HEAD_BYTES
                if lf_pending and chunk.startswith(b"\n"):
                    chunk = chunk[1:]
                if b"\r" in chunk:
                    # SSE ends lines with LF, CRLF or a lone CR: all become LF, so one search
                    # finds every event boundary (vLLM's plain LF stream never gets here)
                    lf_pending = chunk.endswith(b"\r")
                    chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
                else:
                    lf_pending = False
                if not buf and chunk.endswith(b"\n\n") and chunk.find(b"\n\n") == len(chunk) - 2:
                    # The usual chunk: one whole event (vLLM writes one per chunk), nothing
                    # held over: kept as it is, without passing through the buffer.
                    raw = chunk[:-2]
                    raw_events.append((t, raw))
                    if on_events is not None:
                        on_events([raw])
                    if raw.endswith(b"[DONE]"):
                        break
                    if deadline_ns is not None and t > deadline_ns:
                        state.error = self._deadline_text()
                        break
                    continue
                n_before = len(raw_events)
                buf += chunk
                while True:
                    i = buf.find(b"\n\n", max(pos, scanned - 1))
                    if i < 0:
                        scanned = len(buf)
                        break
                    raw_events.append((t, bytes(buf[pos:i])))
                    pos = scanned = i + 2
                if len(buf) - pos > cap:
                    state.error = (
                        f"an SSE event grew past {cap} bytes without ending (at "
                        f"byte {received} of the stream): not a token stream"
                    )
                    break
                if pos:  # drop what was consumed: once per chunk, not once per event
                    del buf[:pos]
                    scanned -= pos
                    pos = 0
                if on_events is not None and len(raw_events) > n_before:
                    on_events([raw for _, raw in raw_events[n_before:]])
                if raw_events and raw_events[-1][1].endswith(b"[DONE]"):
                    break
                if deadline_ns is not None and t > deadline_ns:
                    state.error = self._deadline_text()
                    break
        finally:
            # Even a cut stream's events are parsed: the partial timeline is kept.
            first_error = state.error
            state.error = None
            for t, raw in raw_events:
                if state.feed(raw, chat):
                    events.append(t)
                if state.done or state.error:
                    break
            state.error = state.error or first_error


class TokenEventCounter:
    """Counts the token events among raw SSE events as they arrive, by the same rule as the
    timeline (an event with answer or reasoning text, or the final one with a finish reason):
    a role-only chat event, the usage chunk, a reasoning parser's hidden marker or an event
    whose text is still empty (a token that completes no character yet) is not a token
    event."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.count = 0
        self._state = _StreamState()

    def feed(self, raw_events: list[bytes]) -> int:
        """The number of token events counted so far, ``raw_events`` (raw SSE events) included."""
        for raw in raw_events:
            if self._state.feed(raw, self.chat):
                self.count += 1
        return self.count


def _at(events: list[int], index: int | None) -> int | None:
    """The arrival offset of token event ``index`` (None: no such event was stamped)."""
    return events[index] if index is not None and index < len(events) else None


class _StreamState:
    """Parses SSE events; ``feed`` says whether an event carried generated tokens (answer or
    reasoning text, or the final finish reason), and ``tally`` keeps each one's tokens and
    kind."""

    __slots__ = ("done", "error", "usage", "metrics", "finish_reason", "text", "head", "tally")

    def __init__(self) -> None:
        self.done = False
        self.error: str | None = None
        self.usage: dict[str, Any] | None = None
        self.metrics: Any = None  # vLLM >= 0.33's per-request metrics object, as sent
        self.finish_reason: str | None = None
        self.text: list[str] = []
        self.head = b""  # the answer's first bytes, to say what it was when it was no stream
        self.tally = TokenTally()

    def feed(self, raw: bytes, chat: bool) -> bool:
        # One line (vLLM's every event): no split, no join. A bare CR ends a line too in SSE
        # (and in splitlines below): an event holding one is read line by line.
        if b"\n" not in raw and b"\r" not in raw:
            if raw.startswith(b"data: {"):  # vLLM's usual token event, read in place
                plain = _PLAIN_EVENT(raw, 6)
                if plain is not None and (raw.isascii() or _utf8(raw)):
                    taken = self._take_plain(plain, chat)
                    if taken is not None:
                        return taken
            data = raw[5:].lstrip() if raw.startswith(b"data:") else b""
        else:
            data = b"".join(
                line[5:].lstrip() for line in raw.splitlines() if line.startswith(b"data:")
            )
        if not data:
            return False  # comment / keep-alive
        if data == b"[DONE]":
            self.done = True
            return False
        try:
            obj = _json_object(data)
        except ValueError:
            self.error = f"malformed SSE event: {_short(data.decode('utf-8', 'replace'))}"
            return False
        try:
            return self._take(obj, chat)
        except (AttributeError, TypeError, KeyError, IndexError):
            self.error = "unexpected SSE event shape: " + _short(data.decode("utf-8", "replace"))
            return False

    def _take(self, obj: Any, chat: bool) -> bool:
        if "error" in obj and "choices" not in obj:  # vLLM reports mid-stream failures so
            self.error = "server error mid-stream: " + _short(json.dumps(obj["error"]))
            return False
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        if obj.get("metrics") is not None:  # vLLM >= 0.33: on the final usage chunk
            self.metrics = obj["metrics"]
        choices = obj.get("choices") or ()
        if not choices:
            return False  # the usage-only chunk
        choice = choices[0]
        if chat:
            delta = choice.get("delta") or {}
            piece, thought = delta.get("content"), reasoning_text(delta)
        else:
            piece, thought = choice.get("text"), None
        ids = choice.get("token_ids")  # the usual list first, without the helpers' calls
        return self._count(
            piece,
            thought,
            choice.get("finish_reason"),
            len(ids) if type(ids) is list else listed_tokens(choice, chat),
            None if usage is None else running_total(usage),
        )

    def _count(
        self, piece: Any, thought: str | None, finish: Any, listed: int | None, total: int | None
    ) -> bool:
        """One chunk's text, reasoning, finish reason, listed tokens and running usage total
        into the state and the tally; whether it was a token event."""
        if finish:
            self.finish_reason = str(finish)
        if piece:
            self.text.append(str(piece))
        kind: EventKind = (
            ("both" if thought else "answer") if piece else ("reasoning" if thought else "none")
        )
        # A chat stream opens with a role-only chunk (content ""): not a token. A final chunk
        # with a finish reason but no text still marks when the last token was emitted. A
        # reasoning event is a token: TTFT is the first token of either kind.
        token_event = bool(piece or thought or finish)
        self.tally.add(token_event, kind, listed, total)
        return token_event

    def _take_plain(self, m: re.Match[bytes], chat: bool) -> bool | None:
        """:meth:`_take` of an event :data:`_PLAIN_EVENT` matched, read from the match (see
        there); None when its usage is not one JSON object (the caller parses it whole)."""
        text, key, value, finish, ids, usage_raw = m.groups()
        usage: Any = None
        if usage_raw is not None:
            try:
                usage = _json_object(usage_raw)
            except ValueError:
                return None
            if isinstance(usage, dict):
                self.usage = usage
        piece: str | None = None
        thought: str | None = None
        if not chat:
            piece = None if text is None else text.decode()
        elif key == b"content":
            piece = value.decode()
        elif key is not None:  # reasoning or reasoning_content, the delta's only field
            thought = value.decode() or None
        # _count's lines, inline (one call less on the hot path)
        if finish:
            self.finish_reason = finish.decode()
        if piece:
            self.text.append(piece)
        kind: EventKind = (
            ("both" if thought else "answer") if piece else ("reasoning" if thought else "none")
        )
        token_event = bool(piece or thought or finish)
        self.tally.add(
            token_event,
            kind,
            None if ids is None else ids.count(b",") + 1 if ids else 0,
            None if usage is None else running_total(usage),
        )
        return token_event


# The token event vLLM streams most (one a token), read without building its JSON: an object
# of exactly these members in this order, written without spaces, every string without an
# escape or a control character, the numbers JSON integers. The completions API's chunk:
#   {"id":"…","object":"text_completion","created":N,"model":"…","choices":[{"index":0,
#    "text":"…","logprobs":null,"finish_reason":null,"stop_reason":null,
#    ["prompt_token_ids":null,]"token_ids":[N,…]}][,"usage":null|{…}]}
# and the chat API's, whose delta holds one of content, reasoning, reasoning_content:
#   {…,"choices":[{"index":0,"delta":{"content":"…"},"logprobs":null,"finish_reason":null,
#    "token_ids":[N,…]}][,"usage":…]}
# (finish_reason may be a string, stop_reason present or not, token_ids null or absent). Each
# is valid JSON whose value json.loads gives is fixed by the groups, so what _take reads from
# that value is read from them (tests/unit/test_client_speed_plain.py holds the two equal);
# the usage object, when there is one, is parsed as JSON. Anything else is parsed whole.
_STR = rb'[^"\\\x00-\x1f]*'
_INT = rb"(?:0|[1-9][0-9]*)"
_PLAIN_EVENT: Callable[..., re.Match[bytes] | None] = re.compile(
    rb'\{"id":"' + _STR + rb'","object":"(?:text_completion|chat\.completion\.chunk)",'
    rb'"created":' + _INT + rb',"model":"' + _STR + rb'","choices":\[\{"index":0,'
    rb'(?:"text":"(' + _STR + rb')"'
    rb'|"delta":\{"(content|reasoning|reasoning_content)":"(' + _STR + rb')"\})'
    rb',"logprobs":null,"finish_reason":(?:null|"(' + _STR + rb')")(?:,"stop_reason":null)?'
    rb'(?:,"prompt_token_ids":null)?'
    rb'(?:,"token_ids":(?:null|\[(' + _INT + rb"(?:," + _INT + rb")*|)\]))?\}\]"
    rb'(?:,"usage":(?:null|(\{.*\})))?\}',
    re.DOTALL,
).fullmatch


def _utf8(data: bytes) -> bool:
    """Whether ``data`` is UTF-8 (json.loads reads bytes as UTF-8, surrogates let through:
    an event that is not strict UTF-8 is parsed the general way)."""
    try:
        data.decode()
    except UnicodeDecodeError:
        return False
    return True


# json.loads' own C scanner, configured as json.loads' (typeshed does not list it)
_SCAN: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def _json_object(data: bytes) -> Any:
    """``json.loads(data)``, for the usual event (a UTF-8 JSON object) without its detour
    through detecting the encoding and matching whitespace: the same object; anything else,
    and any error, goes through json.loads itself (raises ValueError as it does)."""
    if data[:1] == b"{" and data[-1:] == b"}":
        try:
            text = data.decode()
            obj, end = _SCAN(text, 0)
        except (ValueError, StopIteration):
            return json.loads(data)
        if end == len(text):
            return obj
    return json.loads(data)


def _chunks(resp: requests.Response) -> Iterator[bytes]:
    raw = resp.raw
    if getattr(raw, "chunked", False):
        # requests' own iterator, not wrapped in a generator: one frame less per chunk
        return iter(resp.iter_content(chunk_size=None))
    return _read1_chunks(raw)


def _read1_chunks(raw: Any) -> Iterator[bytes]:
    # Close-delimited body: iter_content(None) would read to EOF in one go; read1 returns
    # whatever has arrived.
    while True:
        try:
            data = raw.read1(65536)
        except urllib3.exceptions.HTTPError as exc:  # reset, stall: as requests would raise
            raise requests.ConnectionError(exc) from exc
        if not data:
            return
        yield data


_HEAD_BYTES = 120


def _unfinished(resp: requests.Response, events: list[int], state: _StreamState) -> str:
    """Why a stream that ended without [DONE] is not a completion; with no token event,
    what the answer was instead (its content type and first bytes: an HTML page, a JSON
    answer that was not streamed), with URLs and known secrets masked."""
    text = f"stream ended before [DONE] after {len(events)} token events"
    if events:
        return text
    kind = resp.headers.get("Content-Type") or "no Content-Type"
    head = state.head.decode("utf-8", "replace")
    what = "an empty body" if not head else f"starting {_short(head)[:_HEAD_BYTES]!r}"
    if "text/event-stream" not in kind.lower():
        return f"{text}: the answer is not an SSE stream ({kind}, {what})"
    return f"{text}: the answer ({kind}) was {what}"


def _is_timeout(exc: BaseException) -> bool:
    # Mid-stream, requests wraps urllib3's ReadTimeoutError in a ConnectionError.
    return isinstance(exc, requests.Timeout) or any(
        isinstance(arg, urllib3.exceptions.TimeoutError) for arg in exc.args
    )


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_EXCERPT else text[:_ERROR_EXCERPT] + "…"
