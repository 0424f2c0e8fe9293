"""Epoch arithmetic on the committed cursor, loop goals, and the worker reducer's end of an epoch."""

from __future__ import annotations

import pytest

from slurm_elastic.decide import worker as w
from slurm_elastic.decide.epochs import Goal, epoch_end, epoch_of, epochs_ended, positive_int
from slurm_elastic.errors import ConfigError

pytestmark = pytest.mark.timeout(10)


def test_an_epoch_ends_with_the_first_step_whose_cursor_reaches_its_end() -> None:
    n = 90  # 12 samples a step: step 8 takes the cursor from 84 to 96, past 90
    assert list(epochs_ended(84, 96, n)) == [0]
    assert list(epochs_ended(96, 108, n)) == []
    assert list(epochs_ended(168, 180, n)) == [1], "reaching the end exactly ends the epoch"
    assert list(epochs_ended(180, 192, n)) == [], "... and the next step does not end it again"
    assert list(epochs_ended(0, 200, 50)) == [0, 1, 2, 3], "a step longer than an epoch ends several"
    assert epoch_of(96, n) == 1 and epoch_of(89, n) == 0 and epoch_end(1, n) == 180


@pytest.mark.parametrize(
    ("goal", "step", "cursor", "reached", "left"),
    [
        (Goal(steps=10), 9, 0, False, 1),
        (Goal(steps=10), 10, 0, True, 0),
        (Goal(samples=180), 8, 96, False, 7),  # ceil((180 - 96) / 12)
        (Goal(samples=180), 15, 180, True, 0),
        (Goal(samples=180), 16, 192, True, 0),
    ],
)
def test_goals(goal: Goal, step: int, cursor: int, reached: bool, left: int) -> None:
    assert goal.reached(step, cursor) is reached
    assert goal.steps_left(step, cursor, 12) == left


def test_a_goal_needs_exactly_one_bound() -> None:
    with pytest.raises(ConfigError, match="exactly one"):
        Goal()
    with pytest.raises(ConfigError, match="exactly one"):
        Goal(steps=1, samples=2)


@pytest.mark.parametrize("value", [0, -1, 2.0, True, "3", None])
def test_positive_int_names_the_value(value: object) -> None:
    with pytest.raises(ConfigError, match=rf"invalid total_epochs {value!r}: expected an integer >= 1"):
        positive_int("total_epochs", value)


def test_the_reducer_ends_an_epoch_loop_at_its_cursor_goal() -> None:
    running = w.Situation(7, None, "committed", False, False, cursor=84, cursor_goal=90)
    assert w.next_move(running) == w.RunStep("step 8 (cursor 84 of 90)")
    done = w.Situation(8, None, "committed", False, True, cursor=96, cursor_goal=90)
    assert isinstance(w.next_move(done), w.Finish), "the end of an epoch wins over a boundary (taken next)"
    superseded = w.Situation(8, None, "committed", True, False, cursor=96, cursor_goal=90)
    assert isinstance(w.next_move(superseded), w.Recover)
