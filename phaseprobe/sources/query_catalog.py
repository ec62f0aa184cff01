"""The named PromQL queries shipped in ``phaseprobe/queries/`` and their version-aware rendering.

Each ``NAME.promql`` file holds header lines ``# help: ...`` and ``# unit: ...`` (further
``# note: ...`` lines explain why the query is written the way it is) and then one PromQL
expression with two placeholders: ``$selector`` (label matchers without braces, possibly empty)
and ``$window`` (a range such as ``5m``). The files name the *newest* vLLM metrics;
:meth:`Query.render` rewrites them to the spellings a given Prometheus actually holds (old vLLM
releases, ``vllm_`` exporters), from a map built by :func:`resolve_names`. The candidate
spellings come from :data:`phaseprobe.sources.vllm.metrics.ALIASES`, the one alias table.

    catalog = load_catalog()
    catalog["avg_decode_time"].render('model_name="m"', "5m", names)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from importlib.abc import Traversable
from pathlib import Path

from phaseprobe.errors import ConfigError

# sample_spellings is vllm_metrics' own prefix/_total expansion: one alias table.
from phaseprobe.sources.vllm.metrics import ALIASES, Kind, sample_spellings

__all__ = [
    "CATALOG_ONLY",
    "PLACEHOLDERS",
    "UNITS",
    "Query",
    "bare_selector",
    "load_catalog",
    "metric_names",
    "newest_name",
    "promql_string",
    "resolve_names",
    "spellings",
]

PLACEHOLDERS = frozenset({"selector", "window"})
UNITS = frozenset(
    {
        "s",
        "ratio",
        "fraction",
        "tokens/s",
        "tokens",
        "requests",
        "1/s",
        "bytes",
        "bytes/s",
        "flop/s",
    }
)

# Metrics the catalog charts but phaseprobe's own scrapes do not read, so they are not in
# ALIASES (the table MetricSnapshot resolves): never renamed, one base name each, and none in
# ALIASES too (prompt_tokens_by_source, prompt_tokens_cached_by_source and vLLM's estimated
# FLOP/byte counters are there: probe reads them). The nixl_* ones and the KV-fetch gauge (the
# P/D row, issue 28) exist only in some deployments; which is in present/grafana/lint.py
# (DEPLOYMENT_ONLY).
CATALOG_ONLY: dict[str, tuple[Kind, tuple[str, ...]]] = {
    "kv_fetch_by_stage": ("gauge", ("num_requests_kv_fetch_by_stage",)),
    "nixl_xfer_time": ("histogram", ("nixl_xfer_time_seconds",)),
    "nixl_post_time": ("histogram", ("nixl_post_time_seconds",)),
    "nixl_bytes_transferred": ("histogram", ("nixl_bytes_transferred",)),
    "nixl_num_failed_transfers": ("counter", ("nixl_num_failed_transfers",)),
    "nixl_num_failed_notifications": ("counter", ("nixl_num_failed_notifications",)),
    "nixl_num_kv_expired_reqs": ("counter", ("nixl_num_kv_expired_reqs",)),
}

_HIST_SUFFIXES = ("_sum", "_count", "_bucket")
# A Prometheus duration (5m, 1h30m, 500ms) or a dashboard variable ($__rate_interval, ${w}).
_WINDOW = re.compile(r"(?:\d+(?:ms|[smhdwy]))+|\$\{?\w+\}?")
_NAME = re.compile(r"[a-z0-9_]+")
_PLACEHOLDER = re.compile(r"\$\{?(\w+)\}?")
# An identifier that is not part of a larger token, not a $variable and not a number's exponent.
_IDENT = re.compile(r"(?<![\w:.$])[A-Za-z_:][\w:]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|`[^`]*`')
_BRACED = re.compile(r"\{[^{}]*\}|\[[^\[\]]*\]")
_LABEL_LIST = re.compile(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)")
_KEYWORDS = frozenset(
    {
        "sum",
        "min",
        "max",
        "avg",
        "group",
        "stddev",
        "stdvar",
        "count",
        "count_values",
        "bottomk",
        "topk",
        "quantile",
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "bool",
        "and",
        "or",
        "unless",
        "offset",
        "atan2",
        "inf",
        "nan",
        "start",
        "end",
    }
)


@lru_cache(maxsize=1)
def _table() -> dict[str, tuple[str, ...]]:
    """Newest sample name → every spelling of that sample, newest first (from ALIASES and
    CATALOG_ONLY)."""
    table: dict[str, tuple[str, ...]] = {}
    for kind, bases in (*ALIASES.values(), *CATALOG_ONLY.values()):
        families = [name for base in bases for name in sample_spellings(kind, base)]
        if kind == "histogram":
            for suffix in _HIST_SUFFIXES:
                names = tuple(f + suffix for f in families)
                table[names[0]] = names
        else:
            table[families[0]] = tuple(families)
    return table


@lru_cache(maxsize=1)
def _reverse() -> dict[str, str]:
    return {old: newest for newest, names in _table().items() for old in names}


def spellings(name: str) -> tuple[str, ...]:
    """Every known spelling of a vLLM sample name, newest first (``(name,)`` if unknown)."""
    newest = newest_name(name) or name
    return _table().get(newest, (name,))


def newest_name(name: str) -> str | None:
    """The newest spelling of any known vLLM sample name (old, underscore or current); None
    when the name is not one ALIASES knows. A dashboard lint reports stale names with this."""
    return _reverse().get(name)


def resolve_names(present: Iterable[str]) -> dict[str, str]:
    """Map each newest sample name to the first of its spellings found in ``present`` (e.g. the
    names Prometheus lists). Names with no spelling present are left out: the newest spelling
    stays in the query and the result is simply empty."""
    have = set(present)
    resolved: dict[str, str] = {}
    for newest, names in _table().items():
        for name in names:
            if name in have:
                resolved[newest] = name
                break
    return resolved


def metric_names(expr: str) -> set[str]:
    """Metric names an expression references, sample suffixes (``_sum``, ``_bucket``, ``_total``)
    kept. Label names, functions, aggregations, keywords and ``$variables`` are not names."""
    text = _STRING.sub('""', expr)
    previous = None
    while previous != text:  # innermost braces first; PromQL does not nest them, Grafana might
        previous, text = text, _BRACED.sub(" ", text)
    text = _LABEL_LIST.sub(" ", text)
    text = re.sub(r"#[^\n]*", " ", text)  # PromQL comments
    names: set[str] = set()
    for match in _IDENT.finditer(text):
        word = match.group(0)
        if word.lower() in _KEYWORDS or text[match.end() :].lstrip().startswith("("):
            continue  # an aggregation, keyword or function call
        names.add(word)
    return names


def _rename(template: str, names: Mapping[str, str]) -> str:
    def sub(match: re.Match[str]) -> str:
        word = match.group(0)
        if word in names:
            return names[word]
        # A family-level key (``vllm:x_seconds`` → ``vllm:y_seconds``) rewrites every sample of it.
        for suffix in (*_HIST_SUFFIXES, "_total"):
            family = word.removesuffix(suffix)
            if family != word and family in names:
                return names[family] + suffix
        return word

    return _IDENT.sub(sub, template)


@dataclass(frozen=True)
class Query:
    """One named query: ``template`` is the PromQL with ``$selector`` and ``$window``."""

    name: str
    help: str
    unit: str
    template: str

    @property
    def metrics(self) -> set[str]:
        """The metric names the template references."""
        return metric_names(self.template)

    def render(
        self, selector: str = "", window: str = "5m", names: Mapping[str, str] | None = None
    ) -> str:
        """The PromQL to send. ``selector`` is label matchers (surrounding braces are accepted
        and dropped); ``names`` maps a newest metric name (sample- or family-level) to the
        spelling present, as :func:`resolve_names` builds it."""
        window = window.strip()
        if not _WINDOW.fullmatch(window):
            raise ConfigError(f"window {window!r} is not a Prometheus duration (e.g. 30s, 5m, 1h)")
        # Rename before substituting, so a name quoted inside the user's selector is left alone.
        expr = _rename(self.template, names) if names else self.template
        return expr.replace("$selector", bare_selector(selector)).replace("$window", window)


# One PromQL label matcher: a label name, an operator and a quoted string (double, single or
# backtick quotes, with backslash escapes in the first two), as Prometheus' lexer reads them.
_MATCHER = re.compile(
    r"""\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"""
    r"""("(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*'|`[^`]*`)\s*"""
)


