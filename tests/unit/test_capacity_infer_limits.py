"""An endpoint's batch limits read off the plateau of the probes' own steps, each saying where
it came from (issue 39: limits "inferred (a throughput plateau)")."""

from __future__ import annotations

from phaseprobe.analysis.capacity_model.fit import ClientSample
from phaseprobe.analysis.capacity_model.infer_limits import infer_batch_limits
from phaseprobe.collect.capacity.fit_run import FitData
from phaseprobe.collect.capacity.model_fit import LimitsGiven, _limits
from phaseprobe.sources.vllm.step_log import EngineStep


def _step(i: int, pre_req: int, pre_tok: int, dec: int) -> EngineStep:
    return EngineStep(0, i, pre_req, pre_tok, dec, dec, 0.01, 0.0)


# a 768-token prompt chunked at a 512-token budget, then 12 streams of which only 8 ran at once
CAPPED = [
    _step(0, 1, 512, 0),
    _step(1, 1, 256, 0),
    _step(2, 4, 448, 4),  # 448 prompt tokens + 4 decodes: 452
    _step(3, 1, 505, 7),  # a step filled to the budget: 505 + 7, 8 requests
    *(_step(4 + i, 0, 0, 8) for i in range(20)),
]
# vLLM's num_requests_waiting while the 12 streams ran: four held back, then none
HELD_BACK = [4.0, 4.0, 4.0, 0.0, 0.0]
CLIENTS = [
    ClientSample(768, 8, 1, 0.5, 0.02),
    ClientSample(32, 32, 12, 0.3, 0.05),
]


def test_a_plateau_below_what_the_probes_sent_is_the_limit() -> None:
    got = infer_batch_limits(CAPPED, most_streams=12, longest_prompt=768, waiting=HELD_BACK)
    seqs, budget = got["max_num_seqs"], got["max_num_batched_tokens"]
    assert (seqs.value, seqs.most_seen) == (8, 8)
    assert "plateaued at 8 requests while the probes had 12 in flight" in seqs.source
    assert "held back in 3 of 5 readings" in seqs.source
    assert budget.value == 512 and "split into steps of at most 512 tokens" in budget.source


def test_a_batch_that_only_touches_its_most_is_no_ceiling() -> None:
    # as on the real CPU vLLM at load 20 (limit 128): 12 streams reached the engine at most 9
    # at a time, the batch wandering below; read as a ceiling, the fit's limit was 9
    wandering = [_step(i, 0, 0, (6, 7, 8, 9, 8, 7, 9, 8)[i % 8]) for i in range(200)]
    got = infer_batch_limits(wandering, most_streams=12, longest_prompt=32)["max_num_seqs"]
    assert (got.value, got.most_seen) == (None, 9)
    assert "at least 9" in got.source and "not pinned there: 1 steps in a row" in got.source
    # pinned, but only briefly: a short run at the top is no plateau either
    brief = [*(_step(i, 0, 0, 6) for i in range(40)), *(_step(40 + i, 0, 0, 8) for i in range(5))]
    assert (
        infer_batch_limits(brief, most_streams=12, longest_prompt=32)["max_num_seqs"].value is None
    )
    # the clean-clone CI at load 23: the batch sat at 4 for 31 steps in a row, 55 % of the
    # busy steps, while 12 streams were in flight (limit 128): a starved API server, held
    # to a lower bound; half the busy steps was not enough to call it a ceiling
    starved = [
        *(_step(i, 0, 0, (2, 3)[i % 2]) for i in range(25)),
        *(_step(25 + i, 0, 0, 4) for i in range(31)),
    ]
    got = infer_batch_limits(starved, most_streams=12, longest_prompt=32)["max_num_seqs"]
    assert (got.value, got.most_seen) == (None, 4), got
    assert "55% of the busy steps" in got.source
    data = FitData(steps=wandering, clients=CLIENTS, waiting={12: HELD_BACK})
    limits, sources = _limits(LimitsGiven(), data, launched=False, platform_kind="cpu")
    assert limits.max_num_seqs == 128 and "assumed" in sources["max_num_seqs"]


