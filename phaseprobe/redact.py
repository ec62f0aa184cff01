"""Credentials out of URLs, wherever a URL is stored, logged or shown.

Operators put secrets in URLs: ``http://user:password@host:8000``, ``?api_key=…``,
``?token=…``, presigned ``?X-Amz-Signature=…``. phaseprobe keeps the URL usable (scheme, host,
port, path, the other query parameters) and replaces the secret parts: userinfo is dropped,
secret-named query values become ``<redacted>``. A leaf module (standard library only), so the
store, the sources and the console can all use it without importing one another.

Secrets that are not in a URL come back in other ways: a server echoing "bad key Bearer …" in
its error body, a library quoting a header in its exception, a launched server logging its
environment. phaseprobe knows each value it holds as a secret, so they are kept in one
process-wide registry (:func:`register_secret`, called where a secret is read: the API key,
the Prometheus and Grafana tokens, a URL's password, a launch env value whose name looks
secret) and :func:`redact_urls_in`, the mask every boundary already applies (the console, the
store's error and notes text, log tails), replaces each registered value by ``***``.
"""

from __future__ import annotations

import base64
import json
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit, urlunsplit

__all__ = [
    "redact_url",
    "redact_urls_in",
    "REDACTED",
    "MASK",
    "PREFIX_CHARS",
    "is_secret_name",
    "register_secret",
    "register_url_secrets",
    "register_user_password",
    "register_env_secrets",
    "is_secret_env_name",
    "install_log_mask",
    "SecretMaskFilter",
    "mask_secrets",
    "forget_secrets",
    "header_secret_problem",
]

REDACTED = "<redacted>"
MASK = "***"  # what a known secret value becomes wherever it comes back
# A value shorter than this is not masked: "1234" or "a" would blot out ordinary text (and is
# no credential anyone guards)
MIN_SECRET_CHARS = 6
# A secret cut short (a server's body clipped to 200 characters, a line cut by the console)
# is still masked from this many characters on: "…Basic c3dlZXBlcjpwYS9z" gives most of a
# password away. Masking a stray word that happens to start like a secret is the safe mistake.
PREFIX_CHARS = 8
_registry_lock = threading.Lock()
_secrets: set[str] = set()


@dataclass(frozen=True)
class _Masker:
    """The registry compiled: ``heads`` finds where a secret (or its first PREFIX_CHARS
    characters) starts; ``by_head`` holds the secrets starting so, to extend the match over as
    much of one as the text holds."""

    heads: re.Pattern[str]
    by_head: dict[str, tuple[str, ...]]

    def mask(self, text: str) -> str:
        """``text`` with each registered secret, whole or cut short, replaced by MASK."""
        parts: list[str] = []
        pos = 0
        while (found := self.heads.search(text, pos)) is not None:
            start = found.start()
            candidates = (
                secret
                for n in range(MIN_SECRET_CHARS, PREFIX_CHARS + 1)
                for secret in self.by_head.get(text[start : start + n], ())
            )
            end = start + max(_common_prefix(text, start, s) for s in candidates)
            parts += (text[pos:start], MASK)
            pos = end
        return "".join(parts) + text[pos:] if parts else text


def _common_prefix(text: str, start: int, secret: str) -> int:
    """How many characters of ``secret`` ``text`` holds from ``start`` on."""
    n = 0
    for a, b in zip(secret, text[start : start + len(secret)], strict=False):
        if a != b:
            break
        n += 1
    return n


_masker: _Masker | None = None


def register_secret(value: str | None) -> None:
    """Remember ``value`` as a secret: from now on every text that passes a boundary has it
    masked, also when cut short after PREFIX_CHARS characters. Its stripped form counts too
    (a key read with a trailing newline), and so do the forms JSON writes of it (a quote,
    a backslash or a non-ASCII character is escaped in ``--json`` output and the store's JSON
    columns, and the escaped text would not match). Returns None; raises nothing."""
    global _masker
    if not value:
        return
    forms: tuple[str, ...] = (value, value.strip())
    forms += tuple(json.dumps(f, ensure_ascii=a)[1:-1] for f in forms for a in (True, False))
    found = {v for v in forms if len(v) >= MIN_SECRET_CHARS}
    if not found - _secrets:
        return
    with _registry_lock:
        _secrets.update(found)
        by_head: dict[str, list[str]] = {}
        for secret in _secrets:
            by_head.setdefault(secret[:PREFIX_CHARS], []).append(secret)
        # longest first: the head of a longer secret wins over a short secret it starts with
        heads = sorted(by_head, key=len, reverse=True)
        _masker = _Masker(
            re.compile("|".join(re.escape(h) for h in heads)),
            {h: tuple(v) for h, v in by_head.items()},
        )


