"""The nanoGPT-style script (examples/gpt_plain.py: its own random-window sampling, gradient accumulation, a
GradScaler, its own checkpoints, a `while True` loop that breaks) and its elastic version: the diff stays
within 20 lines; with a node killed and another joining, the elastic one's checkpoint equals the
uninterrupted run's (exact mode) and the ledger shows every micro-batch once; resumed from its own
checkpoint at another world size it reaches the same model; its evaluation-only pass ends the job."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import JobConfig
from slurm_elastic.events import read_events
from slurm_elastic.eventtypes import JobFinished, MembershipChange, of_kind
from slurm_elastic.launch.local import LocalJob
from slurm_elastic.ledger import analyze
from slurm_elastic.showcase.metrics import max_param_rel_diff
from slurm_elastic.showcase.scenario import ScenarioResult, run_scenario

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(420)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
PLAIN, ELASTIC = EXAMPLES / "gpt_plain.py", EXAMPLES / "gpt_elastic.py"
GATED = Path(__file__).with_name("gpt_gated.py")
ITERS = 20  # 21 steps (iterations 0 to 20); its own checkpoint at iterations 10 and 20, before their steps


def test_the_elastic_script_differs_from_the_plain_one_by_at_most_20_lines() -> None:
    diff = subprocess.run(["diff", str(PLAIN), str(ELASTIC)], capture_output=True, text=True, check=False).stdout
    changed = [line for line in diff.splitlines() if line[:1] in "<>"]
    assert len(changed) <= 20, "\n".join(changed)


def config(out: Path, nodes: int) -> JobConfig:
    return JobConfig(
        nodes=nodes, heartbeat_interval_s=0.2, lease_timeout_s=3.0, max_restarts=0, progress_interval_s=1000.0,
        ledger_dir=out / "ledger", reduce_dtype="float64",
    )  # fmt: skip


def command(script: Path, corpus: Path, out: Path, *extra: str, iters: int = ITERS) -> list[str]:
    args = ["--data", str(corpus), "--out-dir", str(out / "own"), "--max-iters", str(iters), "--eval-interval", "10"]
    args += ["--eval-iters", "2", "--always-save-checkpoint", "--dtype", "float16"]  # float16: with its GradScaler
    return [sys.executable, str(script), *args, *extra]


def run(cmd: list[str], out: Path, nodes: int) -> ScenarioResult:
    res = run_scenario(cmd, config(out, nodes), root=out, timeout_s=240, log_dir=out / "logs")
    assert res.result.ok, f"{res.result.reason}\n{res.result.failure_traceback or ''}"
    return res


def own_checkpoint(out: Path) -> dict[str, object]:
    return torch.load(out / "own" / "ckpt.pt", weights_only=True)


@pytest.fixture(scope="module")
def reference(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    out = tmp_path_factory.mktemp("gpt-reference")
    run(command(ELASTIC, corpus, out), out, nodes=3)
    return own_checkpoint(out)


def same_model(got: dict[str, object], want: dict[str, object]) -> bool:
    assert got["iter_num"] == want["iter_num"] == ITERS
    return max_param_rel_diff(got["model"], want["model"]) <= 1e-6  # type: ignore[arg-type]


def test_a_kill_and_a_join_end_with_the_uninterrupted_model(
    corpus: Path, reference: dict[str, object], tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    env = {"SE_TEST_GATE": f"12:{gate}"}
    cmd = command(GATED, corpus, tmp_path)
    job = LocalJob(cmd, config(tmp_path, 3), extra_env=env, log_dir=tmp_path / "logs", root=tmp_path)
    job.start()
    try:
        job.wait_until(lambda v: v.last_step >= 5, timeout=180)
        job.kill_node("local2")
        job.wait_until(lambda v: v.world == 2, timeout=60)
        job.add_node()
        job.wait_until(lambda v: bool(job.coordinator and job.coordinator.status().pending), timeout=120)
        gate.touch()  # the members run on; the joiner joins at the next step boundary
        result = job.wait(timeout=180)
    finally:
        job.stop()
    assert result.ok, f"{result.phase}: {result.reason}\n{result.failure_traceback or ''}"
    worlds = [e.world for e in of_kind(read_events(job.dir / "events.jsonl"), MembershipChange)]
    assert worlds == [3, 2, 3], worlds
    ledger = analyze(tmp_path / "ledger")
    assert (ledger.committed_steps, ledger.duplicate_samples, ledger.skipped_samples) == (ITERS + 1, 0, 0)
    assert same_model(own_checkpoint(tmp_path), reference)


def test_its_own_checkpoint_resumes_the_run_at_another_world_size(
    corpus: Path, reference: dict[str, object], tmp_path: Path
) -> None:
    first, second = tmp_path / "first", tmp_path / "second"
    run(command(ELASTIC, corpus, first, iters=10), first, nodes=2)
    shutil.copytree(first / "own", second / "own")  # its checkpoint at iteration 10
    run(command(ELASTIC, corpus, second, "--init-from", "resume"), second, nodes=3)
    assert same_model(own_checkpoint(second), reference)


def test_an_evaluation_only_pass_ends_the_job_at_step_0(corpus: Path, tmp_path: Path) -> None:
    res = run(command(ELASTIC, corpus, tmp_path, "--eval-only", "--dtype", "bfloat16"), tmp_path, nodes=2)
    finished = res.of(JobFinished)
    assert [e.step for e in finished] == [0], finished
    logs = "".join(p.read_text() for p in (tmp_path / "logs").glob("*.log"))
    assert "step 0: train loss" in logs
