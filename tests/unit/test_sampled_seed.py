"""The seed of a sampled job's micro-batch (worker.input.sampled) and its batch arithmetic."""

from __future__ import annotations

import pytest

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.input.sampled import SampledBatches, batch_seed, check_multiple


def test_the_seed_is_a_pure_function_of_the_run_seed_and_the_place() -> None:
    seeds = {batch_seed(s, p) for s in range(4) for p in range(0, 4000, 2)}
    assert len(seeds) == 4 * 2000, "no two places or run seeds share a seed"
    assert all(0 <= s < 2**64 for s in seeds), "torch.Generator.manual_seed takes it"
    # A resumed run must draw what the run before it drew: the mixing is fixed by numpy's SeedSequence.
    assert batch_seed(0, 0) == 15793235383387715774


CASES = [(4, {"global_batch": 12}, True), (4, {"global_batch": 10}, False), (2, {"per_replica_batch": 3}, False),
         (2, {"global_batch": None}, True)]  # fmt: skip


@pytest.mark.parametrize(("micro", "batches", "ok"), CASES)
def test_a_step_is_cut_into_whole_calls(micro: int, batches: dict[str, int | None], ok: bool) -> None:
    if ok:
        check_multiple(micro, **batches)
    else:
        with pytest.raises(ConfigError, match=f"is not a multiple of micro_batch {micro}"):
            check_multiple(micro, **batches)


def test_a_part_of_a_micro_batch_is_never_drawn() -> None:
    draw = SampledBatches(lambda g: int(g.initial_seed()), seed=0, micro_batch=4)
    assert draw(8, 4) == batch_seed(0, 8)
    for start, size in ((8, 2), (6, 4)):
        with pytest.raises(ConfigError, match="not one micro-batch of 4"):
            draw(start, size)
