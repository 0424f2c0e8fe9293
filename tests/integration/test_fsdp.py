"""FSDP2 (`fully_shard`) jobs as separate processes on gloo, with SIGKILLed nodes in every phase of a step, at
world sizes that do not divide the batch or the shards evenly (4 -> 3 -> 4, 5 -> 3 -> 2), two nodes at once,
a join, a drain, a corrupted holder, and both holders of a shard lost (the checkpoint fallback). Each ends
with the uninterrupted run's model within float32's tolerance, every sample used exactly once.

Few runs, each with several faults, to keep the suite fast; the in-thread tests (test_fsdp_threads.py)
cover each case on its own."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import CheckpointFallback, GenerationReady, MembershipChange, StateLost, of_kind
from slurm_elastic.faults import FaultPlan
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.ledger import LedgerReport, analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.showcase.scenario import Action, ScenarioResult, run_scenario

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

SCRIPT = Path(__file__).with_name("fsdp_script.py")
STEPS, GLOBAL_BATCH = 10, 12  # 6 micro-batches of 2: uneven over 4 and 5 ranks (padding passes)


def config(out: Path, nodes: int, **settings: Any) -> JobConfig:
    return JobConfig(
        nodes=nodes, heartbeat_interval_s=0.2, lease_timeout_s=3.0, hang_timeout_s=5.0, progress_interval_s=1000.0,
        ledger_dir=out / "ledger", **{"max_restarts": 0, **settings},
    )  # fmt: skip


def command(out: Path, pause: float = 0.0, shard_group: int | None = None) -> list[str]:
    args = ["--steps", str(STEPS), "--global-batch", str(GLOBAL_BATCH), "--pause", str(pause)]
    args += ["--shard-group", str(shard_group)] if shard_group is not None else []
    return [sys.executable, str(SCRIPT), *args, "--save", str(out / "model.pt")]


def run(
    tmp: Path,
    name: str,
    nodes: int,
    *,
    pause: float = 0.0,
    settings: Any = None,
    shard_group: int | None = None,
    **kw: Any,
) -> ScenarioResult:
    out = tmp / name
    cfg = config(out, nodes, **(settings or {}))
    cmd = command(out, pause, shard_group)
    res = run_scenario(cmd, cfg, root=out, timeout_s=150, log_dir=out / "logs", **kw)
    res.model_path = out / "model.pt"  # type: ignore[attr-defined]
    return res


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    res = run(tmp_path_factory.mktemp("fsdp"), "reference", 4)
    assert res.result.ok, res.result.reason
    return torch.load(res.model_path)  # type: ignore[attr-defined,no-any-return]


def assert_model(path: Path, reference: dict[str, torch.Tensor]) -> None:
    got = torch.load(path)
    assert got.keys() == reference.keys()
    assert max_param_rel_diff(got, reference) <= tolerance("float32", STEPS)


def assert_ledger(ledger: LedgerReport | None) -> None:
    assert ledger is not None
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)
    assert ledger.samples_consumed == STEPS * GLOBAL_BATCH


def assert_reference(res: ScenarioResult, reference: dict[str, torch.Tensor]) -> None:
    """The job finished with the uninterrupted run's model, every sample used exactly once."""
    assert res.result.ok, f"{res.result.phase}: {res.result.reason}\n{res.result.failure_traceback or ''}"
    assert_model(res.model_path, reference)  # type: ignore[attr-defined]
    assert_ledger(res.ledger)


def run_rejoin(
    tmp_path: Path, plan: FaultPlan, settings: dict[str, Any], shard_group: int | None = None
) -> tuple[Any, list[dict[str, Any]]]:
    """A 4-node job whose restarted worker (4 -> 3) is let in before step 5 (3 -> 4); (result, events)."""
    gate = tmp_path / "gate"
    job = LocalJob(
        command(tmp_path, shard_group=shard_group), config(tmp_path, 4, **settings), faults=plan, root=tmp_path,
        log_dir=tmp_path / "logs", extra_env={"SE_TEST_GATE": f"5:{gate}"},
    )  # fmt: skip
    job.start()
    try:
        job.wait_until(lambda v: v.world == 3, timeout=120)
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().pending), timeout=120)
        gate.touch()
        result = job.wait(timeout=150)
    finally:
        job.stop()
    events = read_events(job.dir / "events.jsonl")
    assert result.ok, f"{result.phase}: {result.reason}\n{result.failure_traceback or ''}"
    return result, events


