"""A memory-mapped, character-level token data set made by `prepare_data`."""

from __future__ import annotations

import copy
import operator
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from torch.utils.data import Dataset

from slurm_elastic.data._format import TOKENS_FILE, read_meta
from slurm_elastic.errors import DataError
from slurm_elastic.nodecache import node_local

__all__ = ["TokenDataset"]


class TokenDataset(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Sample i is the window tokens[i*seq_len : i*seq_len + seq_len + 1], split into inputs and targets.

    Construction reads only meta.json; tokens are memory-mapped on first access, so every process (and
    every worker after fork or spawn) maps the same page-cache pages instead of holding a copy.
    """

    def __init__(self, path: str | Path, seq_len: int) -> None:
        self.path = Path(path)
        if isinstance(seq_len, bool) or not isinstance(seq_len, int | np.integer) or seq_len < 1:
            raise DataError(f"seq_len must be an integer >= 1, got {seq_len!r}")
        self.seq_len = int(seq_len)
        self._meta = read_meta(self.path)
        self.num_tokens: int = self._meta["num_tokens"]
        if self.num_tokens < self.seq_len + 1:
            raise DataError(
                f"data set {self.path} has {self.num_tokens} tokens; "
                f"seq_len {self.seq_len} needs at least {self.seq_len + 1}"
            )
        self._vocab: list[str] = list(self._meta["vocab"])
        self.unk_id: int = self._meta["unk_id"]
        self._stoi = {ch: i for i, ch in enumerate(self._vocab)}
        self._dtype = np.dtype(self._meta["dtype"])
        self._tokens: npt.NDArray[np.unsignedinteger[Any]] | None = None

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    @property
    def meta(self) -> dict[str, Any]:
        """A copy of meta.json, so callers cannot change what the data set decodes with."""
        return copy.deepcopy(self._meta)

    @property
    def tokens(self) -> npt.NDArray[np.unsignedinteger[Any]]:
        """The whole token stream, memory-mapped read-only (inside a job: its copy in the node's shared
        memory, made by the node's first worker, so later workers do not read storage again)."""
        if self._tokens is None:
            self._tokens = np.memmap(node_local(self.path / TOKENS_FILE), dtype=self._dtype, mode="r")
        return self._tokens

    def __len__(self) -> int:
        # Windows overlap by one token (the last target of window i is the first input of window i+1).
        return (self.num_tokens - 1) // self.seq_len

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        i = operator.index(index)
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"sample index {i} is out of range 0..{n - 1}")
        i %= n
        start = i * self.seq_len
        window = np.array(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)
        t = torch.from_numpy(window)
        return t[:-1], t[1:]

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; characters outside the vocabulary become `unk_id`."""
        return [self._stoi.get(ch, self.unk_id) for ch in text]

    def decode(self, ids: Sequence[int] | npt.NDArray[np.integer[Any]] | torch.Tensor) -> str:
        """The text of token ids; an id outside 0..vocab_size-1 is a DataError."""
        arr = ids.detach().cpu().numpy() if isinstance(ids, torch.Tensor) else np.asarray(ids)
        arr = arr.reshape(-1)
        if arr.size == 0:
            return ""
        if not np.issubdtype(arr.dtype, np.integer):
            raise DataError(f"token ids must be integers, got dtype {arr.dtype}")
        low, high = int(arr.min()), int(arr.max())
        if low < 0 or high >= self.vocab_size:
            bad = low if low < 0 else high
            raise DataError(f"token id {bad} is out of range 0..{self.vocab_size - 1}")
        vocab = self._vocab
        return "".join([vocab[i] for i in arr.tolist()])

    def __getstate__(self) -> dict[str, Any]:
        # Never ship the mapped tokens through pickle (np.memmap would copy them all); the receiver re-maps.
        state = self.__dict__.copy()
        state["_tokens"] = None
        return state

    def __repr__(self) -> str:
        return (
            f"TokenDataset({str(self.path)!r}, seq_len={self.seq_len}, samples={len(self)}, "
            f"vocab_size={self.vocab_size})"
        )
