"""The short version of `slurm-elastic chaos` that CI runs: a seeded mix of faults, then the verdict."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(400)]


def test_a_short_chaos_run_ends_with_the_reference_model_and_every_sample_once() -> None:
    argv = [sys.executable, "-m", "slurm_elastic", "chaos", "--seed", "3", "--faults", "5", "--json"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=380)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout.strip().splitlines()[-1])
    assert summary["seed"] == 3 and len(summary["faults"]) == 5
    assert {f["kind"] for f in summary["faults"]} - {"join"}, "some fault took a node away"
    assert (summary["lost_committed_steps"], summary["duplicate_samples"], summary["skipped_samples"]) == (0, 0, 0)
    assert summary["max_param_rel_diff"] <= summary["tolerance"] == 1e-6 and summary["ok"]
