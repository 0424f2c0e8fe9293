"""The `chaos --slurm` runner's reading of a job: the step it holds, and what a failed run prints of its
output for a CI log that keeps nothing else."""

from __future__ import annotations

from pathlib import Path

from slurm_elastic.eventtypes import Commit, GenerationReady
from slurm_elastic.showcase.chaos_slurm import _last_lines, held_step


def test_the_end_of_every_output_file_is_shown_shortened(tmp_path: Path) -> None:
    (tmp_path / "core-7.out").write_text("".join(f"event {i}\n" for i in range(100)))
    (tmp_path / "satellite-8.out").write_text("x" * 1000 + "\n")
    (tmp_path / "model.pt").write_text("not output\n")
    lines = _last_lines(tmp_path, count=3, width=10)
    assert lines == [
        "chaos --slurm: core-7.out, last 3 lines:",
        "  event 97",
        "  event 98",
        "  event 99",
        "chaos --slurm: satellite-8.out, last 1 lines:",
        "  " + "x" * 10,
    ]


def test_no_output_yet_shows_nothing(tmp_path: Path) -> None:
    assert _last_lines(tmp_path) == []


def commit(step: int) -> dict[str, object]:
    return {"event": "commit", **Commit(step, 1, 4, 0.5, 0.0).fields()}


def ready(generation: int, resume_step: int) -> dict[str, object]:
    fields = GenerationReady("n1:0", generation, "x", 3, 0.1, 0.1, 0.2, resume_step, (), (), 0, "in sync").fields()
    return {"event": "generation_ready", **fields}


def test_a_step_taken_from_a_peer_is_held_though_rank_0_never_committed_it() -> None:
    # Seen in CI: a worker killed between the ranks' commits of step 39; rank 0 took step 39 from a peer
    # as generation 8 formed, and the runner, reading commits alone, waited for step 39 until its timeout.
    events = [ready(1, 0), commit(37), commit(38), {"event": "membership_change", "generation": 8}, ready(8, 39)]
    assert held_step(events) == 39


def test_the_newest_of_commits_and_resumed_steps_counts() -> None:
    assert held_step([]) == 0
    assert held_step([ready(1, 0)]) == 0
    assert held_step([ready(1, 0), commit(1), commit(2)]) == 2
    # a generation resumed from an older checkpoint does not take back what was seen committed
    assert held_step([commit(1), commit(7), ready(3, 5)]) == 7
    assert held_step([commit(7), ready(3, 5), commit(6)]) == 7
