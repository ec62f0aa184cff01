"""A tiny OpenAI-compatible streaming server that emits tokens at known times.

It is a test instrument, not a stand-in for vLLM: it answers ``/v1/completions`` and
``/v1/chat/completions`` with vLLM-shaped SSE chunks paced by a :class:`Script`, and records the
``time.perf_counter_ns()`` taken right before each token event is written. Client and server run
on the same machine and share that monotonic clock, so a client's arrival stamps can be compared
with :attr:`RequestRecord.send_ns` directly (the difference is transport + client overhead).

    with SseServer(script=Script(n_tokens=16, gap_s=0.02)) as server:
        run_client(server.base_url)
        record = server.requests[-1]
        record.send_ns   # one stamp per token event

Faults a real server (or a hostile one) can commit are scripted too: a body trickled one byte
at a time (``trickle_s``), one enormous event (``huge_event_bytes``), a connection reset
mid-stream (``reset_after``), an error page with raw terminal escapes (``error_raw``), and,
with ``SseServer(metrics=True)``, a vLLM-shaped ``/metrics`` whose histograms can lie about a
request (``metrics_count_delta``).

Only the standard library is used, so users' own tests can ship with it.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import socket
import struct
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Final, Self

from phaseprobe.testing.sse_tokens import PlannedEvent, delta_of, plan_events, token_ids_of

__all__ = ["RequestRecord", "Script", "SseServer"]

# Sleeping is only precise to ~50-100 µs on Linux, so the last stretch before a deadline is
# spun on the clock instead.
_SPIN_NS: Final = 200_000
_TOKEN_TEXT: Final = "tok"
_STREAM_PATHS: Final = ("/v1/completions", "/v1/chat/completions")
_HUGE_TEXT: Final = "x"
_PIECE_BYTES: Final = 64 * 1024  # a huge event leaves in pieces of this size
# The phase histograms /metrics exports (vLLM's names), observed once per finished stream.
_PHASES: Final = (
    "request_queue_time_seconds",
    "request_prefill_time_seconds",
    "request_decode_time_seconds",
    "request_inference_time_seconds",
    "time_to_first_token_seconds",
    "e2e_request_latency_seconds",
)
# vLLM's error "type" per status (its ErrorResponse); others fall back to the HTTP phrase.
_ERROR_TYPES: Final = {
    400: "BadRequestError",
    401: "UnauthorizedError",
    404: "NotFoundError",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


@dataclass(frozen=True)
class Script:
    """What one streaming request gets.

    ``gap_s`` separates token *events* (an event carries ``tokens_per_event`` tokens, the way vLLM
    merges tokens into one chunk when the client lags); events are paced against absolute
    deadlines ``start + first_delay_s + i * gap_s`` so write costs never accumulate as drift.
    ``cut_after=k`` closes the connection after k token events with neither usage nor [DONE]
    (k >= the number of events sends every token, then cuts). ``status`` other than 200 answers a
    vLLM-style JSON error instead of a stream; ``error_body`` is its message, or with
    ``error_raw`` the whole body, sent byte for byte as ``text/plain`` (JSON would escape the
    control characters a hostile error page carries, e.g. ``\x1b[2J``).

    Faults, all off by default:

    - ``trickle_s``: after the headers, the whole body is sent one byte every ``trickle_s``
      seconds (HTTP chunk framing included), so a per-read timeout never expires;
    - ``huge_event_bytes``: the first token event's text is this many bytes, and the event is
      written in 64 KiB pieces (each its own HTTP chunk when ``chunked``);
    - ``reset_after=k``: after k token events (when the next one is due), the connection is
      closed with a TCP RST (``SO_LINGER`` 1, 0) instead of a FIN;
    - ``usage``: the usage block's counts sent instead of the true ones (any JSON value:
      ``{"prompt_tokens": "x"}``, ``float("nan")`` (written as ``NaN``), ``10**400``, -3 …);
    - ``metrics_count_delta``: how far this request moves every phase histogram's ``_count``
      of ``SseServer(metrics=True)``'s ``/metrics`` (its ``_sum`` moves by that many times its
      phase times): 1 is the truth, 2 claims a second request, 0 never observes it, -1 goes
      backwards (a restarted or lying exporter).
    """

    n_tokens: int = 8
    first_delay_s: float = 0.0
    gap_s: float = 0.0
    chunked: bool = True
    cut_after: int | None = None
    status: int = 200
    error_body: str | None = None
    tokens_per_event: int = 1
    include_usage_if_asked: bool = True
    prompt_tokens: int | None = None  # None: counted from the request (words, or ids)
    error_raw: bool = False
    trickle_s: float | None = None
    huge_event_bytes: int | None = None
    reset_after: int | None = None
    metrics_count_delta: int = 1
    usage: dict[str, Any] | None = None
    # vLLM >= 0.33's per-request metrics object, sent on the final usage chunk as vLLM does
    # (only when the usage chunk is asked for); any JSON value, recorded or hostile
    response_metrics: Any = None
    # A reasoning stream, as vLLM's reasoning parsers send it (phaseprobe.testing.sse_tokens):
    # the first reasoning_tokens tokens under delta.<reasoning_field> ("reasoning": vLLM >=
    # 0.11; "reasoning_content": older), then the answer as content; with end_marker, one
    # hidden </think> token between them (an empty-delta chunk, sent only when the request
    # asks for return_token_ids). usage_reasoning_tokens: what the usage's
    # completion_tokens_details.reasoning_tokens says (None: the field is not sent).
    reasoning_tokens: int = 0
    reasoning_field: str = "reasoning"
    end_marker: bool = False
    usage_reasoning_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.n_tokens < 1:
            raise ValueError(f"Script.n_tokens must be >= 1, got {self.n_tokens}")
        if self.first_delay_s < 0 or self.gap_s < 0:
            raise ValueError(
                f"Script delays must be >= 0, got first_delay_s={self.first_delay_s} "
                f"gap_s={self.gap_s}"
            )
        if self.tokens_per_event < 1:
            raise ValueError(f"Script.tokens_per_event must be >= 1, got {self.tokens_per_event}")
        if self.cut_after is not None and self.cut_after < 0:
            raise ValueError(f"Script.cut_after must be >= 0 or None, got {self.cut_after}")
        if self.status != 200 and not 400 <= self.status <= 599:
            raise ValueError(f"Script.status must be 200 or 4xx/5xx, got {self.status}")
        if self.trickle_s is not None and self.trickle_s <= 0:
            raise ValueError(f"Script.trickle_s must be > 0 or None, got {self.trickle_s}")
        if self.huge_event_bytes is not None and self.huge_event_bytes < 1:
            raise ValueError(
                f"Script.huge_event_bytes must be >= 1 or None, got {self.huge_event_bytes}"
            )
        if self.reset_after is not None and self.reset_after < 0:
            raise ValueError(f"Script.reset_after must be >= 0 or None, got {self.reset_after}")
        if self.cut_after is not None and self.reset_after is not None:
            raise ValueError("Script.cut_after and reset_after exclude each other")
        if not 0 <= self.reasoning_tokens <= self.n_tokens:
            raise ValueError(
                f"Script.reasoning_tokens must be 0 .. n_tokens ({self.n_tokens}), got "
                f"{self.reasoning_tokens}"
            )
        if self.reasoning_field not in ("reasoning", "reasoning_content"):
            raise ValueError(
                "Script.reasoning_field must be 'reasoning' (vLLM >= 0.11) or "
                f"'reasoning_content' (older), got {self.reasoning_field!r}"
            )
        if self.end_marker and not 0 < self.reasoning_tokens < self.n_tokens - 1:
            raise ValueError(
                "Script.end_marker needs reasoning before it and an answer token after it: "
                f"0 < reasoning_tokens < n_tokens - 1, got {self.reasoning_tokens} of "
                f"{self.n_tokens}"
            )
        if self.usage_reasoning_tokens is not None and self.usage_reasoning_tokens < 0:
            raise ValueError(
                f"Script.usage_reasoning_tokens must be >= 0 or None, got "
                f"{self.usage_reasoning_tokens}"
            )

    def events(self) -> list[PlannedEvent]:
        """The stream's events: tokens cut by ``tokens_per_event``, reasoning first."""
        return plan_events(
            self.n_tokens, self.tokens_per_event, self.reasoning_tokens, self.end_marker
        )

    @property
    def n_events(self) -> int:
        """Token events in a full stream (the last one may carry fewer tokens; a hidden
        marker's own event shows no text and is none)."""
        events = self.events()
        return sum(1 for e in events[:-1] if e.visible) + 1


