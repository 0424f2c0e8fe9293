"""docs/testing.md's examples run as written: each Python block is executed, and the test functions it
defines are called."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "testing.md"


def blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def block_with(text: str) -> str:
    found = [b for b in blocks() if text in b]
    assert len(found) == 1, f"docs/testing.md: expected one Python block with {text!r}, found {len(found)}"
    return found[0]


def test_the_thread_ranks_example_survives_its_dying_rank() -> None:
    scope: dict[str, Any] = {}
    exec(compile(block_with("ThreadJob"), str(DOC), "exec"), scope)
    tests = [f for name, f in scope.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()


def test_the_fake_slurm_example(tmp_path: Path) -> None:
    script = tmp_path / "job.sbatch"
    script.write_text("#!/bin/bash\nsleep 300\n")
    scope: dict[str, Any] = {"script": script}
    exec(compile(block_with("FakeSlurm"), str(DOC), "exec"), scope)
    assert scope["slurm"].job(scope["job_id"]).num_nodes == 1


def test_the_contract_example_runs_every_check_against_the_fake(tmp_path: Path) -> None:
    from tests.slurm_adapter.test_contract_fake import FakeHarness

    scope: dict[str, Any] = {"pytest": pytest}
    exec(compile(block_with("CHECKS"), str(DOC), "exec"), scope)
    check_test = scope["test_my_backend_keeps_the_contract"]
    for name in sorted(scope["CHECKS"]):
        check_test(name, FakeHarness(tmp_path))
