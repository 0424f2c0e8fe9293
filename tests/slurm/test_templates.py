"""Every sbatch template is accepted by the real Slurm (`sbatch --test-only`) and refuses a missing command."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from slurm_elastic.eventtypes import MembershipChange, SlurmJobStarted
from slurm_elastic.testing.devcluster import LocalCluster

from .elastic_jobs import reference_model, submit_core

TEMPLATES = Path(__file__).resolve().parents[2] / "sbatch_templates"


@pytest.mark.parametrize("name", ["elastic_core.sbatch", "elastic_satellite.sbatch", "elastic_hetjob.sbatch"])
def test_template_passes_sbatch_test_only(slurm_cluster: LocalCluster, name: str) -> None:
    env = {**os.environ, "SLURM_ELASTIC_CORE_JOB": "1"}
    argv = ["sbatch", "--test-only", str(TEMPLATES / name), "python3", "train.py"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "to start at" in done.stderr + done.stdout


@pytest.mark.parametrize("name", ["elastic_core.sbatch", "elastic_hetjob.sbatch"])
def test_template_without_a_command_says_so(name: str, tmp_path: Path) -> None:
    done = subprocess.run(["bash", str(TEMPLATES / name)], capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 2
    assert "give the training command" in done.stderr


def test_hetjob_runs_one_agent_on_every_node_of_every_component(slurm_cluster: LocalCluster, tmp_path: Path) -> None:
    job = submit_core(tmp_path / "het", nodes=None, steps=20, pause=0.1, template=TEMPLATES / "elastic_hetjob.sbatch")
    try:
        job.wait_finished(timeout=240)
        started = job.of(SlurmJobStarted)[0]
        assert len(started.nodes) == 3  # 2 nodes in component 0, 1 in component 1
        assert job.of(MembershipChange)[0].world == 3
        job.assert_same_training(reference_model(tmp_path.parent, 20))
    finally:
        job.cancel()
