"""Batch split and learning-rate policy: partitions, weights, balance, and the errors for bad values."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.decide.batching import (
    MicroBatch,
    PreserveGlobalBatch,
    ScaleLearningRate,
    StepPlan,
    micro_batch_seed,
    plan_step,
)
from slurm_elastic.errors import ConfigError


@st.composite
def preserve_policies(draw: st.DrawFn) -> PreserveGlobalBatch:
    global_batch = draw(st.integers(1, 600))
    return PreserveGlobalBatch(global_batch, draw(st.integers(1, global_batch)))


@st.composite
def scale_policies(draw: st.DrawFn) -> ScaleLearningRate:
    per_replica = draw(st.integers(1, 100))
    return ScaleLearningRate(
        per_replica,
        draw(st.integers(1, per_replica)),
        draw(st.integers(1, 16)),
        draw(st.sampled_from(["linear", "sqrt"])),
    )


worlds = st.integers(1, 40)


def check_partition(plan: StepPlan) -> None:
    """Every sample of the step is in exactly one micro-batch; weights are size / step and sum to 1."""
    covered = [0] * plan.step_samples
    for i, mb in enumerate(plan.micro_batches):
        assert mb.index == i and mb.size >= 1
        for sample in range(mb.offset, mb.offset + mb.size):
            covered[sample] += 1
        assert mb.weight == mb.size / plan.step_samples
    assert covered == [1] * plan.step_samples
    assert math.fsum(mb.weight for mb in plan.micro_batches) == pytest.approx(1.0, abs=1e-12)
    assert abs(sum(mb.weight for mb in plan.micro_batches) - 1.0) <= 1e-12


def check_assignment(plan: StepPlan) -> None:
    """Each micro-batch goes to exactly one rank, in contiguous blocks, ranks in order."""
    assert len(plan.assignment) == plan.world
    flat = [i for block in plan.assignment for i in block]
    assert flat == list(range(len(plan.micro_batches)))  # exactly once, contiguous, in rank order
    assert sum(plan.samples_of(r) for r in range(plan.world)) == plan.step_samples
    for r in range(plan.world):
        assert plan.for_rank(r) == tuple(plan.micro_batches[i] for i in plan.assignment[r])


@settings(deadline=None, max_examples=300)
@given(policy=preserve_policies(), world=worlds)
def test_preserve_global_batch_plan(policy: PreserveGlobalBatch, world: int) -> None:
    plan = plan_step(policy, world)
    assert plan.world == world and plan.step_samples == policy.global_batch and plan.lr_factor == 1.0
    check_partition(plan)
    check_assignment(plan)
    counts = [len(block) for block in plan.assignment]
    assert max(counts) - min(counts) <= 1  # balanced in micro-batches
    assert all(mb.size == policy.micro_batch for mb in plan.micro_batches[:-1])
    assert 1 <= plan.micro_batches[-1].size <= policy.micro_batch
    assert str(policy.global_batch) in plan.reason


@settings(deadline=None, max_examples=200)
@given(policy=preserve_policies(), w1=worlds, w2=worlds)
def test_preserve_global_batch_composition_does_not_depend_on_world(
    policy: PreserveGlobalBatch, w1: int, w2: int
) -> None:
    a, b = plan_step(policy, w1), plan_step(policy, w2)
    assert a.micro_batches == b.micro_batches and a.step_samples == b.step_samples


@settings(deadline=None, max_examples=300)
@given(policy=scale_policies(), world=worlds)
def test_scale_learning_rate_plan(policy: ScaleLearningRate, world: int) -> None:
    plan = plan_step(policy, world)
    assert plan.step_samples == policy.per_replica_batch * world
    check_partition(plan)
    check_assignment(plan)
    assert {plan.samples_of(r) for r in range(world)} == {policy.per_replica_batch}
    assert len({len(block) for block in plan.assignment}) == 1
    ratio = world / policy.reference_world
    expected = ratio if policy.rule == "linear" else math.sqrt(ratio)
    assert plan.lr_factor == pytest.approx(expected, rel=1e-15)


def test_uneven_preserve_split_by_hand() -> None:
    plan = plan_step(PreserveGlobalBatch(10, 3), 3)
    assert [(mb.offset, mb.size) for mb in plan.micro_batches] == [(0, 3), (3, 3), (6, 3), (9, 1)]
    assert plan.assignment == ((0,), (1,), (2, 3))
    assert [plan.samples_of(r) for r in range(3)] == [3, 3, 4]
    assert plan.micro_batches[3] == MicroBatch(3, 9, 1, 0.1)


def test_more_ranks_than_micro_batches_leaves_ranks_idle() -> None:
    plan = plan_step(PreserveGlobalBatch(4, 2), 5)
    assert sorted(len(b) for b in plan.assignment) == [0, 0, 0, 1, 1]
    assert "3 ranks idle" in plan.reason


def test_scale_learning_rate_by_hand() -> None:
    plan = plan_step(ScaleLearningRate(6, 4, reference_world=4, rule="sqrt"), 16)
    assert plan.lr_factor == 2.0 and plan.step_samples == 96
    assert plan.for_rank(1) == (MicroBatch(2, 6, 4, 4 / 96), MicroBatch(3, 10, 2, 2 / 96))
    linear = plan_step(ScaleLearningRate(6, 4, reference_world=4), 2)
    assert linear.lr_factor == 0.5 and "lr x 0.5" in linear.reason


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (lambda: PreserveGlobalBatch(0, 1), "global_batch", "0"),
        (lambda: PreserveGlobalBatch(8, -2), "micro_batch", "-2"),
        (lambda: PreserveGlobalBatch(8, 2.5), "micro_batch", "2.5"),  # type: ignore[arg-type]
        (lambda: PreserveGlobalBatch(True, 1), "global_batch", "True"),
        (lambda: PreserveGlobalBatch("8", 1), "global_batch", "'8'"),  # type: ignore[arg-type]
        (lambda: ScaleLearningRate(0, 1, 1), "per_replica_batch", "0"),
        (lambda: ScaleLearningRate(4, 0, 1), "micro_batch", "0"),
        (lambda: ScaleLearningRate(4, 1, 0), "reference_world", "0"),
    ],
)
def test_bad_values_name_the_field_and_the_value(make: object, field: str, value: str) -> None:
    with pytest.raises(ConfigError) as info:
        make()  # type: ignore[operator]
    msg = str(info.value)
    assert f"invalid {field}: {value}" in msg and ">= 1" in msg and "\n" not in msg


def test_micro_batch_larger_than_the_batch() -> None:
    with pytest.raises(ConfigError, match=r"micro_batch 9 exceeds global_batch 8"):
        PreserveGlobalBatch(8, 9)
    with pytest.raises(ConfigError, match=r"micro_batch 5 exceeds per_replica_batch 4"):
        ScaleLearningRate(4, 5, 1)


def test_unknown_lr_rule() -> None:
    with pytest.raises(ConfigError, match=r"invalid lr rule 'cubic': expected 'linear' or 'sqrt'"):
        ScaleLearningRate(4, 2, 1, rule="cubic")  # type: ignore[arg-type]


@pytest.mark.parametrize("world", [0, -3])
def test_bad_world(world: int) -> None:
    with pytest.raises(ConfigError, match=rf"invalid world size {world}: expected >= 1"):
        plan_step(PreserveGlobalBatch(8, 2), world)


@settings(deadline=None, max_examples=100)
@given(seed=st.integers(0, 2**32), step=st.integers(0, 10**6))
def test_micro_batch_seed_is_deterministic_and_distinct(seed: int, step: int) -> None:
    seeds = [micro_batch_seed(seed, step, i) for i in range(256)]
    assert seeds == [micro_batch_seed(seed, step, i) for i in range(256)]
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**63 - 1 for s in seeds)
    assert micro_batch_seed(seed, step, 0) != micro_batch_seed(seed, step + 1, 0)
    assert micro_batch_seed(seed, step, 0) != micro_batch_seed(seed + 1, step, 0)
