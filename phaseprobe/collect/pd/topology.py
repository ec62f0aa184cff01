"""Where a prefill/decode pair's requests go: its two instances, and the router in front."""

from __future__ import annotations

from dataclasses import dataclass

from phaseprobe.errors import ConfigError
from phaseprobe.redact import redact_url

__all__ = ["PdTopology", "pd_pair"]


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


def pd_pair(
    prefill: str | None, decode: str | None, router: str | None, *, replicas: bool = False
) -> PdTopology | None:
    """``--prefill``/``--decode`` (both or neither; ``router``: ``--endpoint``) as a checked
    pair, before anything starts; None when neither is given. ``replicas``: ``--replica`` was
    given too, which names no instance of a pair. Raises ConfigError naming the flags."""
    # the endpoint rule pulls in the HTTP client: loaded when a pair is named, not for --help
    from phaseprobe.collect.target import endpoint_url

    if prefill is None and decode is None:
        return None
    if prefill is None or decode is None:
        raise ConfigError("a prefill/decode pair needs both --prefill URL and --decode URL")
    if replicas:
        raise ConfigError(
            "--replica and --prefill/--decode: name the pair's two instances "
            "with --prefill and --decode"
        )
    prefill_url, decode_url = endpoint_url(prefill), endpoint_url(decode)
    router_url = endpoint_url(router) if router else None
    if prefill_url == decode_url:
        raise ConfigError("--prefill and --decode name the same instance")
    return PdTopology(prefill=prefill_url, decode=decode_url, router=router_url)
