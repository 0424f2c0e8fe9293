"""The tutorial-style DDP Trainer (examples/ddp_trainer_plain.py) and its elastic version: the diff stays
small, and the elastic one, with a node killed and another joining, ends with the uninterrupted run's model
(exact mode), every sample used exactly once, and its snapshots taken where the epochs end."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import MembershipChange, of_kind
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff
from slurm_elastic.showcase.scenario import run_scenario
from slurm_elastic.worker import read_model_state
from slurm_elastic.worker.checkpoints.checkpoint import read_checkpoint

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAIN, ELASTIC = EXAMPLES / "ddp_trainer_plain.py", EXAMPLES / "ddp_trainer_elastic.py"
GATED = Path(__file__).with_name("ddp_trainer_gated.py")
SAMPLES, BATCH, NODES, EPOCHS = 480, 16, 3, 3  # global batch 16 x 3 = 48: 10 steps an epoch, 30 in all


def test_the_elastic_trainer_differs_from_the_plain_one_by_at_most_20_lines() -> None:
    diff = subprocess.run(["diff", str(PLAIN), str(ELASTIC)], capture_output=True, text=True, check=False).stdout
    changed = [line for line in diff.splitlines() if line[:1] in "<>"]
    assert len(changed) <= 20, "\n".join(changed)


def config(out: Path) -> JobConfig:
    return JobConfig(
        nodes=NODES, heartbeat_interval_s=0.2, lease_timeout_s=3.0, max_restarts=0, progress_interval_s=1000.0,
        ledger_dir=out / "ledger", reduce_dtype="float64",
    )  # fmt: skip


def command(script: Path, snapshot: Path) -> list[str]:
    args = ["--epochs", str(EPOCHS), "--save-every", "1", "--snapshot", str(snapshot)]
    return [sys.executable, str(script), *args, "--samples", str(SAMPLES), "--batch-size", str(BATCH)]


def test_a_kill_and_a_join_end_with_the_uninterrupted_model(tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    reference = run_scenario(command(ELASTIC, ref / "snapshot.pt"), config(ref), root=ref, timeout_s=240)
    assert reference.result.ok, reference.result.reason

    out = tmp_path / "kill-join"
    gate = out / "gate"
    env = {"SE_TEST_GATES": f"12:{gate}"}
    job = LocalJob(command(GATED, out / "snapshot.pt"), config(out), extra_env=env, log_dir=out / "logs", root=out)
    job.start()
    try:
        job.wait_until(lambda v: v.last_step >= 8, timeout=180)
        job.kill_node("local2")  # mid-epoch 0 (10 steps an epoch)
        job.wait_until(lambda v: v.world == 2, timeout=60)
        job.add_node()
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().pending), timeout=120)
        gate.touch()  # the members run on; the joiner joins at the next step boundary
        result = job.wait(timeout=180)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}\n{result.failure_traceback or ''}"
    events = read_events(job.dir / "events.jsonl")
    worlds = [e.world for e in of_kind(events, MembershipChange)]
    assert worlds == [3, 2, 3], worlds
    ledger = analyze(out / "ledger")
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (30, 0, 0)
    got, want = read_model_state(out / "snapshot.pt"), read_model_state(ref / "snapshot.pt")
    assert max_param_rel_diff(got, want) <= 1e-6
    assert read_checkpoint(out / "snapshot.pt")[0] == 30
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert "epoch 2 | batches" in logs and "training snapshot saved" in logs
