"""torch.distributed works inside the job: the default process group is the current generation's, so a
script's own helpers (`dist.get_rank()` choosing who saves, `dist.all_reduce` of its own metric,
`dist.get_world_size()`) follow every change of membership, and its own `torch.save` checkpoint matches an
uninterrupted run's (tests/integration/torchworld_script.py)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import MembershipChange, of_kind
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("torchworld_script.py")
STEPS = 20


def config(out: Path, nodes: int) -> JobConfig:
    return JobConfig(
        nodes=nodes, heartbeat_interval_s=0.2, lease_timeout_s=3.0, max_restarts=0, progress_interval_s=1000.0,
        reduce_dtype="float64",
    )  # fmt: skip


def command(save: Path, gates: str = "") -> list[str]:
    return [sys.executable, str(SCRIPT), "--steps", str(STEPS), "--save", str(save), "--gates", gates]


def logs(out: Path) -> str:
    return "".join(p.read_text() for p in (out / "logs").glob("*.log"))


def run(out: Path, argv: list[str], nodes: int) -> None:
    job = LocalJob(argv, config(out, nodes), log_dir=out / "logs", root=out)
    job.start()
    try:
        result = job.wait(timeout=240)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}\n{result.failure_traceback or ''}"


def kill_join(out: Path, argv: Callable[[str], list[str]], *, kill_at: int, join_at: int, node: str) -> None:
    """Run `argv(gates)` on 3 nodes: `node` killed while every rank waits before step `kill_at` (between
    steps, so never inside the script's own collective), a new node joining before step `join_at`."""
    kill, join = out / "kill", out / "join"
    job = LocalJob(argv(f"{kill_at}:{kill},{join_at}:{join}"), config(out, 3), log_dir=out / "logs", root=out)
    job.start()
    try:
        # Every rank at the gate, past the script's own collectives of the step before (a commit is seen
        # before its on_step hooks have run).
        job.wait_until(lambda v: logs(out).count(f"at gate {kill_at}\n") == 3, timeout=180)
        job.kill_node(node)
        job.wait_until(lambda v: v.world == 2, timeout=60)
        kill.touch()
        job.add_node()
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().pending), timeout=120)
        join.touch()
        result = job.wait(timeout=240)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}\n{result.failure_traceback or ''}"
    worlds = [e.world for e in of_kind(read_events(job.dir / "events.jsonl"), MembershipChange)]
    assert worlds == [3, 2, 3], worlds


def test_the_default_group_follows_a_kill_and_a_join_and_the_scripts_own_checkpoint_matches(tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    run(ref, command(ref / "own.pt"), nodes=3)

    out = tmp_path / "kill-join"
    kill_join(out, lambda gates: command(out / "own.pt", gates), kill_at=8, join_at=12, node="local2")

    lines = [line.split() for line in logs(out).splitlines() if line.startswith("world ")]
    worlds = set()
    for _, step, rank, world, dist_rank, dist_world, metric in lines:
        assert (rank, world) == (dist_rank, dist_world), f"step {step}: the job's {rank}/{world}, torch's"
        assert float(metric) == float(world), f"step {step}: the script's all_reduce summed over {metric} ranks"
        worlds.add(int(world))
    assert worlds == {2, 3}, "the default group was the generation's before the kill, after it, and after the join"
    assert logs(out).count("after the loop: default group") == 3

    got, want = torch.load(out / "own.pt"), torch.load(ref / "own.pt")
    assert got["step"] == want["step"] == STEPS
    assert max_param_rel_diff(got["model"], want["model"]) <= 1e-6


FSDP_SCRIPT = Path(__file__).with_name("torchworld_fsdp_script.py")


def fsdp_command(out: Path, gates: str = "", *more: str, steps: int = 12) -> list[str]:
    args = ["--steps", str(steps), "--dcp", str(out / "dcp"), "--full", str(out / "full.pt"), "--gates", gates]
    return [sys.executable, str(FSDP_SCRIPT), *args, *more]


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")  # DCP loads in one process
def test_an_fsdp2_scripts_own_dcp_checkpoint_is_written_after_a_kill_and_a_join_and_resumes(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    out = tmp_path / "fsdp"
    kill_join(out, lambda gates: fsdp_command(out, gates), kill_at=5, join_at=8, node="local3")
    assert sorted(line for line in logs(out).splitlines() if line.startswith("saved by")) == [
        "saved by rank 0 of 3", "saved by rank 1 of 3", "saved by rank 2 of 3",
    ]  # fmt: skip
    full = torch.load(out / "full.pt")
    loaded = {"model": {name: torch.zeros_like(t) for name, t in full.items()}}
    dcp.load(loaded, checkpoint_id=out / "dcp", no_dist=True)  # the shards of every rank, read back whole
    assert all(torch.equal(loaded["model"][name], full[name]) for name in full)

    # The script resumes from its own checkpoint (model and AdamW moments), on 2 ranks, as an uninterrupted run.
    resumed, reference = tmp_path / "resumed", tmp_path / "reference"
    run(resumed, fsdp_command(resumed, "", "--load", str(out / "dcp"), "--start-step", "12", steps=18), nodes=2)
    run(reference, fsdp_command(reference, steps=18), nodes=3)
    got, want = torch.load(resumed / "full.pt"), torch.load(reference / "full.pt")
    assert max_param_rel_diff(got, want) <= tolerance("float32", 18)
