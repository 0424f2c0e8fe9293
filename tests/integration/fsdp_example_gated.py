"""examples/train_fsdp_elastic.py with gates for tests: SE_TEST_GATES="STEP:FILE,..." makes every rank wait,
before the backward passes of step STEP and later ones, until FILE exists (so that a test can let a joiner
that takes seconds to start arrive at a known step). The gates do not touch the math."""

import os
import runpy
import sys
import time
from pathlib import Path

import slurm_elastic as se

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))  # the example imports its model from there
GATES = [(int(step), Path(path)) for step, path in (g.split(":", 1) for g in os.environ["SE_TEST_GATES"].split(","))]
backward = se.ElasticJob.backward


def gated(self: se.ElasticJob, loss: object) -> None:
    for step, gate in GATES:
        if self.step + 1 >= step:
            while not gate.exists():
                time.sleep(0.02)
    backward(self, loss)  # type: ignore[arg-type]


se.ElasticJob.backward = gated  # type: ignore[method-assign]

if __name__ == "__main__":
    runpy.run_path(str(EXAMPLES / "train_fsdp_elastic.py"), run_name="__main__")