@dataclass
class RequestRecord:
    """What the server saw and did for one request (filled in while the request is served).

    ``headers`` has lower-cased names. ``send_ns`` holds one ``perf_counter_ns`` per token
    event, taken immediately before its bytes were written; ``role_ns`` is the chat role-only
    chunk's (not a token). ``done`` is set once the server has finished with the request.
    ``cut`` says ``cut_after`` closed the stream (a FIN), ``reset`` that ``reset_after`` did (an
    RST); ``tokens_sent`` counts the tokens written.
    """

    method: str
    path: str
    headers: dict[str, str]
    raw_body: bytes
    body: Any
    script: Script | None
    start_ns: int
    role_ns: int | None = None
    send_ns: list[int] = field(default_factory=list)
    end_ns: int | None = None
    cut: bool = False
    reset: bool = False
    tokens_sent: int = 0
    client_disconnected: bool = False
    done: threading.Event = field(default_factory=threading.Event, repr=False)


class _HttpServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64
    owner: SseServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away with a keep-alive connection open is normal, not an error.
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    server: _HttpServer
    protocol_version = "HTTP/1.1"  # keep-alive and chunked bodies, like uvicorn
    server_version = "sse-test"
    disable_nagle_algorithm = True  # TCP_NODELAY: each small event leaves at once

    def version_string(self) -> str:
        return self.server_version  # the default appends a space and the Python version

    def setup(self) -> None:
        super().setup()
        self.server.owner._track(self.connection, add=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.owner._track(self.connection, add=False)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # test output stays clean; the records are the log

    # --- routing -------------------------------------------------------------------------

    def do_GET(self) -> None:
        owner = self.server.owner
        self._record(b"", None, None)
        if self.path == "/health":
            self._send_json(200, None)
        elif self.path == "/version":
            self._send_json(200, {"version": owner.version})
        elif self.path == "/v1/models":
            model = {
                "id": owner.model,
                "object": "model",
                "created": owner.created,
                "owned_by": "sse-test",
                "root": owner.model,
                "parent": None,
                "max_model_len": 2048,
            }
            self._send_json(200, {"object": "list", "data": [model]})
        elif self.path == "/metrics" and owner.metrics:
            self._send(
                200, owner.metrics_text().encode(), "text/plain; version=0.0.4; charset=utf-8"
            )
        else:
            # /metrics included unless metrics=True: no vLLM metrics, so clients must fall
            # back to client-only runs, exactly as against an endpoint that hides them.
            self._send_json(404, {"detail": "Not Found"})

    def do_POST(self) -> None:
        owner = self.server.owner
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        if self.path not in _STREAM_PATHS:
            self._record(raw, body, None)
            self._send_json(404, {"detail": "Not Found"})
            return
        script = owner._next_script(body)
        rec = self._record(raw, body, script)
        try:
            if owner.api_key is not None and (
                self.headers.get("Authorization") != f"Bearer {owner.api_key}"
            ):
                self._send_json(401, {"error": "Unauthorized"})  # vLLM's exact answer
            elif not isinstance(body, dict):
                self._send_error(400, "request body is not a JSON object")
            elif body.get("stream") is not True:
                self._send_error(400, "the SSE test server only answers stream=true")
            elif script.status != 200 and script.error_raw:
                # An error page as some proxies send it: the bytes as given, nothing escaped.
                self._send(
                    script.status, (script.error_body or "").encode(), "text/plain; charset=utf-8"
                )
            elif script.status != 200:
                self._send_error(script.status, script.error_body)
            else:
                stream = _Stream(self, rec, script, body)
                owner._stream_started()
                try:
                    stream.run()
                finally:
                    owner._observe(rec, script, stream.prompt_tokens)
        finally:
            rec.end_ns = time.perf_counter_ns()
            rec.done.set()

    # --- helpers -------------------------------------------------------------------------

    def _record(self, raw: bytes, body: Any, script: Script | None) -> RequestRecord:
        rec = RequestRecord(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            raw_body=raw,
            body=body,
            script=script,
            start_ns=time.perf_counter_ns(),
        )
        self.server.owner._add_record(rec)
        if script is None:
            rec.done.set()  # nothing streamed; the record is complete already
        return rec

    def _send_json(self, status: int, payload: Any) -> None:
        if payload is None:
            self._send(status, b"", None)
        else:
            self._send(status, json.dumps(payload).encode(), "application/json")

    def _send(self, status: int, data: bytes, content_type: str | None) -> None:
        self.send_response(status)
        if content_type is not None:
            self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, status: int, message: str | None) -> None:
        try:
            phrase = HTTPStatus(status).phrase
        except ValueError:
            phrase = ""  # a status http.HTTPStatus does not name (e.g. 599)
        self._send_json(
            status,
            {
                "object": "error",
                "message": message if message is not None else f"scripted error {status} {phrase}",
                "type": _ERROR_TYPES.get(status, phrase.replace(" ", "") or "Error"),
                "param": None,
                "code": status,
            },
        )


