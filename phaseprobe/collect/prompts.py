"""Prompts of a requested token length, unique per run so prefix caching cannot skew prefill.

vLLM caches prompt prefixes in whole KV blocks: a second run with the same prompt skips most
of its prefill. Each generated prompt therefore starts with words drawn from a generator seeded
by the run's index and the experiment's seed, so no two runs share a first block.

The length is calibrated against the server's own tokenizer through vLLM's ``/tokenize``
endpoint; where an endpoint has none, the length is approximate and the caller is told so
(the real count always comes from the response's usage block).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import requests

from phaseprobe.sources.vllm.openai_stream import small_json

__all__ = ["PromptBuilder", "BuiltPrompt"]

_TOKENIZE_BASE_BYTES = 64 * 1024  # /tokenize's answer besides its token ids

# Plain, common words: tokenizers split them into few tokens, and the text stays readable.
_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug "
    "show leader light voice wife police mind price report decision son view relationship town "
    "road arm difference value building action model season society tax director position"
).split()


@dataclass(frozen=True)
class BuiltPrompt:
    """A built prompt and its length in tokens as the server's ``/tokenize`` counted it (None: not
    available)."""

    text: str
    tokens: int | None  # as counted by the server's /tokenize (None: not available)


class PromptBuilder:
    """Builds run prompts; ``session``/``headers`` are the collector's, so auth applies."""

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        session: requests.Session,
        headers: dict[str, str],
        seed: int = 0,
        timeout_s: float = 10.0,
    ) -> None:
        self.url = base_url.rstrip("/") + "/tokenize"
        self.model = model
        self.session = session
        self.headers = headers
        self.seed = seed
        self.timeout_s = timeout_s
        self.tokenize_available: bool | None = None

    def _count(self, text: str) -> int | None:
        if self.tokenize_available is False:
            return None
        doc = small_json(
            self.session,
            "POST",
            self.url,
            headers=self.headers,
            timeout_s=self.timeout_s,
            body={"model": self.model, "prompt": text},
            # /tokenize lists every token id: at most one token per byte (+ BOS), each id at
            # most ~8 bytes of JSON. Under a fixed 64 KiB, a prompt of ~8,000 tokens read as
            # "no /tokenize" and its length went uncounted.
            max_bytes=_TOKENIZE_BASE_BYTES + 8 * (len(text.encode()) + 16),
        )
        count = doc.get("count") if isinstance(doc, dict) else None
        # A token count is a whole number no larger than the text could hold (bytes + BOS):
        # "12", 1e9, true or -1 mean this is not vLLM's /tokenize.
        if not (
            isinstance(count, int)
            and not isinstance(count, bool)
            and 0 <= count <= len(text.encode()) + 16
        ):
            count = None
        self.tokenize_available = count is not None
        return count

    def _words(self, index: int, n: int) -> list[str]:
        rng = random.Random(f"{self.seed}:{index}")
        return [rng.choice(_WORDS) for _ in range(n)]

    def build(self, target_tokens: int, index: int) -> BuiltPrompt:
        """A prompt of ``target_tokens`` tokens (BOS included, as usage counts them)."""
        if target_tokens < 1:
            raise ValueError("target_tokens must be at least 1")
        words = self._words(index, max(target_tokens * 2, 8))
        # Binary search on the number of words: token count grows monotonically with it.
        lo, hi = 1, len(words)
        best: tuple[int, int] | None = None  # (n_words, tokens) closest from below
        count = self._count(" ".join(words[:hi]))
        if count is None:
            # No tokenizer to ask: ~1 token per common word is the usual ratio; usage will tell.
            return BuiltPrompt(" ".join(words[:target_tokens]), None)
        while lo <= hi:
            mid = (lo + hi) // 2
            n = self._count(" ".join(words[:mid]))
            if n is None:
                break
            if n <= target_tokens:
                best = (mid, n)
                if n == target_tokens:
                    break
                lo = mid + 1
            else:
                hi = mid - 1
        n_words, tokens = best if best else (1, self._count(words[0]) or 0)
        text = " ".join(words[:n_words])
        # Word boundaries can leave us a token or two short: pad with one-token marks.
        for _ in range(8):
            if tokens >= target_tokens:
                break
            for pad in (" .", ",", " a", "!"):
                n = self._count(text + pad)
                if n == tokens + 1:
                    text, tokens = text + pad, n
                    break
            else:
                break
        return BuiltPrompt(text, tokens)