def test_a_pinned_batch_is_a_ceiling_only_if_the_scheduler_held_requests_back() -> None:
    # the clean-clone CI at load 23 (limit 128): 12 streams, the batch at 11 for 27 steps in a
    # row, 84 % of the busy steps: one request late in a starved API server, never waiting in
    # the scheduler. Read off the steps alone, the fit's limit was 11
    late = [
        *(_step(i, 1, 32, 10) for i in range(1)),
        *(_step(1 + i, 0, 0, 11) for i in range(27)),
        *(_step(28 + i, 0, 0, (3, 5)[i % 2]) for i in range(5)),
    ]
    got = infer_batch_limits(late, most_streams=12, longest_prompt=32, waiting=[0.0] * 9)
    seqs = got["max_num_seqs"]
    assert (seqs.value, seqs.most_seen) == (None, 11), seqs
    assert "at least 11" in seqs.source and "held back in 0 of 9 readings" in seqs.source
    # one reading is a token budget's single step, not a ceiling
    once = infer_batch_limits(late, most_streams=12, longest_prompt=32, waiting=[1.0, 0.0, 0.0])
    assert once["max_num_seqs"].value is None
    # the same steps with requests held back: the ceiling
    held = infer_batch_limits(late, most_streams=12, longest_prompt=32, waiting=[1.0, 1.0, 0.0])
    assert held["max_num_seqs"].value == 11
    # no readings (no /metrics): a lower bound that says why
    blind = infer_batch_limits(CAPPED, most_streams=12, longest_prompt=768)["max_num_seqs"]
    assert blind.value is None and "could not be read" in blind.source
    data = FitData(steps=late, clients=CLIENTS, waiting={12: [0.0] * 9, 4: [1.0, 1.0]})
    limits, sources = _limits(LimitsGiven(), data, launched=False, platform_kind="cpu")
    assert limits.max_num_seqs == 128 and "assumed" in sources["max_num_seqs"], sources


def test_limits_the_probes_never_reached_are_only_lower_bounds() -> None:
    steps = [_step(0, 1, 300, 0), *(_step(1 + i, 0, 0, 4) for i in range(5))]
    got = infer_batch_limits(steps, most_streams=4, longest_prompt=300)
    assert got["max_num_seqs"].value is None and got["max_num_seqs"].most_seen == 4
    assert got["max_num_batched_tokens"].value is None
    assert "at least 300" in got["max_num_batched_tokens"].source
    # one step at the top is no plateau: a prompt longer than it may simply have been alone
    one = infer_batch_limits([_step(0, 1, 700, 0)], most_streams=1, longest_prompt=768)
    assert one["max_num_batched_tokens"].value is None
    assert infer_batch_limits([], most_streams=4, longest_prompt=10) == {}


def test_an_endpoint_fit_takes_the_inferred_limits_and_says_so() -> None:
    data = FitData(steps=CAPPED, clients=CLIENTS, waiting={12: HELD_BACK})
    limits, sources = _limits(LimitsGiven(), data, launched=False, platform_kind="gpu")
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (8, 512)
    assert sources["max_num_seqs"].startswith("inferred: the step log's batch plateaued at 8")
    assert "if nothing else ran on the server" in sources["max_num_batched_tokens"]
    # given options win; a launched server's own limits are known, nothing is inferred
    given = LimitsGiven(max_num_seqs=6)
    limits, sources = _limits(given, data, launched=False, platform_kind="gpu")
    assert limits.max_num_seqs == 6 and sources["max_num_seqs"] == "option"
    limits, sources = _limits(LimitsGiven(), data, launched=True, platform_kind="cpu")
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (128, 2048)
    # unchunked prefill refuses a prompt over the budget rather than splitting it
    unchunked = LimitsGiven(chunked_prefill=False)
    limits, sources = _limits(unchunked, data, launched=False, platform_kind="gpu")
    assert limits.max_num_batched_tokens == 2048 and "assumed" in sources["max_num_batched_tokens"]


def test_without_a_plateau_the_default_stays_with_the_bound_seen() -> None:
    steps = [_step(0, 1, 300, 0), *(_step(1 + i, 0, 0, 4) for i in range(5))]
    data = FitData(steps=steps, clients=[ClientSample(300, 8, 4, 0.2, 0.02)])
    limits, sources = _limits(LimitsGiven(), data, launched=False, platform_kind="gpu")
    assert (limits.max_num_seqs, limits.max_num_batched_tokens) == (256, 2048)
    assert "assumed: not exported" in sources["max_num_seqs"]
    assert "at least 4" in sources["max_num_seqs"]
    # steps past the default: the default cannot be the limit
    many = [*(_step(i, 0, 0, 300) for i in range(3))]
    data = FitData(steps=many, clients=[ClientSample(32, 8, 300, 0.2, 0.02)])
    limits, sources = _limits(LimitsGiven(), data, launched=False, platform_kind="gpu")
    assert limits.max_num_seqs == 300 and "over the default 256" in sources["max_num_seqs"]
