"""examples/gpt_elastic.py with a gate for tests: SE_TEST_GATE="STEP:FILE" makes every rank wait, once it has
committed step STEP or a later one, until FILE exists (so that a joiner that takes seconds to start arrives
while the job still runs). The gate runs between steps (an on_step hook) and does not touch the math. A
process started without SE_TEST_GATE (a Slurm satellite, which gets its own environment) has no gate."""

import os
import runpy
import sys
import time
from pathlib import Path
from typing import Any

import slurm_elastic as se

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt_elastic.py"
STEP, GATE = os.environ.get("SE_TEST_GATE", f"{2**62}:").split(":", 1)


class GatedJob(se.ElasticJob):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_step(self._wait)

    def _wait(self, step: int, loss: float) -> None:
        while step >= int(STEP) and not Path(GATE).exists():
            time.sleep(0.02)


se.ElasticJob = GatedJob  # type: ignore[misc]
sys.path.insert(0, str(EXAMPLE.parent))
runpy.run_path(str(EXAMPLE), run_name="__main__")
