"""examples/ddp_trainer_elastic.py with gates for tests: SE_TEST_GATES="STEP:FILE,..." makes every rank wait,
before the batches of step STEP and later ones, until FILE exists (so that a test can act on the job at a
known step, e.g. let a joiner that takes seconds to start arrive). The gates do not touch the math."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import ddp_trainer_elastic as example

GATES = [(int(step), Path(path)) for step, path in (g.split(":", 1) for g in os.environ["SE_TEST_GATES"].split(","))]
run_batch = example.Trainer._run_batch


def gated(self: example.Trainer, source: object, targets: object) -> float:
    for step, gate in GATES:
        if self.job.step + 1 >= step:
            while not gate.exists():
                time.sleep(0.02)
    return run_batch(self, source, targets)  # type: ignore[arg-type]


example.Trainer._run_batch = gated  # type: ignore[method-assign]

if __name__ == "__main__":
    example.main()
