"""The docs say what the code does: the README's quickstart is examples/quickstart.py and runs as shown,
and the errors docs/from-ddp.md quotes are the ones the library raises."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(120)

REPO = Path(__file__).resolve().parents[2]


def test_the_readme_quickstart_is_the_example_file_and_it_runs_alone(tmp_path: Path) -> None:
    readme = (REPO / "README.md").read_text()
    script = (REPO / "examples" / "quickstart.py").read_text()
    assert f"```python\n{script}```" in readme, "README's quickstart block differs from examples/quickstart.py"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_ELASTIC_")} | {"OMP_NUM_THREADS": "1"}
    script_path = str(REPO / "examples" / "quickstart.py")
    out = subprocess.run(
        [sys.executable, script_path], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "rank 0 of 1, starting in epoch 0" in out.stdout and "epoch 4: loss" in out.stdout
    again = subprocess.run(
        [sys.executable, script_path], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100
    )
    assert again.returncode == 0 and "starting in epoch 5" in again.stdout, "a second run resumes from its snapshot"


def longest_plain_run(message: str) -> str:
    """The longest run of plain words in a quoted message (no placeholders such as `n`, `k` or `job.x()`)."""
    runs, run = [], []
    for word in message.split():
        if re.fullmatch(r"(a|[a-z][a-z'-]+)[,:;]?", word):  # single letters but "a" are placeholders
            run.append(word)
        else:
            runs.append(run)
            run = []
    runs.append(run)
    return " ".join(max(runs, key=len)).rstrip(",:;")


def test_the_errors_from_ddp_md_quotes_are_raised_by_the_library() -> None:
    doc = (REPO / "docs" / "from-ddp.md").read_text()
    rows = [line for line in doc[doc.index("## What the loop does not allow") :].splitlines() if line.startswith("| ")]
    quoted = [q for row in rows[1:] for q in re.findall(r"`([^`]{20,})`", row.split(" | ")[-1])]
    assert len(quoted) >= 6
    package = REPO / "slurm_elastic"
    source = "".join(p.read_text() for d in ("worker", "decide") for p in (package / d).glob("*.py"))
    source = " ".join(re.sub(r'"\s*\n\s*f?"', "", source).split())  # join continued string literals
    for q in quoted:
        fragment = longest_plain_run(q)
        assert len(fragment.split()) >= 3 and fragment in source, f"docs/from-ddp.md quotes {q!r}: {fragment!r}"


def test_every_test_security_md_names_exists() -> None:
    doc = (REPO / "docs" / "security.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", doc)
    assert len(named) >= 30
    for path, name in named:
        source = (REPO / path).read_text()
        assert not name or re.search(rf"^def {name}\(", source, re.M), f"docs/security.md names {path}::{name}"