def register_url_secrets(url: str) -> None:
    """The password (and any secret-named query value) of ``url`` registered, with the
    Basic credential an HTTP library makes of it (a server echoing ``Basic dXNl…`` gives
    the password away as surely as in clear)."""
    slashed = _SLASHED_USERINFO.fullmatch(url.strip())
    if slashed is not None:
        register_user_password(slashed["user"], slashed["password"])
        return
    try:
        parts = urlsplit(url.strip())
        register_user_password(parts.username, parts.password)
    except ValueError:
        return
    for k, v in parse_qsl(parts.query, keep_blank_values=True):
        if is_secret_name(k):
            register_secret(v)


def register_user_password(user: str | None, password: str | None) -> None:
    """Register ``password`` (as given and percent-decoded) and the ``Basic`` credentials an
    HTTP library builds from ``user:password``; returns None, raises nothing. No password:
    nothing is registered."""
    if not password:
        return
    register_secret(password)
    register_secret(unquote(password))  # a library decodes pa%2Fss before it quotes it back
    for pair in {f"{user or ''}:{password}", f"{unquote(user or '')}:{unquote(password)}"}:
        try:
            register_secret(base64.b64encode(pair.encode("latin-1")).decode())
        except UnicodeEncodeError:  # requests sends such a pair as UTF-8
            register_secret(base64.b64encode(pair.encode()).decode())


# Environment variable and flag names that hold a credential: TOKEN (HF_TOKEN, --hf-token; not
# TOKENS or TOKENIZER: MAX_TOKENS, --max-num-batched-tokens, --tokenizer), SECRET, PASSW,
# API_KEY, ACCESS_KEY, CREDENTIAL, AUTH, HEADER (OTEL_EXPORTER_OTLP_HEADERS, --headers carry
# Authorization values), or KEY/PASS/PWD as a word of their own (AZURE_OPENAI_KEY, DB_PASS;
# not KEYBOARD or PASSTHROUGH).
_SECRET_ENV_NAME = re.compile(
    r"TOKEN(?!S|IZ)|SECRET|PASSW|API[_-]?KEY|ACCESS[_-]?KEY|CREDENTIAL"
    r"|AUTH|HEADER|(^|[_-])(KEY|PASS|PWD)($|[_-])",
    re.IGNORECASE,
)


def is_secret_env_name(name: str) -> bool:
    """True when an environment variable's name says it holds a credential (``HF_TOKEN``,
    ``OPENAI_API_KEY``, ``DB_PASSWORD``…); raises nothing."""
    return bool(_SECRET_ENV_NAME.search(name))


def register_env_secrets(env: Mapping[str, str]) -> None:
    """Register the value of every variable of ``env`` whose name looks secret (a child's
    environment: a server that logs it, or dies quoting it, is shown only masked); returns
    None, raises nothing. An absolute path is not registered: ``PWD``, ``SSH_AUTH_SOCK``,
    ``XAUTHORITY`` or ``GOOGLE_APPLICATION_CREDENTIALS`` name a place, not a secret, and
    masking them would blot out every path under the working or home directory."""
    for name, value in env.items():
        if is_secret_env_name(name) and not value.startswith(("/", "~")):
            register_secret(value)


def header_secret_problem(value: str) -> str | None:
    """Why ``value`` cannot be sent as a bearer token in an HTTP header (None: it can). Said
    without the value: the HTTP library's own error would quote the header whole."""
    if value != value.strip():
        return (
            "it has whitespace or a newline at its start or end (as `echo` or a file "
            "leave it): strip it, e.g. export VAR=\"$(tr -d '\\n' < keyfile)\""
        )
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        return "it holds a control character (a newline, a tab…), which a header cannot carry"
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        return (
            "it holds a character outside Latin-1, which an HTTP header cannot carry "
            "(a pasted typographic quote or dash?)"
        )
    return None


def mask_secrets(text: str) -> str:
    """``text`` with every registered secret (whole, or its start when cut short) replaced by
    :data:`MASK`; raises nothing."""
    masker = _masker
    if masker is None or not text:
        return text
    return masker.mask(text)


def forget_secrets() -> None:
    """Empty the registry (tests; a long-lived process that is done with its secrets)."""
    global _masker
    with _registry_lock:
        _secrets.clear()
        _masker = None


