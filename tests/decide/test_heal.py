"""What a sharded generation resumes from (`decide.heal.plan_heal`): the target step, who rolls forward,
which copies may serve; and at a fresh start, which members already hold the initial state."""

from __future__ import annotations

import itertools

import pytest

from slurm_elastic.decide.heal import ShardReport, plan_heal
from slurm_elastic.decide.reshard import Holding

pytestmark = pytest.mark.timeout(60)


def fresh(rank: int, digest: int, *, world: int = 1, index: int = 0, ok: bool = True) -> ShardReport:
    return ShardReport(rank, -1, False, world, index, -1, ok, True, digest, 0)


def held(
    rank: int, step: int, index: int, mirror: int, digests: tuple[int, int], prepared: bool = False
) -> ShardReport:
    return ShardReport(rank, step, prepared, 4, index, mirror, True, True, *digests, 2.5, 1.0)


def test_a_fresh_start_is_held_by_every_member_with_the_same_initial_model() -> None:
    plan = plan_heal([fresh(2, 7), fresh(0, 7), fresh(1, 9), fresh(3, 7)])
    assert plan.fresh and plan.target_step == 0 and plan.source == 0
    assert plan.holdings == (Holding("0", 1, 0), Holding("2", 1, 0), Holding("3", 1, 0))
    assert "3 members hold the same and take their rows locally" in plan.reason


def test_a_fresh_start_with_different_initial_models_is_held_by_the_lowest_rank_only() -> None:
    for digests in itertools.permutations([1, 2, 3]):
        plan = plan_heal([fresh(r, d) for r, d in enumerate(digests)])
        assert plan.holdings == (Holding("0", 1, 0),) and plan.source == 0
        assert plan.reason == "fresh start: every member takes its rows of rank 0's initial state"


def test_a_fresh_member_cut_for_another_layout_or_failing_its_check_holds_nothing() -> None:
    # A member that formed an earlier generation but never committed holds only its rows of that layout.
    plan = plan_heal([fresh(0, 7), fresh(1, 7, world=4, index=1), fresh(2, 7, ok=False)])
    assert plan.holdings == (Holding("0", 1, 0),)


def test_the_newest_step_wins_and_a_prepared_member_one_behind_rolls_forward() -> None:
    reports = [
        held(0, 5, 0, 3, (10, 13)),
        held(1, 4, 1, 0, (11, 10), prepared=True),  # missed step 5's commit, holds its gradients
        held(2, 4, 2, 1, (12, 11)),  # one behind, not prepared: its copies are not used
        held(3, 5, 3, 2, (13, 12)),
    ]
    plan = plan_heal(reports)
    assert (plan.target_step, plan.fresh, plan.source, plan.roll_forward) == (5, False, 0, (1,))
    assert (plan.norm2, plan.lr_factor) == (2.5, 1.0)
    assert {(h.holder, h.index) for h in plan.holdings} == {("0", 0), ("0", 3), ("1", 1), ("1", 0), ("3", 3), ("3", 2)}


def test_copies_of_one_shard_that_disagree_are_both_refused() -> None:
    reports = [held(0, 5, 0, 1, (10, 99)), held(1, 5, 1, 0, (11, 10))]
    plan = plan_heal(reports)
    assert Holding("0", 4, 1) not in plan.holdings and Holding("1", 4, 1) not in plan.holdings
    assert Holding("0", 4, 0) in plan.holdings and Holding("1", 4, 0) in plan.holdings
    assert any("the copies of shard 1/4 disagree at step 5" in line for line in plan.refused)


def test_no_reports_is_an_error() -> None:
    with pytest.raises(ValueError, match="at least one member"):
        plan_heal([])
