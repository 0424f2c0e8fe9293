"""examples/ddp_trainer_elastic.py with a gate for tests: before the batches of step SE_TEST_GATE_STEP and
later ones, wait until the file SE_TEST_GATE exists (so a joiner that takes seconds to start arrives while
the job still runs). The gate does not touch the math."""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import ddp_trainer_elastic as example

GATE, AT = Path(os.environ["SE_TEST_GATE"]), int(os.environ["SE_TEST_GATE_STEP"])
run_batch = example.Trainer._run_batch


def gated(self: example.Trainer, source: object, targets: object) -> float:
    if self.job.step + 1 >= AT:
        while not GATE.exists():
            time.sleep(0.02)
    return run_batch(self, source, targets)  # type: ignore[arg-type]


example.Trainer._run_batch = gated  # type: ignore[method-assign]

if __name__ == "__main__":
    example.main()
