from __future__ import annotations

import hashlib
import json
import os
import re
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slurm_elastic.data import default_corpus, prepare_data
from slurm_elastic.data import prepare as prepare_mod
from slurm_elastic.data.prepare import collect_files
from slurm_elastic.errors import DataError


def _decode(out: Path) -> str:
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    tokens = np.fromfile(out / "tokens.bin", dtype=meta["dtype"])
    return "".join(meta["vocab"][i] for i in tokens)


def test_small_corpus_round_trips(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    report = prepare_data([corpus], out)
    # Sorted path order, "\n" between files; __pycache__, site-packages and *.json are left out.
    expected = "print('hi')\n" + "\n" + "hello world\n" + "\n" + "# Über\n"
    assert _decode(out) == expected
    meta = json.loads((out / "meta.json").read_text(encoding="utf-8"))
    assert meta["version"] == 1
    assert meta["dtype"] == "uint8"
    assert meta["num_tokens"] == len(expected) == report.tokens
    assert meta["vocab"] == sorted(set(expected) | {"\ufffd"})
    assert meta["vocab"][meta["unk_id"]] == "\ufffd"
    assert meta["sources"]["files"] == report.files == 3
    assert report.bytes == len(expected.encode()) - 2
    assert report.vocab_size == len(meta["vocab"])
    assert report.tokens_path == out / "tokens.bin" and report.meta_path == out / "meta.json"
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokens.bin"]  # no temp files left
    assert meta["sha256"] == report.sha256 == hashlib.sha256((out / "tokens.bin").read_bytes()).hexdigest()


def test_deterministic_and_source_order_independent(corpus: Path, tmp_path: Path) -> None:
    one = prepare_data([corpus / "pkg", corpus], tmp_path / "one")
    two = prepare_data([corpus, corpus / "b.txt"], tmp_path / "two")  # duplicates are read once
    assert one.sha256 == two.sha256
    assert one.files == two.files == 3


def test_globs_and_patterns(corpus: Path, tmp_path: Path) -> None:
    assert [p.name for p in collect_files([str(corpus / "*.txt")])] == ["b.txt"]
    assert [p.name for p in collect_files([str(corpus / "**" / "*.md")])] == ["c.md"]
    assert [p.name for p in collect_files([corpus], patterns=["*.json"])] == ["skip.json"]
    report = prepare_data([str(corpus / "*.py")], tmp_path / "g")
    assert report.files == 1 and _decode(tmp_path / "g") == "print('hi')\n"


def test_max_bytes_keeps_the_first_bytes_in_sorted_order(corpus: Path, tmp_path: Path) -> None:
    report = prepare_data([corpus], tmp_path / "cut", max_bytes=15)
    assert report.bytes == 15 and report.files == 2
    assert _decode(tmp_path / "cut") == "print('hi')\n" + "\n" + "hel"


def test_binary_files_are_skipped_and_bad_utf8_replaced(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "bin.txt").write_bytes(b"abc\x00def")
    (tmp_path / "src" / "latin.txt").write_bytes(b"caf\xe9")
    report = prepare_data([tmp_path / "src"], tmp_path / "out")
    assert report.skipped_files == 1 and report.files == 1
    assert _decode(tmp_path / "out") == "caf\ufffd"


def test_vocab_cap_keeps_most_frequent_and_maps_the_rest_to_unk(tmp_path: Path) -> None:
    src = tmp_path / "s.txt"
    src.write_text("aaaa" + "bbb" + "cc" + "d", encoding="utf-8")
    report = prepare_data([src], tmp_path / "out", max_vocab=3)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    assert meta["vocab"] == ["a", "b", "\ufffd"] and report.unk_id == 2
    assert _decode(tmp_path / "out") == "aaaabbb" + "\ufffd" * 3


def test_large_vocab_uses_uint16(tmp_path: Path) -> None:
    src = tmp_path / "s.txt"
    src.write_text("".join(chr(0x4E00 + i) for i in range(300)), encoding="utf-8")
    prepare_data([src], tmp_path / "out", max_vocab=1000)
    meta = json.loads((tmp_path / "out" / "meta.json").read_text(encoding="utf-8"))
    assert meta["dtype"] == "uint16" and len(meta["vocab"]) == 301
    assert (tmp_path / "out" / "tokens.bin").stat().st_size == 600


def test_rerun_replaces_an_existing_data_set(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    prepare_data([corpus], out)
    report = prepare_data([corpus / "a.py"], out)
    assert _decode(out) == "print('hi')\n" and report.tokens == 12


@pytest.mark.parametrize(
    ("sources", "match"),
    [
        ([], "no sources given"),
        (["/no/such/file.txt"], "source '/no/such/file.txt' does not exist"),
        (["/no/such/*.txt"], "source '/no/such/\\*.txt' matched no files"),
    ],
)
def test_bad_sources(sources: list[str], match: str, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=match):
        prepare_data(sources, tmp_path / "out")


def test_no_matching_files(corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"no files matching \['\*.rs'\] under"):
        prepare_data([corpus], tmp_path / "out", patterns=["*.rs"])


def test_empty_corpus(tmp_path: Path) -> None:
    (tmp_path / "e.txt").write_text("", encoding="utf-8")
    with pytest.raises(DataError, match="the corpus is empty"):
        prepare_data([tmp_path / "e.txt"], tmp_path / "out")
    assert list((tmp_path / "out").iterdir()) == []  # temp files are cleaned up


def test_out_dir_is_a_file(corpus: Path, tmp_path: Path) -> None:
    target = tmp_path / "file"
    target.write_text("x", encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"output {target} exists and is not a directory")):
        prepare_data([corpus], target)


@pytest.mark.parametrize(("kwargs", "match"), [({"max_bytes": 0}, "max_bytes"), ({"max_vocab": 1}, "max_vocab")])
def test_bad_options(kwargs: dict[str, int], match: str, corpus: Path, tmp_path: Path) -> None:
    with pytest.raises(DataError, match=match):
        prepare_data([corpus], tmp_path / "out", **kwargs)  # type: ignore[arg-type]


def test_default_corpus_is_the_stdlib() -> None:
    assert default_corpus() == [Path(sysconfig.get_paths()["stdlib"])]


def test_stdlib_corpus_with_max_bytes(tmp_path: Path) -> None:
    started = time.perf_counter()
    report = prepare_data(default_corpus(), tmp_path / "std", max_bytes=1_000_000)
    assert time.perf_counter() - started < 5
    assert report.bytes == 1_000_000 and report.files > 10
    assert 60 < report.vocab_size <= 256
    files = collect_files(default_corpus())
    assert not any("site-packages" in p.parts or "__pycache__" in p.parts for p in files)
    assert any(p.name == "os.py" for p in files)


def test_interrupted_run_keeps_the_previous_data_set(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    before = prepare_data([corpus], out)
    real_spool = prepare_mod._spool

    def spool_then_interrupt(*args: Any, **kwargs: Any) -> tuple[int, int, int]:
        real_spool(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(prepare_mod, "_spool", spool_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        prepare_data([corpus / "a.py"], out)
    assert sorted(p.name for p in out.iterdir()) == ["meta.json", "tokens.bin"]
    assert hashlib.sha256((out / "tokens.bin").read_bytes()).hexdigest() == before.sha256


def test_unreadable_directory(corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Root can read anything, so simulate the permission error os.walk would meet.
    real_scandir = os.scandir
    denied = corpus / "pkg"

    def scandir(path: Any) -> Any:
        if Path(path) == denied:
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    with pytest.raises(DataError, match=re.escape(f"cannot read directory {denied}: Permission denied")):
        prepare_data([corpus], tmp_path / "out")
