"""One URL type for the servers phaseprobe sends to: parsed and normalised once, shown redacted
once, joined by path.

A base URL is something paths are appended to (``/v1/models``, ``/metrics``, ``/api/v1/query``),
so one set of rules holds for every server: the scheme is http or https (none typed: http, as
vLLM's own log prints ``host:port``), there is a host, the port is a number, no space or control
character is in it, and there is no ``?query`` or ``#fragment`` (it would end up before the
appended path, and a query token would be echoed by every error). A URL that breaks a rule is
one :class:`UrlError` naming the URL redacted and saying what to type. The password and
secret-named query values are registered with the process-wide mask (:mod:`phaseprobe.redact`)
when the URL is read, so a server echoing them back is masked too.

``str()`` of an :class:`EndpointUrl` is the normalised URL (credentials included: it is what is
sent); :attr:`EndpointUrl.redacted` is what is shown, logged and stored.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, urlencode, urlsplit, urlunsplit

from phaseprobe.errors import ConfigError
from phaseprobe.redact import REDACTED, redact_url, register_url_secrets

__all__ = ["EndpointUrl", "UrlError", "SCHEMES", "EXAMPLE", "host_of", "host_port_of"]

SCHEMES = ("http", "https")
EXAMPLE = "http://127.0.0.1:8000"  # what a refusal suggests typing (vLLM's port)
_QUERY_HINT = "pass a credential through the environment"


class UrlError(ConfigError):
    """A URL phaseprobe cannot send to; the message names it redacted (``shown``)."""

    def __init__(self, message: str, shown: str) -> None:
        super().__init__(message)
        self.shown = shown


@dataclass(frozen=True)
class EndpointUrl:
    """A normalised base URL: ``url`` is sent, ``redacted`` is shown. Build one with
    :meth:`parse`; :meth:`join` appends a path."""

    url: str = field(repr=False)  # a repr (a traceback's locals, a log) shows no password
    redacted: str

    def __str__(self) -> str:
        return self.url

    @classmethod
    def parse(
        cls,
        text: str,
        *,
        what: str = "endpoint",
        query_hint: str = _QUERY_HINT,
        drop_suffix: str | None = None,
        example: str = EXAMPLE,
    ) -> EndpointUrl:
        """``text`` as a base URL: stripped, the scheme lowercased (http when none is typed),
        no trailing ``/`` (nor ``drop_suffix``, e.g. ``/v1``, the OpenAI client's base URL
        ends in it). ``what`` names the URL in the refusal (``endpoint``, ``Prometheus
        URL``), ``query_hint`` says how to pass the credential a query would carry, ``example``
        is what a refusal suggests typing (the server's usual port). Raises
        UrlError (a ConfigError) when a rule of the module's docstring is broken."""
        text = text.strip()
        register_url_secrets(text)  # a password echoed back by a server is masked too
        shown = redact_url(text)  # refusals never echo a credential typed into the URL
        if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in text):
            # urllib splits "http://my host" without a word, and requests sends it as typed
            raise UrlError(
                f"{what} {shown!r}: not a URL (it holds a space or a control character); "
                f"type it as http://HOST:PORT, e.g. {example}",
                shown,
            )
        scheme, sep, rest = text.partition("://")
        if not sep:
            scheme, rest = "http", text
        if scheme.lower() not in SCHEMES:
            raise UrlError(
                f"{what} {shown!r}: the scheme must be http:// or https://, e.g. {example}",
                shown,
            )
        if "?" in rest or "#" in rest:
            bare = _values_hidden(text)
            raise UrlError(
                f"{what} {bare!r}: a base URL takes no ?query or #fragment; {query_hint}", bare
            )
        rest = rest.rstrip("/")
        if drop_suffix and rest.endswith(drop_suffix):
            rest = rest[: -len(drop_suffix)].rstrip("/")
        if not rest or rest.startswith("/"):
            raise UrlError(
                f"{what} {shown!r} names no host: type it as http://HOST:PORT, e.g. {example}",
                shown,
            )
        url = f"{scheme.lower()}://{rest}"
        redacted = redact_url(url)
        try:
            # parsed once here: a malformed IPv6 host ("[oops]") or port would raise urllib's
            # ValueError wherever the URL was split later (a replica's name: a traceback). The
            # redacted form is parsed: a raw password holding '/' ends urlsplit's authority
            # early (its start would be read as a port, and quoted in the message).
            parts = urlsplit(redacted)
            parts.port  # noqa: B018 - a port that is not a number (or past 65535) raises here
        except ValueError as exc:
            raise UrlError(
                f"{what} {shown!r}: not a URL ({exc}); type it as http://HOST:PORT, "
                f"e.g. {example} (an IPv6 address in brackets: http://[::1]:PORT)",
                shown,
            ) from None
        if not parts.hostname:
            raise UrlError(f"{what} {shown!r} names no host: type it as http://HOST:PORT", shown)
        return cls(url, redacted)

    @classmethod
    def known(cls, url: str) -> EndpointUrl:
        """A URL already read by :meth:`parse` and handed on as a ``str`` (a stored endpoint,
        what ``normalize_base_url`` returned): kept as it is, less a trailing ``/``, and
        redacted once. No rule is checked again: the callers still passing a ``str`` meet the
        type here."""
        url = url.rstrip("/")
        return cls(url, redact_url(url))

    def join(self, path: str) -> EndpointUrl:
        """This URL with ``path`` appended (``/v1/models``; one ``/`` between them whichever
        side has it), its redacted form beside it."""
        tail = "/" + path.lstrip("/") if path else ""
        return EndpointUrl(self.url + tail, redact_url(self.redacted + tail))

    @functools.cached_property
    def _parts(self) -> SplitResult:
        # parse() checked it; a known() URL urllib cannot split raises ValueError here, as
        # splitting it anywhere else would
        return urlsplit(self.redacted)

    @property
    def scheme(self) -> str:
        """``http`` or ``https``."""
        return self._parts.scheme

    @property
    def host(self) -> str:
        """The host name or address (an IPv6 address without its brackets)."""
        return self._parts.hostname or ""

    @property
    def port(self) -> int:
        """The port, the scheme's own (80, 443) when none is written."""
        return self._parts.port or (443 if self.scheme == "https" else 80)

    @property
    def has_userinfo(self) -> bool:
        """True when ``user[:password]@`` is written in the URL as urllib splits it (a raw
        '/' in the password hides it: that URL fails at its first request instead)."""
        try:
            parts = urlsplit(self.url)
        except ValueError:
            return False
        return parts.username is not None or parts.password is not None

    @property
    def sends_basic_auth(self) -> bool:
        """True when requests will send Basic auth for this URL, in place of any
        ``Authorization`` header given: a password is written (``user@`` alone sends none)."""
        try:
            return urlsplit(self.url).password is not None
        except ValueError:
            return False


