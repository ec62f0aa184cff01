"""Credentials out of URLs, wherever a URL is stored, logged or shown.

Operators put secrets in URLs: ``http://user:password@host:8000``, ``?api_key=…``,
``?token=…``, presigned ``?X-Amz-Signature=…``. phaseprobe keeps the URL usable (scheme, host,
port, path, the other query parameters) and replaces the secret parts: userinfo is dropped,
secret-named query values become ``<redacted>``. A leaf module (standard library only), so the
store, the sources and the console can all use it without importing one another.
"""

from __future__ import annotations

import re
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

__all__ = ["redact_url", "redact_urls_in", "REDACTED", "is_secret_name"]

REDACTED = "<redacted>"
# Query parameter names (lowercased, - and _ removed) that carry credentials.
_SECRET_PARTS = ("token", "secret", "pass", "pwd", "apikey", "key", "auth",
                 "signature", "sig", "credential", "session")
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://(?:<redacted>|[^\s\"'<>])+")


def is_secret_name(name: str) -> bool:
    squashed = name.lower().replace("-", "").replace("_", "")
    return any(part in squashed for part in _SECRET_PARTS)


# ``scheme://user:pa/ss@host…``: a password holding '/', '?' or '#' (unencoded, as people
# paste them) ends the authority early for urlsplit, which then sees no userinfo at all and the
# password would be shown whole. Anything up to the last '@' whose user part is a plain name is
# taken as userinfo: over-masking an odd path with '@' in it is the safe mistake.
_SLASHED_USERINFO = re.compile(r"(?P<scheme>[a-zA-Z][a-zA-Z0-9+.-]*://)(?P<user>[^@\s/?#:]*):"
                               r"(?P<password>[^\s]*[/?#][^\s]*)@(?P<rest>[^@\s]*)")


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
    return urlencode([(k, REDACTED if is_secret_name(k) else v) for k, v in pairs],
                     safe="<>")


def redact_urls_in(text: str) -> str:
    """Every URL inside free text (an error message, a log line) redacted."""
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
