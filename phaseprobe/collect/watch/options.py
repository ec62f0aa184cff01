"""What ``phaseprobe watch`` is asked to do, as plain values: the command parses its flags into
:class:`WatchOptions`, and :func:`~phaseprobe.collect.watch.session.open_watch` wires them.

Building the options checks them (a :class:`~phaseprobe.errors.ConfigError` naming the flag,
before any receiver, counter or server starts), reads the bearer token from the variable
``--token-env`` names, and registers every secret they carry (that token, a password in
``--spans-from``, ``--forward``, ``--metrics`` or a ``--replica`` URL) with
:mod:`phaseprobe.redact`, so none of them comes back in the view, the JSON or an error.
The command's ``--help`` imports it for its defaults: it starts nothing and loads no analysis;
it reads the receiver module only for its size default and its address parser.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from phaseprobe.collect.spans.receiver import DEFAULT_MAX_BYTES, parse_listen
from phaseprobe.errors import ConfigError
from phaseprobe.redact import register_secret, register_url_secrets

__all__ = [
    "WatchOptions",
    "DEFAULT_HTTP",
    "DEFAULT_GRPC",
    "DEFAULT_WINDOW_S",
    "DEFAULT_REFRESH_S",
    "DEFAULT_RATE_PER_S",
    "DEFAULT_MAX_BYTES",
    "MAX_MAX_BYTES",
    "MAX_DURATION_S",
    "MIN_RATE_PER_S",
    "MAX_RATE_PER_S",
    "RECEIVER_ONLY",
]

DEFAULT_HTTP = "127.0.0.1:4318"  # OTLP/HTTP's usual port
DEFAULT_GRPC = "127.0.0.1:4317"  # OTLP/gRPC's, where vLLM exports by default
DEFAULT_WINDOW_S = 60.0
DEFAULT_REFRESH_S = 2.0
DEFAULT_RATE_PER_S = 2.0
# The largest --max-bytes: gRPC's grpc.max_receive_message_length is a C int (3 GiB was an
# OverflowError when the receiver started) and zlib's max_length a C ssize_t (int64's max was
# one when a gzip request arrived). 2 GiB - 1 is past any OTLP batch an exporter sends.
MAX_MAX_BYTES = 2**31 - 1
# A watch's --duration: a year (time.sleep overflows past ~9.2e9 s; omit it to watch for ever)
MAX_DURATION_S = 366 * 24 * 3600.0
# --demo's arrival rate: one request in ~17 min at least (a gap past ~9.2e9 s overflowed
# Event.wait in the load's thread), a thousand a second at most (the CPU vLLM serves ~10)
MIN_RATE_PER_S = 0.001
MAX_RATE_PER_S = 1000.0

# Receiving options that mean nothing when the spans are read from a fleet's store: the
# field, and the flag that sets it (named in the error).
RECEIVER_ONLY = {
    "demo": "--demo",
    "forward": "--forward",
    "metrics": "--metrics",
    "replicas": "--replica",
    "token_env": "--token-env",
    "retain_s": "--retain",
    "retain_spans": "--retain-spans",
}


@dataclass(frozen=True)
class WatchOptions:
    """A watch's flags, checked. Durations in seconds; listen addresses as ``HOST:PORT`` or
    ``off``. ``token`` is read from ``token_env`` when the options are built (never shown in
    a repr). Raises ConfigError for a combination that cannot work, naming the flags."""

    store_path: str
    http: str = DEFAULT_HTTP
    grpc: str = DEFAULT_GRPC
    duration_s: float | None = None  # None: until Ctrl-C
    refresh_s: float = DEFAULT_REFRESH_S
    window_s: float = DEFAULT_WINDOW_S  # the live view's percentiles cover this much
    demo: bool = False  # the local CPU vLLM exporting here, under an open-loop load
    rate_per_s: float = DEFAULT_RATE_PER_S  # --demo's mean arrival rate
    forward: str | None = None  # an OTLP/HTTP collector every batch is passed on to
    metrics: str | None = None  # one server's base URL: its finished-request counter
    replicas: tuple[str, ...] = ()  # --replica [NAME=]URL values, as given
    token_env: str | None = None  # the variable holding the exporter's bearer token
    max_bytes: int = DEFAULT_MAX_BYTES
    retain_s: float | None = None  # prune spans older than this
    retain_spans: int | None = None  # keep only the newest N spans
    spans_from: str | None = None  # read mode: a fleet's span store, no receiver
    # the stalled-engine detector on --metrics / each --replica (and the evidence's pid, log)
    stall_after_s: float = 60.0
    stall_pid: int | None = None
    server_log: str | None = None
    token: str | None = field(init=False, default=None, repr=False)
    # the listen addresses parsed (None: off)
    http_addr: tuple[str, int] | None = field(init=False, default=None)
    grpc_addr: tuple[str, int] | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self._register_url_secrets()
        if self.spans_from is not None:
            given = [flag for key, flag in RECEIVER_ONLY.items() if getattr(self, key)]
            if given:
                raise ConfigError(
                    f"--spans-from reads spans where the fleet's collector keeps them "
                    f"(no receiver here): {', '.join(given)} belong(s) to the receiving "
                    "watch (retention: the store's own TTL, e.g. ClickHouse's ttl)"
                )
            return
        if not 1 <= self.max_bytes <= MAX_MAX_BYTES:  # a C int for gRPC (see MAX_MAX_BYTES)
            raise ConfigError(
                f"--max-bytes {self.max_bytes}: must be between 1 and {MAX_MAX_BYTES:,} "
                "(2 GiB - 1: gRPC takes a C int)"
            )
        object.__setattr__(self, "http_addr", _listen(self.http, "--http"))
        object.__setattr__(self, "grpc_addr", _listen(self.grpc, "--grpc"))
        if self.token_env:
            token = os.environ.get(self.token_env)
            if not token:
                raise ConfigError(
                    f"--token-env {self.token_env}: that environment variable is not set (or empty)"
                )
            register_secret(token)  # masked wherever it comes back (an error echoing it)
            object.__setattr__(self, "token", token)
        if self.replicas and self.demo:
            raise ConfigError(
                "--replica and --demo: the demo is one local server (its counter is "
                "read already); give --replica for a fleet of your own"
            )
        if self.replicas and self.metrics:
            raise ConfigError(
                "--metrics reads one server's counter; for a fleet give each replica "
                "as --replica NAME=URL instead (its counter against its own spans)"
            )
        if self.demo and self.grpc_addr is None:
            raise ConfigError("--demo exports over gRPC: do not turn --grpc off")

    def _register_url_secrets(self) -> None:
        """A password typed into any URL flag is masked from the first output on."""
        urls = [self.spans_from, self.forward, self.metrics]
        # --replica NAME=URL: the URL is what follows the first '=' before any '://'
        urls += [v.partition("=")[2] if "=" in v.split("://")[0] else v for v in self.replicas]
        for url in urls:
            if url:
                register_url_secrets(url)


def _listen(text: str, flag: str) -> tuple[str, int] | None:
    """``HOST:PORT`` parsed (ConfigError naming ``flag`` when it is not one); None for ``off``."""
    return None if text.strip().lower() == "off" else parse_listen(text, flag)
