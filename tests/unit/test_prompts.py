import json as json_module
import re

from phaseprobe.collect.prompts import PromptBuilder


class _Raw:
    def __init__(self, data):
        self.data = data

    def read(self, n, decode_content=True):
        return self.data[:n]


class _Resp:
    """The part of requests.Response the bounded reader uses (``bounded_request`` caps the
    bytes while they are read: what it returns has them as ``content``)."""

    def __init__(self, status, payload):
        self.status_code = status
        self.content = json_module.dumps(payload).encode()
        self.raw = _Raw(self.content)

    def close(self):
        pass


class FakeTokenizer:
    """A /tokenize stand-in: BOS + one token per word or punctuation mark; long words split."""

    def __init__(self, available=True):
        self.available = available
        self.calls = 0

    def request(self, method, url, json=None, headers=None, timeout=None, stream=False):
        assert method == "POST" and url.endswith("/tokenize")
        self.calls += 1
        if not self.available:
            return _Resp(404, {"detail": "Not Found"})
        pieces = re.findall(r"\w+|[^\w\s]", json["prompt"])
        return _Resp(200, {"count": 1 + sum(1 + len(p) // 7 for p in pieces)})


def _builder(session, seed=0):
    return PromptBuilder("http://x", "m", session=session, headers={}, seed=seed)


def test_exact_length_and_unique_per_run():
    tok = FakeTokenizer()
    b = _builder(tok)
    prompts = [b.build(128, i) for i in range(4)]
    assert all(p.tokens == 128 for p in prompts)
    assert len({p.text.split()[0:6].__str__() for p in prompts}) == 4  # distinct openings
    assert tok.calls < 4 * 20  # a binary search, not a linear scan
    # Deterministic: the same seed and index give the same prompt.
    assert _builder(FakeTokenizer()).build(128, 2).text == prompts[2].text


def test_without_tokenize_the_length_is_approximate_and_says_so():
    b = _builder(FakeTokenizer(available=False))
    p = b.build(32, 0)
    assert p.tokens is None and b.tokenize_available is False
    assert len(p.text.split()) == 32