def _values_hidden(text: str) -> str:
    """``text`` redacted, every query and fragment value shown as ``<redacted>`` whatever its
    name (a token under a harmless name is a token all the same); the names stay, to say
    which part to move out of the URL."""
    try:
        parts = urlsplit(text)
        hidden = urlunsplit(
            (parts.scheme, parts.netloc, parts.path, _hide(parts.query), _hide(parts.fragment))
        )
    except ValueError:
        hidden = text.split("?", 1)[0].split("#", 1)[0]
    return redact_url(hidden)


def _hide(pairs: str) -> str:
    """A query or fragment with every value replaced by REDACTED (one REDACTED when it is no
    list of name=value pairs)."""
    if "=" not in pairs:
        return REDACTED if pairs else ""
    return urlencode(
        [(k, REDACTED) for k, _ in parse_qsl(pairs, keep_blank_values=True)], safe="<>"
    )


def host_of(endpoint: str) -> str | None:
    """The host of a stored endpoint (a URL, or ``host:port`` as vLLM prints it), None when
    it names none or is no URL (``[oops]`` as a host). Lenient: what was stored is read,
    not judged."""
    try:
        return urlsplit(endpoint if "//" in endpoint else "//" + endpoint).hostname
    except ValueError:
        return None


def host_port_of(url: str) -> str | None:
    """``host:port`` of ``url`` as written (credentials left out), for a name or a table cell;
    None when urllib cannot split it (``http://[::1:8000``) or it names no authority (the
    caller shows what it has: the URL whole, a default name)."""
    try:
        netloc = urlsplit(url).netloc
    except ValueError:
        return None
    return netloc.rpartition("@")[2] or None
