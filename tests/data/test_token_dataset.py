from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from slurm_elastic.data import SampleOrder, TokenDataset
from slurm_elastic.errors import DataError

TEXT = "abcabcabcabcaab" * 4 + "z"  # what the `dataset_dir` fixture prepared; "z" became unk


def test_windows_and_dtypes(dataset_dir: Path) -> None:
    ds = TokenDataset(dataset_dir, seq_len=8)
    assert ds.vocab_size == 4 and ds.meta["vocab"] == ["a", "b", "c", "\ufffd"] and ds.unk_id == 3
    assert ds.num_tokens == len(TEXT) == 61
    assert len(ds) == (61 - 1) // 8 == 7
    ids = ds.encode(TEXT)
    for i in range(len(ds)):
        x, y = ds[i]
        assert x.dtype == torch.int64 and y.dtype == torch.int64
        assert x.shape == y.shape == (8,)
        assert x.tolist() == ids[i * 8 : i * 8 + 8]
        assert y.tolist() == ids[i * 8 + 1 : i * 8 + 9]
    assert ds[-1][0].tolist() == ds[6][0].tolist()
    with pytest.raises(IndexError, match=r"out of range 0\.\.6"):
        ds[7]


def test_last_window_may_end_on_the_last_token(dataset_dir: Path) -> None:
    ds = TokenDataset(dataset_dir, seq_len=60)
    assert len(ds) == 1
    _, y = ds[0]
    assert ds.decode(y)[-1] == "\ufffd"


def test_encode_decode_and_unk(dataset_dir: Path) -> None:
    ds = TokenDataset(dataset_dir, seq_len=4)
    assert ds.decode(ds.encode("abcba")) == "abcba"
    assert ds.encode("aqz") == [0, 3, 3]
    assert ds.decode(ds.encode("aqz")) == "a\ufffd\ufffd"
    assert ds.decode(torch.tensor([[0, 1], [2, 3]])) == "abc\ufffd"
    assert ds.decode(np.array([], dtype=np.int64)) == ""
    with pytest.raises(DataError, match=r"token id 4 is out of range 0\.\.3"):
        ds.decode([0, 4])
    with pytest.raises(DataError, match=r"token id -1 is out of range 0\.\.3"):
        ds.decode([-1])


def test_meta_is_a_copy(dataset_dir: Path) -> None:
    ds = TokenDataset(dataset_dir, seq_len=4)
    ds.meta["vocab"].append("!")
    assert ds.vocab_size == 4 and len(ds.meta["vocab"]) == 4


def test_tokens_are_mapped_read_only_and_not_pickled(dataset_dir: Path) -> None:
    ds = TokenDataset(dataset_dir, seq_len=4)
    assert isinstance(ds.tokens, np.memmap) and not ds.tokens.flags.writeable
    blob = pickle.dumps(ds)
    assert len(blob) < 2000
    clone = pickle.loads(blob)
    assert torch.equal(clone[3][0], ds[3][0])


def test_works_with_a_dataloader_and_sample_order(dataset_dir: Path) -> None:
    ds = TokenDataset(dataset_dir, seq_len=4)
    order = SampleOrder(len(ds), seed=1)
    loader = DataLoader(ds, batch_size=5, sampler=order.indices(0, 2 * len(ds)).tolist())
    batches = list(loader)
    assert sum(b[0].shape[0] for b in batches) == 2 * len(ds)
    assert batches[0][0].shape == (5, 4)


def test_errors(tmp_path: Path, dataset_dir: Path) -> None:
    with pytest.raises(DataError, match="is not a directory"):
        TokenDataset(tmp_path / "missing", seq_len=4)
    with pytest.raises(DataError, match=r"has no meta\.json"):
        TokenDataset(tmp_path, seq_len=4)
    with pytest.raises(
        DataError, match=re.escape(f"data set {dataset_dir} has 61 tokens; seq_len 61 needs at least 62")
    ):
        TokenDataset(dataset_dir, seq_len=61)
    for bad in (0, -1, 2.0, True):
        with pytest.raises(DataError, match="seq_len must be an integer >= 1"):
            TokenDataset(dataset_dir, seq_len=bad)  # type: ignore[arg-type]


def _rewrite_meta(directory: Path, **changes: object) -> None:
    path = directory / "meta.json"
    meta = json.loads(path.read_text(encoding="utf-8"))
    meta.update(changes)
    path.write_text(json.dumps(meta), encoding="utf-8")


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"version": 99}, "has version 99; this slurm-elastic reads version 1"),
        ({"vocab": "abc"}, "'vocab' must be a non-empty list"),
        ({"vocab": ["a", "a"]}, "distinct characters"),
        ({"unk_id": 9}, r"'unk_id' must be in 0..3, got 9"),
        ({"dtype": "uint16"}, "a vocabulary of 4 needs 'uint8'"),
        ({"num_tokens": 60}, "holds 61 bytes but meta.json says 60 uint8 tokens"),
    ],
)
def test_bad_meta(dataset_dir: Path, changes: dict[str, object], match: str) -> None:
    _rewrite_meta(dataset_dir, **changes)
    with pytest.raises(DataError, match=match):
        TokenDataset(dataset_dir, seq_len=4)


def test_unreadable_meta(dataset_dir: Path) -> None:
    (dataset_dir / "meta.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(DataError, match=r"cannot read .*meta\.json"):
        TokenDataset(dataset_dir, seq_len=4)
