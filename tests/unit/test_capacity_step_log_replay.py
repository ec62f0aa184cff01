"""The scheduler simulation against a step log recorded from the real vLLM (0.32, CPU build):
``--max-num-seqs 4 --max-num-batched-tokens 256``, six requests of exactly 300 prompt tokens
(token ids, no prefix shared) and 6 output tokens sent at once. vLLM's own log of those 15 steps
is tests/data/vllm_0.32_step_log_burst.txt; the simulator must schedule the same work in each
step: chunked prefill sharing the budget with decodes, max_num_seqs holding two requests back
until the first ones finish."""

from __future__ import annotations

from pathlib import Path

from phaseprobe.analysis.capacity_model.simulate import simulate
from phaseprobe.analysis.capacity_model.step_cost import SchedulerLimits, StepCost
from phaseprobe.analysis.capacity_model.workload import SimRequest
from phaseprobe.sources.vllm.step_log import parse_step_lines

LOG = Path(__file__).parent.parent / "data" / "vllm_0.32_step_log_burst.txt"


def test_the_simulated_schedule_is_vllms_step_for_step() -> None:
    recorded = list(parse_step_lines(LOG.read_text().splitlines(), str(LOG)))
    assert len(recorded) == 15
    # the recorded work (the log's token counts, its decode requests = decode tokens here)
    logged = [(s.prefill_tokens, s.decode_requests) for s in recorded]
    assert all(s.decode_tokens == s.decode_requests for s in recorded)
    run = simulate(
        [SimRequest(0.0, 300, 6) for _ in range(6)],
        StepCost(0.01, 1e-4, 1e-3),  # any cost: the schedule does not depend on it here
        SchedulerLimits(max_num_seqs=4, max_num_batched_tokens=256, block_size=128),
        record_steps=True,
    )
    assert list(run.step_work) == logged
    assert run.limit_hits["max_num_seqs"] > 0 and run.limit_hits["token_budget"] > 0
