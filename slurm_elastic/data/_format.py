"""The on-disk format of a prepared data set, shared by the writer and the reader (no torch import here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from slurm_elastic.errors import DataError

META_VERSION = 1
TOKENS_FILE = "tokens.bin"
META_FILE = "meta.json"
# Characters that did not make it into the vocabulary map here; UTF-8 decoding with errors="replace"
# already produces it for undecodable bytes, so it is the natural unknown token.
UNK_CHAR = "\ufffd"


def dtype_for_vocab(vocab_size: int) -> str:
    return "uint8" if vocab_size <= 256 else "uint16"


def read_meta(directory: Path) -> dict[str, Any]:
    """Load and check `meta.json` of a prepared directory; every problem is a one-line DataError."""
    if not directory.is_dir():
        raise DataError(f"data set {directory} is not a directory; create it with `slurm-elastic prepare-data`")
    meta_path = directory / META_FILE
    tokens_path = directory / TOKENS_FILE
    for path in (meta_path, tokens_path):
        if not path.is_file():
            raise DataError(f"data set {directory} has no {path.name}; re-run `slurm-elastic prepare-data`")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"cannot read {meta_path}: {exc}") from None
    if not isinstance(meta, dict):
        raise DataError(f"{meta_path} must hold a JSON object, got {type(meta).__name__}")
    if meta.get("version") != META_VERSION:
        raise DataError(
            f"{meta_path} has version {meta.get('version')!r}; this slurm-elastic reads version {META_VERSION}"
        )
    vocab = meta.get("vocab")
    if not isinstance(vocab, list) or not vocab or not all(isinstance(c, str) and len(c) == 1 for c in vocab):
        raise DataError(f"{meta_path}: 'vocab' must be a non-empty list of single characters")
    if len(set(vocab)) != len(vocab) or len(vocab) > 65536:
        raise DataError(f"{meta_path}: 'vocab' must hold 1..65536 distinct characters, got {len(vocab)}")
    unk_id = meta.get("unk_id")
    if not isinstance(unk_id, int) or isinstance(unk_id, bool) or not 0 <= unk_id < len(vocab):
        raise DataError(f"{meta_path}: 'unk_id' must be in 0..{len(vocab) - 1}, got {unk_id!r}")
    expected_dtype = dtype_for_vocab(len(vocab))
    if meta.get("dtype") != expected_dtype:
        raise DataError(
            f"{meta_path}: 'dtype' is {meta.get('dtype')!r}; a vocabulary of {len(vocab)} needs {expected_dtype!r}"
        )
    num_tokens = meta.get("num_tokens")
    if not isinstance(num_tokens, int) or isinstance(num_tokens, bool) or num_tokens < 0:
        raise DataError(f"{meta_path}: 'num_tokens' must be an integer >= 0, got {num_tokens!r}")
    itemsize = 1 if expected_dtype == "uint8" else 2
    size = tokens_path.stat().st_size
    if size != num_tokens * itemsize:
        raise DataError(
            f"{tokens_path} holds {size} bytes but {meta_path.name} says {num_tokens} "
            f"{expected_dtype} tokens ({num_tokens * itemsize} bytes); re-run `slurm-elastic prepare-data`"
        )
    return meta
