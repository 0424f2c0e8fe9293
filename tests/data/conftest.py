from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.data import prepare_data


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    """A small tree: two matching files in sorted order, a nested one, and files the walk must ignore."""
    root = tmp_path / "corpus"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / "site-packages").mkdir()
    (root / "b.txt").write_text("hello world\n", encoding="utf-8")
    (root / "a.py").write_text("print('hi')\n", encoding="utf-8")
    (root / "pkg" / "c.md").write_text("# Über\n", encoding="utf-8")
    (root / "pkg" / "skip.json").write_text("{}", encoding="utf-8")
    (root / "pkg" / "__pycache__" / "x.py").write_text("cached", encoding="utf-8")
    (root / "site-packages" / "y.py").write_text("third party", encoding="utf-8")
    return root


@pytest.fixture
def dataset_dir(tmp_path: Path) -> Path:
    """A prepared data set with a tiny vocabulary (3 characters + unk), so that unk mapping is visible."""
    src = tmp_path / "src.txt"
    src.write_text("abcabcabcabcaab" * 4 + "z", encoding="utf-8")
    out = tmp_path / "ds"
    prepare_data([src], out, max_vocab=4)
    return out
