"""A rich Console that cannot be made to rewrite the user's screen.

Text from servers (error bodies, model names), files (log lines, labels) and stores reaches
the terminal through tables and messages. Terminal control sequences in it (ESC, CSI, OSC,
other C0/C1 controls) would be executed by the terminal: clear the screen, retitle the
window, hide a line. Rich strips some controls but passes ESC through, so every string rich
turns into text (``print`` arguments and table cells alike go through ``render_str``) is
made visible first: ``\\x1b`` is shown as ``\\x1b``, never sent. phaseprobe's own styling is
applied by rich after this, so colours still work. JSON output is safe by construction
(``json.dumps`` escapes control characters).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from rich.console import Console, ConsoleOptions, RenderableType
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from phaseprobe.present.cli.table_fit import fit_table, fitted_for
from phaseprobe.redact import redact_urls_in

__all__ = ["SafeConsole", "visible"]

# C0 controls except tab and newline, DEL, and the C1 range (some terminals act on it).
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def visible(text: str) -> str:
    """``text`` with every control character shown as ``\\xNN`` instead of acting."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


class SafeConsole(Console):
    """Also the last guard for credentials: a URL with ``user:password@`` or a secret query
    parameter is redacted in whatever reaches the terminal or ``--json`` (each command
    redacts what it prints; this catches what a message quotes, e.g. a requests error)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # No emoji codes: file- and server-derived text is full of ":1234:"-like runs
        # ("net_ib.cc:1234 (fn)") that rich would turn into pictures.
        kwargs.setdefault("emoji", False)
        super().__init__(*args, **kwargs)

    def render(
        self, renderable: RenderableType, options: ConsoleOptions | None = None
    ) -> Iterable[Segment]:
        # Every table, wherever it is (a group, a live display), is laid out for the width it
        # is drawn at: no column narrower than its longest word (table_fit says how).
        opts = options or self.options
        if isinstance(renderable, Table) and not fitted_for(renderable, opts.max_width):
            renderable = fit_table(renderable, self, opts)
        return super().render(renderable, options)

    def render_str(self, text: str, **kwargs: Any) -> Text:
        return super().render_str(visible(redact_urls_in(text)), **kwargs)