class _Stop(Exception):
    """The server is closing while a stream is being trickled."""


class _Stream:
    """Writes one scripted SSE response; split from the handler to keep routing readable."""

    def __init__(
        self, handler: _Handler, rec: RequestRecord, script: Script, body: dict[str, Any]
    ) -> None:
        self.h = handler
        self.rec = rec
        self.script = script
        self.chat = handler.path == "/v1/chat/completions"
        options = body.get("stream_options")
        self.usage = bool(
            script.include_usage_if_asked
            and isinstance(options, dict)
            and options.get("include_usage")
        )
        owner = handler.server.owner
        model = body.get("model")
        self.base: dict[str, Any] = {
            "id": ("chatcmpl-" if self.chat else "cmpl-") + uuid.uuid4().hex,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": int(time.time()),
            "model": model if isinstance(model, str) else owner.model,
        }
        self.prompt_tokens = (
            script.prompt_tokens
            if script.prompt_tokens is not None
            else _count_prompt_tokens(body, self.chat)
        )
        self.closing = owner._closing
        # vLLM's per-chunk detail, when the request asks for it
        self.token_ids = body.get("return_token_ids") is True
        self.running_usage = (
            self.usage
            and isinstance(options, dict)
            and options.get("continuous_usage_stats") is True
        )
        self.sent_tokens = 0  # the running usage's count

    def run(self) -> None:
        h, script = self.h, self.script
        if not script.chunked:
            # HTTP/1.0-style: no length, the body ends when the connection closes. Set before
            # send_response, which writes the status line with this version.
            h.protocol_version = "HTTP/1.0"
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream; charset=utf-8")
        if script.chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()
        try:
            self._body()
        except (BrokenPipeError, ConnectionResetError):
            self.rec.client_disconnected = True
            h.close_connection = True
        except _Stop:
            h.close_connection = True  # close() was called: drop the stream

    def _body(self) -> None:
        script, rec = self.script, self.rec
        if self.chat:
            # vLLM sends this at once, before any token: it must not count as the first token.
            role = self._event(self._chat_choice({"role": "assistant", "content": ""}, None))
            rec.role_ns = time.perf_counter_ns()
            self._write(role)
        start = rec.start_ns + int(script.first_delay_s * 1e9)
        gap = int(script.gap_s * 1e9)
        planned = script.events()
        n_events = len(planned)
        for i, event in enumerate(planned):
            if script.cut_after is not None and i >= script.cut_after:
                self._cut()
                return
            if script.reset_after is not None and i >= script.reset_after:
                # Due time first: the events before the reset have reached the client.
                if self._wait_until(start + i * gap):
                    self._reset()
                return
            k = event.n_tokens
            finish = "length" if i == n_events - 1 else None
            huge = script.huge_event_bytes if i == 0 else None
            shown = event.visible or finish is not None
            self.sent_tokens += k
            # Built before the wait.
            frame = self._token_frame(
                event if huge is None else PlannedEvent(0, 0, 0),
                finish,
                raw=huge is not None,
                huge=huge,
            )
            if not self._wait_until(start + i * gap):
                self.h.close_connection = True  # close() was called: drop the stream
                return
            rec.tokens_sent += k
            if not shown:
                # A hidden marker: vLLM sends its chunk only to list its token ids.
                if self.token_ids and self.chat:
                    self._write(frame)
                continue
            rec.send_ns.append(time.perf_counter_ns())
            if huge is not None:
                for at in range(0, len(frame), _PIECE_BYTES):
                    self._write(self._frame(frame[at : at + _PIECE_BYTES]))
            else:
                self._write(frame)
        if script.cut_after is not None:
            self._cut()
            return
        if script.reset_after is not None:
            self._reset()
            return
        if self.usage:
            usage = self._usage(script.n_tokens)
            if script.usage_reasoning_tokens is not None:
                usage["completion_tokens_details"] = {
                    "reasoning_tokens": script.usage_reasoning_tokens
                }
            if script.usage is not None:
                usage = {**usage, **script.usage}
            final = {**self.base, "choices": [], "usage": usage}
            if script.response_metrics is not None:
                final["metrics"] = script.response_metrics
            self._write(self._event(final))
        self._write(self._frame(b"data: [DONE]\n\n"))
        if script.chunked:
            self._write(b"0\r\n\r\n")  # last-chunk: the body ended cleanly

    def _token_frame(
        self, event: PlannedEvent, finish: str | None, raw: bool = False, huge: int | None = None
    ) -> bytes:
        """One token event, framed; ``raw``: the SSE bytes without the HTTP chunk framing;
        ``huge``: its text is that many bytes instead of the event's tokens."""
        ids = token_ids_of(event) if self.token_ids else None
        if self.chat:
            delta = (
                {"content": _HUGE_TEXT * huge}
                if huge is not None
                else delta_of(event, self.script.reasoning_field)
            )
            payload = self._chat_choice(delta, finish, ids)
        else:
            # the completions API has no reasoning parser: every token is text
            text = _HUGE_TEXT * huge if huge is not None else _TOKEN_TEXT * event.n_tokens
            choice: dict[str, Any] = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
            if ids is not None:
                choice["token_ids"] = ids
            payload = {**self.base, "choices": [choice], "usage": None}
        if self.running_usage:
            payload["usage"] = self._usage(self.sent_tokens)
        return self._sse(payload) if raw else self._event(payload)

    def _usage(self, completion_tokens: int) -> dict[str, Any]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion_tokens,
            "completion_tokens": completion_tokens,
        }

    def _chat_choice(
        self, delta: dict[str, str], finish: str | None, token_ids: list[int] | None = None
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "delta": delta,
            "logprobs": None,
            "finish_reason": finish,
        }
        if finish is not None:
            choice["stop_reason"] = None
        if token_ids is not None:
            choice["token_ids"] = token_ids
        return {**self.base, "choices": [choice]}

    def _event(self, payload: dict[str, Any]) -> bytes:
        return self._frame(self._sse(payload))

    @staticmethod
    def _sse(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    def _frame(self, event: bytes) -> bytes:
        # One HTTP chunk per SSE event, as uvicorn writes vLLM's stream.
        if self.script.chunked:
            return b"%x\r\n%b\r\n" % (len(event), event)
        return event

    def _write(self, data: bytes) -> None:
        # wfile is unbuffered (wbufsize 0): one write is one sendall, nothing waits in Python.
        trickle = self.script.trickle_s
        if trickle is None:
            self.h.wfile.write(data)
            return
        for at in range(len(data)):
            self.h.wfile.write(data[at : at + 1])
            if self.closing.wait(trickle):
                raise _Stop

    def _reset(self) -> None:
        """Close with an RST: SO_LINGER on with a zero timeout, then close the socket (its
        reading file too, which holds a reference that would delay the close)."""
        self.rec.reset = True
        h = self.h
        h.close_connection = True
        with contextlib.suppress(OSError):  # the client may already be gone
            h.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            h.rfile.close()
            h.connection.close()

    def _cut(self) -> None:
        self.rec.cut = True
        self.h.close_connection = True
        with contextlib.suppress(OSError):  # the client may already be gone
            self.h.connection.shutdown(socket.SHUT_RDWR)

    def _wait_until(self, deadline_ns: int) -> bool:
        """Sleep, then spin, until ``deadline_ns``; False if the server is closing."""
        remaining = deadline_ns - time.perf_counter_ns()
        # Event.wait rather than sleep, so close() interrupts a long scripted delay.
        if remaining > _SPIN_NS and self.closing.wait((remaining - _SPIN_NS) / 1e9):
            return False
        while time.perf_counter_ns() < deadline_ns:
            pass
        return True


def _count_prompt_tokens(body: dict[str, Any], chat: bool) -> int:
    """A stand-in token count: words of text, or the length of a token-id list."""
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list):
            return 0
        return sum(len(str(m.get("content", "")).split()) for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return len(prompt.split())
    if isinstance(prompt, list):
        return (
            len(prompt)
            if all(isinstance(t, int) for t in prompt)
            else sum(len(p.split()) if isinstance(p, str) else len(p) for p in prompt)
        )
    return 0


_SERVER_SEQ = itertools.count()


class SseServer:
    """The streaming test server, on 127.0.0.1 and a free port, served by a daemon thread.

    Each streaming request takes the next script from the queue (:meth:`enqueue`), or else the
    current :attr:`script`. With ``api_key`` set, requests without ``Authorization: Bearer
    <api_key>`` get vLLM's 401 answer. Every request is recorded in :attr:`requests`.

    With ``metrics=True`` it also answers ``/metrics`` like vLLM: the phase histograms (one
    ``+Inf`` bucket, ``_sum``, ``_count``) observe every finished stream once, with its phase
    times taken from the send stamps (no queue; prefill up to the first token event; decode
    from the first to the last), the token counters move by its usage, and
    ``num_requests_running`` counts the streams in progress. A script's
    ``metrics_count_delta`` makes the histograms lie about its request.
    """

    def __init__(
        self,
        script: Script | None = None,
        *,
        model: str = "sse-test-model",
        api_key: str | None = None,
        metrics: bool = False,
        version: str = "sse-test",
    ) -> None:
        self.model = model
        self.version = version  # what /version answers (a vLLM version picks code paths)
        self.api_key = api_key
        self.metrics = metrics
        self._running = 0
        self._counts = 0.0
        self._sums = dict.fromkeys(_PHASES, 0.0)
        self._tokens = {"prompt_tokens": 0.0, "generation_tokens": 0.0, "request_success": 0.0}
        self.created = int(time.time())
        # what tells this process from another behind a router (vLLM's prometheus_client
        # exports it too): distinct per server even when two start in the same second
        self.process_start_s = time.time() + next(_SERVER_SEQ) * 1e-3
        # The script used when the queue is empty; assign to change it between requests.
        self.script = script if script is not None else Script()
        self._queue: collections.deque[Script] = collections.deque()
        # Scripts chosen by the request's max_tokens, before the queue: for tests whose two
        # kinds of request may reach the server in either order on a busy machine
        self.by_max_tokens: dict[int, Script] = {}
        self._records: list[RequestRecord] = []
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._httpd = _HttpServer(("127.0.0.1", 0), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.02},
            name=f"sse-server-{self.port}",
            daemon=True,
        )
        self._thread.start()

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def enqueue(self, *scripts: Script) -> None:
        """Queue scripts consumed one per streaming request, before :attr:`script` applies."""
        with self._lock:
            self._queue.extend(scripts)

    @property
    def requests(self) -> list[RequestRecord]:
        """Records of every request so far, oldest first (a snapshot of the list)."""
        with self._lock:
            return list(self._records)

    def clear(self) -> None:
        """Forget the records (e.g. between benchmark rounds)."""
        with self._lock:
            self._records.clear()

    def close(self) -> None:
        """Stop serving and drop open connections (idempotent)."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._httpd.shutdown()
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)  # wakes handlers blocked on keep-alive reads
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def metrics_text(self) -> str:
        """The ``/metrics`` exposition as it stands (vLLM's names, ``vllm:`` prefix)."""
        # the exposition format's label escaping (\\, \", \n), as vLLM's client library does
        escaped = self.model.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        lab = f'engine="0",model_name="{escaped}"'
        lines: list[str] = []
        with self._lock:
            counts, sums = self._counts, dict(self._sums)
            tokens, running = dict(self._tokens), self._running
        for base in _PHASES:
            name = "vllm:" + base
            lines += [
                f"# HELP {name} {base}",
                f"# TYPE {name} histogram",
                f'{name}_bucket{{{lab},le="+Inf"}} {counts!r}',
                f"{name}_sum{{{lab}}} {sums[base]!r}",
                f"{name}_count{{{lab}}} {counts!r}",
            ]
        for base, value in tokens.items():
            name = "vllm:" + base
            lines += [
                f"# HELP {name} {base}",
                f"# TYPE {name} counter",
                f"{name}_total{{{lab}}} {value!r}",
            ]
        for base, value in (
            ("num_requests_running", float(running)),
            ("num_requests_waiting", 0.0),
            ("kv_cache_usage_perc", 0.0),
        ):
            name = "vllm:" + base
            lines += [f"# HELP {name} {base}", f"# TYPE {name} gauge", f"{name}{{{lab}}} {value!r}"]
        lines += [
            "# HELP process_start_time_seconds Start time of the process since unix "
            "epoch in seconds.",
            "# TYPE process_start_time_seconds gauge",
            f"process_start_time_seconds {self.process_start_s!r}",
        ]
        info = "vllm:cache_config_info"
        lines += [
            f"# HELP {info} cache config",
            f"# TYPE {info} gauge",
            f'{info}{{block_size="16",engine="0",num_gpu_blocks="1024"}} 1.0',
        ]
        return "\n".join(lines) + "\n"

    def _stream_started(self) -> None:
        with self._lock:
            self._running += 1

    def _observe(self, rec: RequestRecord, script: Script, prompt_tokens: int) -> None:
        """The finished stream, as vLLM's histograms observe it (or as the script lies)."""
        end = time.perf_counter_ns()
        first = rec.send_ns[0] if rec.send_ns else end
        last = rec.send_ns[-1] if rec.send_ns else end
        prefill, decode = (first - rec.start_ns) / 1e9, (last - first) / 1e9
        times = {
            "request_queue_time_seconds": 0.0,
            "request_prefill_time_seconds": prefill,
            "request_decode_time_seconds": decode,
            "request_inference_time_seconds": prefill + decode,
            "time_to_first_token_seconds": prefill,
            "e2e_request_latency_seconds": (end - rec.start_ns) / 1e9,
        }
        delta = script.metrics_count_delta
        with self._lock:
            self._running -= 1
            self._counts += delta
            for base, value in times.items():
                self._sums[base] += delta * value
            self._tokens["prompt_tokens"] += prompt_tokens
            self._tokens["generation_tokens"] += rec.tokens_sent
            self._tokens["request_success"] += 1

    def _next_script(self, body: Any) -> Script:
        max_tokens = body.get("max_tokens") if isinstance(body, dict) else None
        with self._lock:
            if max_tokens in self.by_max_tokens:
                return self.by_max_tokens[max_tokens]
            return self._queue.popleft() if self._queue else self.script

    def _add_record(self, rec: RequestRecord) -> None:
        with self._lock:
            self._records.append(rec)

    def _track(self, conn: socket.socket, *, add: bool) -> None:
        with self._lock:
            if add:
                self._conns.add(conn)
            else:
                self._conns.discard(conn)