def test_kills_in_forward_reduce_scatter_optimizer_and_commit_a_rejoin_and_a_corrupted_holder(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    # 4 -> 3: local2 killed in the forward of step 2; restarted, it joins before step 5 and takes its shards
    # from peers (3 -> 4). Then kills in FSDP2's reduce-scatter (step 6), the optimizer (step 8) and the
    # commit (step 9, the rejoined local2). When the optimizer kill's generation forms, bits of local1's
    # own shard flip (after its digest was taken at the last commit): refused, its rows come from its mirror.
    plan = (
        FaultPlan()
        .kill("local2", step=2, phase="forward")
        .kill("local3", step=6, phase="reduce_scatter")
        .kill("local4", step=8, phase="optimizer")
        .corrupt("local1", step=8)
        .add(node="local2", step=9, phase="commit", action="kill", incarnation=1)
    )
    _, events = run_rejoin(tmp_path, plan, {"max_restarts": 1})
    assert_model(tmp_path / "model.pt", reference)
    assert_ledger(analyze(tmp_path / "ledger"))
    worlds = [e.world for e in of_kind(events, MembershipChange)]
    assert worlds[:6] == [4, 3, 4, 3, 2, 1], worlds
    ready = of_kind(events, GenerationReady)
    joined = [e for e in ready if e.cause == "join"]
    assert joined and joined[0].bytes > 0 and joined[0].strategy == "fsdp2" and joined[0].resume_step in (4, 5)
    assert all(e.lost_committed_steps == 0 for e in ready), ready
    refused = [e for e in events if e["event"] == "shard_refused"]
    assert refused and "rank 0's own copy" in refused[0]["detail"] and "fails its digest check" in refused[0]["detail"]


def test_two_nodes_at_once_sharing_no_shard_then_a_drain(tmp_path: Path, reference: dict[str, torch.Tensor]) -> None:
    # Five ranks, each mirroring the previous rank's shard: local2 and local4 hold no shard in common (5 -> 3);
    # then local5 is drained at a step boundary (3 -> 2).
    plan = FaultPlan().kill_node("local2", step=3, phase="backward").kill_node("local4", step=3, phase="backward")
    res = run(tmp_path, "two-at-once", 5, faults=plan, actions=[Action(5, "drain_node", "local5")], pause=0.1)
    assert_reference(res, reference)
    ready = res.of(GenerationReady)  # the two losses may be seen one after the other (5 -> 4 -> 3)
    assert [e.world for e in ready] == [5, 3, 2], ready
    assert all(e.lost_committed_steps == 0 and e.strategy == "fsdp2" for e in ready), ready
    assert ready[-1].cause == "drain"


def test_both_holders_of_a_shard_lost_resume_from_the_sharded_checkpoint(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    # local2 holds shard 1 and local3 mirrors it: both gone, no peer holds shard 1. One event says so, and
    # every worker restarts from the newest sharded checkpoint (step 4, written by 4 ranks, read by 2).
    plan = FaultPlan().kill_node("local2", step=6, phase="backward").kill_node("local3", step=6, phase="backward")
    settings = {"checkpoint_dir": tmp_path / "ckpt", "checkpoint_every": 4}
    res = run(tmp_path, "fallback", 4, faults=plan, settings=settings)
    assert_reference(res, reference)
    assert len(res.events_of("state_lost")) >= 1 and "no live holder" in res.events_of("state_lost")[0]["detail"]
    (fallback,) = res.of(CheckpointFallback)
    assert fallback.resume_step == 4 and fallback.last_committed_step == 5


def test_hsdp_loses_both_holders_of_a_shard_and_resumes_from_the_first_replica_groups_checkpoint(
    tmp_path: Path, reference: dict[str, torch.Tensor]
) -> None:
    # Shard groups of 2 over 4 ranks. local3 is killed in a reduce-scatter of step 3 (4 -> 3: one shard
    # group of 3, mirrored); it rejoins before step 5 (3 -> 4: replica groups again), as rank 3 (survivors
    # keep their order): shard groups (local1, local2) and (local4, local3), so shard 1 is held by local2 and
    # local3. The checkpoint of step 6 is written by the first replica group alone (2 shards). local2 and
    # the rejoined local3 are then killed in step 8's backward: shard 1 has no holder left, and the job
    # resumes from that checkpoint, read by the 2 ranks left.
    plan = (
        FaultPlan()
        .kill("local3", step=3, phase="reduce_scatter")
        .kill_node("local2", step=8, phase="backward")
        .add(node="local3", step=8, phase="backward", action="kill_node", incarnation=1)
    )
    settings = {"checkpoint_dir": tmp_path / "ckpt", "checkpoint_every": 6, "max_restarts": 1}
    _, events = run_rejoin(tmp_path, plan, settings, shard_group=2)
    assert_model(tmp_path / "model.pt", reference)
    assert_ledger(analyze(tmp_path / "ledger"))
    layouts = [(e.world, e.shard_group, e.mirrors) for e in of_kind(events, GenerationReady)]
    assert layouts[:3] == [(4, 2, False), (3, 3, True), (4, 2, False)], layouts
    assert layouts[-1] == (2, 2, True), layouts
    assert sorted(p.name for p in (tmp_path / "ckpt" / "step-000000006").iterdir()) == ["rank-00000", "rank-00001"]
    lost = of_kind(events, StateLost)
    assert lost and "no live holder" in lost[0].detail, lost
    (fallback,) = of_kind(events, CheckpointFallback)
    assert fallback.resume_step == 6, fallback
