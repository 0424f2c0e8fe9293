"""Access to the literal Slurm outputs under fixtures/ (a uniquely named helper module, not a conftest)."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_text(relpath: str) -> str:
    return (FIXTURES / relpath).read_text()
