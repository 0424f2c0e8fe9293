"""Per-step and per-epoch hooks: when each fires, for committed, healed and freshly joined replicas."""

from __future__ import annotations

import pytest

from slurm_elastic.worker.callbacks import Callbacks

pytestmark = pytest.mark.timeout(10)


def recorder() -> tuple[Callbacks, list[tuple[str, int]]]:
    calls: list[tuple[str, int]] = []
    hooks = Callbacks(num_samples=90)
    hooks.on_step(lambda step, loss: calls.append(("step", step)))
    hooks.on_epoch(lambda epoch: calls.append(("epoch", epoch)))
    return hooks, calls


def test_step_hooks_then_the_hooks_of_the_epoch_the_step_ended() -> None:
    hooks, calls = recorder()
    hooks.settled(0)  # the first generation
    for step in range(1, 9):
        hooks.committed(step, 0.5, step * 12)
    assert calls[-2:] == [("step", 8), ("epoch", 0)], "step 8 (cursor 96) ends epoch 0"
    assert [c for c in calls if c[0] == "epoch"] == [("epoch", 0)]


def test_a_replica_that_joins_mid_run_counts_from_where_it_starts() -> None:
    hooks, calls = recorder()
    hooks.settled(200)  # joined in epoch 2
    hooks.committed(18, 0.5, 216)
    assert calls == [("step", 18)]
    hooks.committed(23, 0.5, 276)
    assert calls[-1] == ("epoch", 2)


def test_a_replica_healed_past_an_epoch_end_runs_that_epoch_s_hooks() -> None:
    hooks, calls = recorder()
    hooks.settled(84)
    hooks.settled(96)  # a peer committed step 8 and this rank received it in a recovery
    assert calls == [("epoch", 0)]
    hooks.settled(96)
    assert calls == [("epoch", 0)], "once"
