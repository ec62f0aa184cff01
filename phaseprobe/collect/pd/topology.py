"""Where a prefill/decode pair's requests go: its two instances, and the router in front."""

from __future__ import annotations

from dataclasses import dataclass

from phaseprobe.redact import redact_url

__all__ = ["PdTopology"]


@dataclass(frozen=True)
class PdTopology:
    """Where the two legs go: each instance's base URL, and the router in front (None:
    phaseprobe sends the legs itself)."""

    prefill: str
    decode: str
    router: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        """As an experiment's ``server_info["pd"]`` keeps it (credentials redacted)."""
        return {
            "prefill": redact_url(self.prefill),
            "decode": redact_url(self.decode),
            "router": redact_url(self.router) if self.router else None,
        }
