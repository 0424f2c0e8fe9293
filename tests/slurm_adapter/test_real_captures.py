"""Parse every real capture that the cluster work drops into fixtures/<version>/ (files not named
`doc_*`), choosing the parser from the file name. Skips when there are none yet."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from slurm_adapter.slurm_fixtures import FIXTURES
from slurm_elastic.slurm.parse import (
    parse_jobs_json,
    parse_nodes_json,
    parse_sbatch_parsable,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_json,
    parse_version,
)


def _parser(path: Path) -> Callable[[str], object] | None:
    name = path.name.lower().replace("-", "_")
    is_json = path.suffix == ".json"
    if "squeue" in name and is_json:
        return parse_jobs_json
    if "job" in name and "scontrol" in name:
        return parse_jobs_json if is_json else parse_scontrol_jobs
    if "node" in name and "scontrol" in name:
        return parse_nodes_json if is_json else parse_scontrol_nodes
    if "sinfo" in name and is_json:
        return parse_sinfo_json
    if "version" in name:
        return parse_version
    if "parsable" in name:
        return parse_sbatch_parsable
    return None


def _captures() -> list[Path]:
    found = []
    for path in sorted(FIXTURES.glob("*/*")):
        if path.is_file() and not path.name.startswith("doc_") and path.name != "README.md" and _parser(path):
            found.append(path)
    return found


@pytest.mark.parametrize("path", _captures() or [None], ids=lambda p: f"{p.parent.name}/{p.name}" if p else "none")
def test_real_capture_parses(path: Path | None) -> None:
    if path is None:
        pytest.skip("no real Slurm captures in tests/slurm_adapter/fixtures yet")
    parser = _parser(path)
    assert parser is not None
    result = parser(path.read_text())
    if isinstance(result, list):
        for record in result:
            assert getattr(record, "job_id", None) or getattr(record, "name", None)
