"""The plain FSDP2 example (examples/train_fsdp.py) and its elastic version: the diff stays small, and the
elastic one, with a node killed and another joining, ends with the uninterrupted run's model (within
float32's tolerance: FSDP2 sums in float32), every sample used exactly once."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import MembershipChange, of_kind
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff, tolerance
from slurm_elastic.showcase.scenario import run_scenario

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAIN, ELASTIC = EXAMPLES / "train_fsdp.py", EXAMPLES / "train_fsdp_elastic.py"
GATED = Path(__file__).with_name("fsdp_example_gated.py")
SAMPLES, BATCH, NODES = 192, 4, 3  # global batch 4 x 3 = 12: 16 steps in one epoch
STEPS = SAMPLES // (BATCH * NODES)


def test_the_elastic_fsdp_script_differs_from_the_plain_one_by_at_most_20_lines() -> None:
    diff = subprocess.run(["diff", str(PLAIN), str(ELASTIC)], capture_output=True, text=True, check=False).stdout
    changed = [line for line in diff.splitlines() if line[:1] in "<>"]
    assert 0 < len(changed) <= 20, "\n".join(changed)


def config(out: Path) -> JobConfig:
    return JobConfig(
        nodes=NODES, heartbeat_interval_s=0.2, lease_timeout_s=3.0, max_restarts=0, progress_interval_s=1000.0,
        ledger_dir=out / "ledger",
    )  # fmt: skip


def command(script: Path, out: Path) -> list[str]:
    args = ["--epochs", "1", "--samples", str(SAMPLES), "--batch-size", str(BATCH), "--dim", "32"]
    return [sys.executable, str(script), *args, "--save", str(out / "model.pt")]


def test_a_kill_and_a_join_end_with_the_uninterrupted_model(tmp_path: Path) -> None:
    ref = tmp_path / "reference"
    reference = run_scenario(command(ELASTIC, ref), config(ref), root=ref, timeout_s=200)
    assert reference.result.ok, reference.result.reason

    out = tmp_path / "kill-join"
    gate = out / "gate"
    env = {"SE_TEST_GATES": f"10:{gate}"}
    job = LocalJob(command(GATED, out), config(out), extra_env=env, log_dir=out / "logs", root=out)
    job.start()
    try:
        job.wait_until(lambda v: v.last_step >= 4, timeout=150)
        job.kill_node("local2")
        job.wait_until(lambda v: v.world == 2, timeout=60)
        job.add_node()
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().pending), timeout=120)
        gate.touch()  # the members run on; the joiner takes its shards from peers at the next boundary
        result = job.wait(timeout=150)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}\n{result.failure_traceback or ''}"
    events = read_events(job.dir / "events.jsonl")
    assert [e.world for e in of_kind(events, MembershipChange)] == [3, 2, 3]
    ledger = analyze(out / "ledger")
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (STEPS, 0, 0)
    got, want = torch.load(out / "model.pt"), torch.load(ref / "model.pt")
    assert max_param_rel_diff(got, want) <= tolerance("float32", STEPS)
    logs = "".join(p.read_text() for p in (out / "logs").glob("*.log"))
    assert "epoch 0 | loss" in logs