def bare_selector(selector: str) -> str:
    """Label matchers without their surrounding braces: ``{a="b"}`` and ``a="b"`` alike.
    The text is parsed as PromQL label matchers (``name op "value"``, comma-separated) and
    rebuilt from what was parsed, never spliced: anything else (``a="b"}) or vector(1)``)
    is a ConfigError saying where it stops being a matcher."""
    s = selector.strip()
    if s.startswith("{") and s.endswith("}"):
        s = s[1:-1].strip()
    matchers: list[str] = []
    pos = 0
    while pos < len(s):
        m = _MATCHER.match(s, pos)
        if m is None or (m.end() < len(s) and s[m.end()] != ","):
            at = pos if m is None else m.end()
            raise ConfigError(
                f"selector {selector!r} is not PromQL label matchers "
                f'(name="value", name=~"regex", name!="value", comma-'
                f"separated): it stops being one at character {at + 1} "
                f"({s[at : at + 20]!r})"
            )
        # rebuilt from the parsed parts, each after the separator as typed (", " or ","), so
        # a well-formed selector reads as it was given (the shipped dashboard's byte-for-byte)
        sep = "" if not matchers else ", " if s[pos : pos + 1].isspace() else ","
        matchers.append(sep + m.group(1) + m.group(2) + m.group(3))
        pos = m.end() + 1
    return "".join(matchers)


