"""``prefix`` reports what vLLM says about its own prefix cache (issue 32 items 2 and 3): where
each run's prompt tokens came from and KV block residency over the experiment, on one server
and on a prefill/decode pair. The servers are SSE test servers exporting vLLM's
``prompt_tokens_by_source``, ``prompt_tokens_cached_by_source`` and ``kv_block_*`` histograms
from a prefix cache they keep (the real server: tests/integration/test_interplay_real.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from phaseprobe.collect.interplay import Target, run_prefix
from phaseprobe.collect.interplay.prefix import experiment_residency
from phaseprobe.present.cli import main
from phaseprobe.sources.vllm.metrics import parse_exposition
from phaseprobe.store import Store
from phaseprobe.testing.sse_server import RequestRecord, Script, SseServer
from tests.fleet_proxy import RoundRobinProxy

BLOCK = 16  # the SSE server's cache_config_info block_size
BOUNDS = (0.001, 0.01, 0.1, 1.0, 10.0)
RESIDENCY = (
    "kv_block_lifetime_seconds",
    "kv_block_idle_before_evict_seconds",
    "kv_block_reuse_gap_seconds",
)


class PrefixCacheServer(SseServer):
    """An SSE server with a prefix cache, counted as vLLM 0.32 counts it: a prompt hits the
    whole blocks (``BLOCK`` "tokens", words here) it shares with an earlier prompt, never its
    last token; the rest is computed. With ``residency`` = (lifetime, idle, reuse gap) seconds
    (``--kv-cache-metrics``), each request evicts ``evictions`` sampled blocks observed at
    those values."""

    def __init__(
        self,
        script: Script,
        *,
        residency: tuple[float, float, float] | None = None,
        evictions: int = 2,
        **kw: Any,
    ) -> None:
        super().__init__(script, metrics=True, **kw)
        self.seen: list[list[str]] = []
        self.sources = {"local_compute": 0.0, "local_cache_hit": 0.0, "external_kv_transfer": 0.0}
        self.tiers = {"device": 0.0, "host": 0.0}
        self.residency, self.evictions = residency, evictions
        self.observed: dict[str, list[float]] = {name: [] for name in RESIDENCY}

    def _observe(self, rec: RequestRecord, script: Script, prompt_tokens: int) -> None:
        words = str((rec.body or {}).get("prompt", "")).split()
        shared = max(
            (
                next(
                    (i for i, (a, b) in enumerate(zip(words, old)) if a != b),
                    min(len(words), len(old)),
                )
                for old in self.seen
            ),
            default=0,
        )
        hit = min(shared, prompt_tokens - 1) // BLOCK * BLOCK
        with self._lock:  # before the histograms move: a scrape that sees them sees these
            self.seen.append(words)
            self.sources["local_cache_hit"] += hit
            self.sources["local_compute"] += prompt_tokens - hit
            self.tiers["device"] += hit
            if self.residency is not None:
                for name, value in zip(RESIDENCY, self.residency):
                    self.observed[name] += [value] * self.evictions
        super()._observe(rec, script, prompt_tokens)

    def metrics_text(self) -> str:
        lab = f'engine="0",model_name="{self.model}"'
        lines: list[str] = []
        with self._lock:
            for base, values in (
                ("prompt_tokens_by_source", self.sources),
                ("prompt_tokens_cached_by_source", self.tiers),
            ):
                name = f"vllm:{base}"
                lines += [f"# TYPE {name} counter"] + [
                    f'{name}_total{{{lab},source="{k}"}} {v!r}' for k, v in values.items()
                ]
            if self.residency is not None:
                for base, obs in self.observed.items():
                    name = f"vllm:{base}"
                    lines.append(f"# TYPE {name} histogram")
                    lines += [
                        f'{name}_bucket{{{lab},le="{le}"}} {float(sum(v <= le for v in obs))!r}'
                        for le in BOUNDS
                    ]
                    lines += [
                        f'{name}_bucket{{{lab},le="+Inf"}} {float(len(obs))!r}',
                        f"{name}_sum{{{lab}}} {float(sum(obs))!r}",
                        f"{name}_count{{{lab}}} {float(len(obs))!r}",
                    ]
        return super().metrics_text() + "\n".join(lines) + "\n"


def _prefix_json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    code = main(["prefix", "--prefix-tokens", "40", "--json", *argv])
    out = capsys.readouterr()
    assert code == 0, out.err
    return json.loads(out.out)


def test_sources_per_run_and_an_evicting_cache_on_one_server(tmp_path, capsys):
    # blocks idle 5 ms before eviction, reused every 0.5 s: evicted before reuse
    with PrefixCacheServer(Script(n_tokens=4), residency=(0.05, 0.005, 0.5)) as srv:
        doc = _prefix_json(
            capsys, ["--endpoint", srv.base_url, "--reps", "2", "--store", str(tmp_path / "s.db")]
        )
    (src,) = doc["prompt_sources"]
    assert src["instance"] == "server"
    runs = {r["seq"]: r for r in src["runs"]}
    usage = {r["seq"]: r["client"]["prompt_tokens"] for r in doc["runs"]}
    for seq in (0, 2):  # cold: a fresh prefix, every token computed
        assert runs[seq]["pass"] == "cold"
        assert runs[seq]["sources"] == {
            "local_compute": usage[seq],
            "local_cache_hit": 0,
            "external_kv_transfer": 0,
        }
    for seq in (1, 3):  # warm: the 40-token prefix hits in whole 16-token blocks
        assert runs[seq]["sources"]["local_cache_hit"] == 32
        assert runs[seq]["sources"]["local_compute"] == usage[seq] - 32
        tiers = runs[seq]["cached_by_tier"]  # every tier vLLM has, 0 where none came
        assert tiers["device"] == 32 and not any(v for k, v in tiers.items() if k != "device")
    assert src["warm"] == {
        "runs": 2,
        "sources": {
            "local_compute": usage[1] + usage[3] - 64,
            "local_cache_hit": 64,
            "external_kv_transfer": 0,
        },
        "cached_by_tier": {**dict.fromkeys(tiers, 0), "device": 64},
    }
    assert src["cold"]["sources"]["local_cache_hit"] == 0
    said = src["said"][1]
    assert said.startswith(
        "prompt tokens by source (the server's), warm pass: over 2 isolated run(s): "
    )
    assert f"computed {usage[1] + usage[3] - 64} (" in said and "local cache hit 64 (" in said
    assert said.endswith("cached by tier: device 64")
    res = doc["kv_residency"]
    # warm-up + 4 runs, 2 sampled evictions each, between the experiment's first and last scrape
    assert res["sampled_evictions"] == 10 and res["evicted_before_reuse"] is True
    assert res["idle_before_evict_p50_s"] <= 0.01 < 0.1 <= res["reuse_gap_p50_s"] <= 1.0
    assert "too small for the traffic" in res["said"] and res["instance"] == "server"


def test_text_says_the_residency_verdict_and_the_sources(tmp_path, capsys):
    # blocks idle 2 s before eviction, reused within 5 ms: the cache keeps them long enough
    with PrefixCacheServer(Script(n_tokens=4), residency=(3.0, 2.0, 0.005)) as srv:
        code = main(
            [
                "prefix",
                "--endpoint",
                srv.base_url,
                "--reps",
                "1",
                "--prefix-tokens",
                "40",
                "--store",
                str(tmp_path / "s.db"),
            ]
        )
    out = capsys.readouterr().out
    assert code == 0
    assert "prompt tokens by source (the server's), cold pass: over 1 isolated run(s)" in out
    assert "warm pass: over 1 isolated run(s)" in out and "local cache hit 32" in out
    assert "KV residency over the experiment:" in out
    assert "KV blocks outlive their reuse gap" in out and "6 sampled evictions" in out


def test_no_kv_cache_metrics_and_too_few_evictions_are_said(tmp_path):
    with Store(tmp_path / "s.db") as store:
        with PrefixCacheServer(Script(n_tokens=2)) as srv:  # no --kv-cache-metrics
            res = run_prefix(Target(srv.base_url, srv.model), store, prefix_tokens=40, reps=1)
        assert res.residency is not None and res.residency.residency is not None
        assert res.residency.residency.evicted_before_reuse is None
        assert "start vLLM (0.32 or later) with --kv-cache-metrics" in res.residency.said
        assert res.sources[0].warm is not None  # the sources are there all the same
        with PrefixCacheServer(
            Script(n_tokens=2), residency=(0.05, 0.005, 0.5), evictions=1
        ) as srv:
            res = run_prefix(Target(srv.base_url, srv.model), store, prefix_tokens=40, reps=1)
        assert res.residency is not None
        assert res.residency.to_dict()["sampled_evictions"] == 3  # warm-up, cold, warm
        assert "too few to judge" in res.residency.said
        assert res.residency.to_dict()["evicted_before_reuse"] is None


def test_a_server_without_sources_or_metrics_is_said_not_guessed(tmp_path):
    with Store(tmp_path / "s.db") as store:
        with SseServer(Script(n_tokens=2), metrics=True) as srv:  # vLLM before 0.32
            res = run_prefix(Target(srv.base_url, srv.model), store, prefix_tokens=40, reps=1)
        (src,) = res.sources
        assert src.cold is None and src.warm is None and src.isolated_runs == 2
        assert src.lines() == [
            "prompt tokens by source (the server's): not exported (vLLM "
            "0.32 or later exports vllm:prompt_tokens_by_source)"
        ]
        assert [r["sources"] for r in src.per_run] == [None, None]
        with SseServer(Script(n_tokens=2)) as srv:  # no /metrics at all
            res = run_prefix(Target(srv.base_url, srv.model), store, prefix_tokens=40, reps=1)
        assert res.sources[0].lines() == [
            "prompt tokens by source (the server's): no isolated run to read them from"
        ]
        assert res.residency is not None and res.residency.residency is None
        assert res.residency.said.startswith("KV residency not read: no /metrics scrape")


def _histogram_page(count: float) -> str:
    name = "vllm:kv_block_idle_before_evict_seconds"
    return (
        f'# TYPE {name} histogram\n{name}_bucket{{le="0.01"}} {count}\n'
        f'{name}_bucket{{le="+Inf"}} {count}\n{name}_sum 0.0\n{name}_count {count}\n'
    )


def test_residency_histograms_going_backwards_are_not_judged():
    before, after = parse_exposition(_histogram_page(9)), parse_exposition(_histogram_page(2))
    got = experiment_residency(before, after)
    assert got.residency is None and "went backwards" in got.said
    moved = experiment_residency(before, parse_exposition(_histogram_page(12)))
    # moved, but no reuse-gap histogram: the verdict cannot be drawn, and says why
    assert moved.residency is not None and moved.residency.evicted_before_reuse is None
    assert "--kv-cache-metrics" in moved.said


def test_on_a_pair_both_instances_sources_and_the_prefill_instances_residency(tmp_path, capsys):
    one = Script(n_tokens=1, first_delay_s=0.005)  # the prefill leg
    # only the prefill instance exports residency: read from there, where prefixes are cached
    with (
        PrefixCacheServer(one, residency=(0.05, 0.005, 0.5)) as p,
        PrefixCacheServer(Script(n_tokens=4)) as d,
    ):
        doc = _prefix_json(
            capsys,
            [
                "--prefill",
                p.base_url,
                "--decode",
                d.base_url,
                "--reps",
                "1",
                "--store",
                str(tmp_path / "s.db"),
            ],
        )
    prefill, decode = doc["prompt_sources"]
    assert prefill["instance"] == "prefill" and decode["instance"] == "decode"
    usage = doc["runs"][0]["client"]["prompt_tokens"]
    assert prefill["cold"]["sources"] == {
        "local_compute": usage,
        "local_cache_hit": 0,
        "external_kv_transfer": 0,
    }
    assert prefill["warm"]["sources"]["local_cache_hit"] == 32
    assert decode["warm"]["sources"]["local_cache_hit"] == 32  # this decode keeps a cache too
    assert prefill["said"][0].startswith("prompt tokens by source (the prefill instance's)")
    res = doc["kv_residency"]
    assert res["instance"] == "prefill" and res["evicted_before_reuse"] is True
    assert res["sampled_evictions"] == 6  # the prefill instance's warm-up, cold and warm legs


def test_behind_a_router_sources_per_replica_and_residency_not_pooled(tmp_path, capsys):
    """Each run's sources are its serving replica's own deltas; residency is not read from a
    router (its /metrics is any replica's, and each replica has its own cache)."""
    script = Script(n_tokens=2)
    with (
        PrefixCacheServer(script, residency=(0.05, 0.005, 0.5)) as a,
        PrefixCacheServer(script, residency=(0.05, 0.005, 0.5)) as b,
        RoundRobinProxy([a.base_url, b.base_url]) as router,
    ):
        doc = _prefix_json(
            capsys,
            [
                "--endpoint",
                router.base_url,
                "--replica",
                f"r1={a.base_url}",
                "--replica",
                f"r2={b.base_url}",
                "--reps",
                "1",
                "--store",
                str(tmp_path / "s.db"),
            ],
        )
    (src,) = doc["prompt_sources"]
    # round robin: the warm run lands on the other replica, whose cache never saw the prefix
    assert [r["sources"]["local_cache_hit"] for r in src["runs"]] == [0, 0]
    assert doc["kv_residency"]["evicted_before_reuse"] is None
    assert doc["kv_residency"]["said"].startswith("KV residency not read behind a router")