# Query parameter names (lowercased, - and _ removed) that carry credentials.
_SECRET_PARTS = (
    "token",
    "secret",
    "pass",
    "pwd",
    "apikey",
    "key",
    "auth",
    "signature",
    "sig",
    "credential",
    "session",
)
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://(?:<redacted>|[^\s\"'<>])+")


def is_secret_name(name: str) -> bool:
    squashed = name.lower().replace("-", "").replace("_", "")
    return any(part in squashed for part in _SECRET_PARTS)


# ``scheme://user:pa/ss@host…``: a password holding '/', '?' or '#' (unencoded, as people
# paste them) ends the authority early for urlsplit, which then sees no userinfo at all and the
# password would be shown whole. Anything up to the last '@' whose user part is a plain name is
# taken as userinfo: over-masking an odd path with '@' in it is the safe mistake.
_SLASHED_USERINFO = re.compile(
    r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^@\s/?#:]*):"
    r"(?P<password>[^\s]*[/?#][^\s]*)@(?P<rest>[^@\s]*)"
)


def redact_url(url: str) -> str:
    """``url`` without ``user:password@`` and with secret-named query values redacted."""
    slashed = _SLASHED_USERINFO.fullmatch(url)
    if slashed is not None:
        return redact_url(slashed["scheme"] + slashed["rest"])
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:  # a malformed port or brackets: do not echo what cannot be parsed
        return _crude(url)
    netloc = parts.netloc
    if parts.username is not None or parts.password is not None:
        netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port else "")
    query, fragment = _redact_pairs(parts.query), _redact_pairs(parts.fragment)
    if netloc == parts.netloc and query == parts.query and fragment == parts.fragment:
        return url
    return urlunsplit((parts.scheme, netloc, parts.path, query, fragment))


def _redact_pairs(text: str) -> str:
    """A query (or an OAuth-style ``#access_token=…`` fragment) with secret-named values
    redacted; unchanged when it holds none."""
    if "=" not in text:
        return text
    pairs = parse_qsl(text, keep_blank_values=True)
    if not any(is_secret_name(k) for k, _ in pairs):
        return text
    return urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs], safe="<>")


def redact_urls_in(text: str) -> str:
    """Every URL inside free text (an error message, a log line) redacted, and every
    registered secret masked: the one mask applied where text leaves phaseprobe."""
    text = mask_secrets(text)
    if "://" not in text:
        return text
    return _URL.sub(lambda m: redact_url(m.group()), text)


def _crude(url: str) -> str:
    """Best effort for a URL urlsplit rejects: drop anything before an @ in the authority."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        authority = authority.rsplit("@", 1)[1]
    return f"{scheme}://{authority}{slash}{tail.split('?', 1)[0]}"


class SecretMaskFilter(logging.Filter):
    """A ``logging`` filter that masks, in place, every registered secret and URL credential
    in a record: its message with its arguments, its traceback and stack text. It never drops
    a record (:meth:`filter` returns True) and raises nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        """True, always; the record's text is masked on the way."""
        try:
            text = record.getMessage()
        except Exception:  # a bad format string: keep its parts, masked, for the handler
            text = f"{record.msg} {record.args!r}"
        record.msg, record.args = redact_urls_in(text), None
        if record.exc_info and not record.exc_text:
            # formatted here so the handler's Formatter finds it done (it formats only
            # when exc_text is empty), a library exception quoting a header included
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls_in(record.exc_text)
        if record.stack_info:
            record.stack_info = redact_urls_in(record.stack_info)
        return True


_log_mask: SecretMaskFilter | None = None


def install_log_mask() -> SecretMaskFilter:
    """Mask every log record made from now on, by any logger of this process (phaseprobe's,
    urllib3's, a span store client's), whatever handler prints it; returns the one filter
    doing it. Raises nothing; a second call changes nothing.

    The filter runs in the record factory, not on a logger or a handler: a logger's filter
    misses what its children propagate, and a handler's misses handlers added later and
    ``logging.lastResort`` (which prints warnings when none is configured)."""
    global _log_mask
    with _registry_lock:
        if _log_mask is None:
            mask = SecretMaskFilter()
            make = logging.getLogRecordFactory()

            def masked_record(*args: object, **kwargs: object) -> logging.LogRecord:
                record = make(*args, **kwargs)
                mask.filter(record)
                return record

            logging.setLogRecordFactory(masked_record)
            _log_mask = mask
        return _log_mask