# Go's escapes, which PromQL's lexer reads in a double-quoted string; other control
# characters become \xHH, so no byte of the value can end the string or the line.
_STRING_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string (str); raises ConfigError for a lone surrogate.

    Escaped per PromQL's string rules, so a label value from a server (a model name with
    ``"``, ``\\`` or a newline) is never spliced into a query; a lone surrogate is refused
    because no UTF-8 query can carry it."""
    out: list[str] = []
    for ch in value:
        code = ord(ch)
        if ch in _STRING_ESCAPES:
            out.append(_STRING_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif 0xD800 <= code <= 0xDFFF:
            raise ConfigError(f"label value {value!r} holds a lone surrogate: not UTF-8")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def _parse(name: str, text: str, source: str) -> Query:
    headers: dict[str, list[str]] = {}
    body: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not body and stripped.startswith("#"):
            key, sep, value = stripped[1:].partition(":")
            if sep:
                headers.setdefault(key.strip().lower(), []).append(value.strip())
            continue
        if body or stripped:
            body.append(line.rstrip())
    template = "\n".join(body).strip()
    for key in ("help", "unit"):
        if not headers.get(key):
            raise ConfigError(f"{source}: missing '# {key}:' header line")
    if not template:
        raise ConfigError(f"{source}: no PromQL expression after the header")
    unknown = {p for p in _PLACEHOLDER.findall(template)} - PLACEHOLDERS
    if unknown:
        raise ConfigError(
            f"{source}: unknown placeholder(s) {sorted(unknown)} (only $selector and $window)"
        )
    return Query(
        name=name, help=" ".join(headers["help"]), unit=headers["unit"][0], template=template
    )


def _load(directory: Traversable) -> dict[str, Query]:
    catalog: dict[str, Query] = {}
    for entry in sorted(directory.iterdir(), key=lambda e: e.name):
        if not entry.name.endswith(".promql"):
            continue
        name = entry.name.removesuffix(".promql")
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{entry}: query names are lower-case letters, digits and _")
        catalog[name] = _parse(name, entry.read_text(encoding="utf-8"), str(entry))
    return catalog


@lru_cache(maxsize=1)
def _packaged() -> dict[str, Query]:
    return _load(resources.files("phaseprobe") / "queries")


def load_catalog(directory: str | Path | Traversable | None = None) -> dict[str, Query]:
    """Queries by name: the packaged ones, or those of ``directory`` (users' own ``.promql``)."""
    if directory is None:
        return dict(_packaged())
    folder = Path(directory) if isinstance(directory, str | Path) else directory
    if not folder.is_dir():
        raise ConfigError(f"query directory {folder} does not exist")
    return _load(folder)
