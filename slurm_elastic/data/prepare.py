"""Build a character-level token data set from text files (by default the Python standard library).

Two passes, both vectorised with numpy: the first decodes files in sorted order, counts characters and
spools their code points to a scratch file; the second maps code points to ids and writes tokens.bin.
Everything is written under temporary names and renamed at the end, so an interrupted run leaves any
earlier data set in `out_dir` as it was.
"""

from __future__ import annotations

import fnmatch
import glob
import hashlib
import json
import os
import sysconfig
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import numpy.typing as npt

from slurm_elastic.data._format import META_FILE, META_VERSION, TOKENS_FILE, UNK_CHAR, dtype_for_vocab
from slurm_elastic.errors import DataError

__all__ = ["DEFAULT_PATTERNS", "PrepareReport", "default_corpus", "prepare_data"]

DEFAULT_PATTERNS: tuple[str, ...] = ("*.py", "*.txt", "*.md")
# Subdirectories never entered while walking a source directory: installed third-party code under the
# stdlib (pyenv, venvs) is not "the standard library", and bytecode caches and VCS dirs are not text.
SKIP_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
_BATCH_CHARS = 1 << 22  # code points per numpy batch: big enough to amortise, small enough to bound memory
_SNIFF_BYTES = 8192  # a NUL byte in this many leading bytes marks a file as binary (as git does)
_MAX_CODE = 0x110000


@dataclass(frozen=True)
class PrepareReport:
    files: int
    skipped_files: int
    bytes: int
    tokens: int
    vocab_size: int
    unk_id: int
    out_dir: Path
    tokens_path: Path
    meta_path: Path
    sha256: str
    elapsed_s: float

    def summary(self) -> str:
        return (
            f"prepared {self.out_dir}: {self.files} files ({self.skipped_files} skipped), "
            f"{self.bytes / 1e6:.1f} MB, {self.tokens} tokens, vocab {self.vocab_size}, "
            f"{self.elapsed_s:.2f} s"
        )

    def to_json(self) -> dict[str, Any]:
        return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(self).items()}


def default_corpus() -> list[Path]:
    """The standard library's own source directory: a corpus that needs no download."""
    return [Path(sysconfig.get_paths()["stdlib"])]


def _sort_key(path: Path) -> tuple[str, ...]:
    return path.parts  # tree order: a directory's files stay together whatever characters the names hold


def _walk(root: Path, patterns: Sequence[str]) -> Iterator[Path]:
    def fail(exc: OSError) -> None:
        raise DataError(f"cannot read directory {exc.filename}: {exc.strerror}")

    for dirpath, dirnames, filenames in os.walk(root, onerror=fail):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".")]
        for name in filenames:
            if any(fnmatch.fnmatch(name, p) for p in patterns):
                yield Path(dirpath, name)


def collect_files(sources: Sequence[str | Path], patterns: Sequence[str] = DEFAULT_PATTERNS) -> list[Path]:
    """Files named by `sources`, deduplicated and sorted by path.

    A source is a file (always read, whatever its name), a directory (walked recursively for files whose
    names match `patterns`, skipping SKIP_DIRS and hidden directories) or a glob (each match as above).
    """
    if not sources:
        raise DataError("no sources given; name files, directories or globs (default: the standard library)")
    found: dict[Path, Path] = {}
    for source in sources:
        path = Path(source)
        if path.exists():
            matches = [path]
        elif glob.has_magic(str(source)):
            matches = [Path(m) for m in sorted(glob.glob(str(source), recursive=True))]
            if not matches:
                raise DataError(f"source {str(source)!r} matched no files")
        else:
            raise DataError(f"source {str(source)!r} does not exist")
        for match in matches:
            if match.is_dir():
                files: Iterator[Path] | list[Path] = _walk(match, patterns)
            elif match.is_file():
                files = [match]
            else:
                raise DataError(f"source {str(match)!r} is neither a file nor a directory")
            for f in files:
                found.setdefault(f.resolve(), f)
    if not found:
        names = ", ".join(repr(str(s)) for s in sources)
        raise DataError(f"no files matching {list(patterns)} under {names}")
    return sorted(found.values(), key=_sort_key)


def _read(path: Path, limit: int | None) -> bytes:
    try:
        with path.open("rb") as fh:
            return fh.read() if limit is None else fh.read(limit)
    except OSError as exc:
        raise DataError(f"cannot read {path}: {exc.strerror}") from None


def _choose_vocab(counts: npt.NDArray[np.int64], max_vocab: int) -> npt.NDArray[np.int64]:
    """Code points of the vocabulary, sorted: the max_vocab-1 most frequent characters plus UNK_CHAR."""
    unk = ord(UNK_CHAR)
    present = np.flatnonzero(counts)
    present = present[present != unk]
    if len(present) > max_vocab - 1:
        # Most frequent first; ties broken by code point so the choice is deterministic.
        order = np.lexsort((present, -counts[present]))
        present = present[order[: max_vocab - 1]]
    return np.sort(np.append(present, unk)).astype(np.int64)


def _spool(
    files: Sequence[Path],
    spool: BinaryIO,
    counts: npt.NDArray[np.int64],
    max_bytes: int | None,
    separator: str,
) -> tuple[int, int, int]:
    """Pass 1: append the code points of each text file to `spool` and add them to `counts`.

    Returns (files used, binary files skipped, bytes read).
    """
    batch: list[str] = []
    batch_chars = used = skipped = total_bytes = 0

    def flush() -> None:
        if batch:
            codes = np.frombuffer("".join(batch).encode("utf-32-le"), dtype=np.uint32)
            binned = np.bincount(codes)
            counts[: len(binned)] += binned
            codes.tofile(spool)
            batch.clear()

    for path in files:
        remaining = None if max_bytes is None else max_bytes - total_bytes
        if remaining is not None and remaining <= 0:
            break
        data = _read(path, remaining)
        if b"\x00" in data[:_SNIFF_BYTES]:
            skipped += 1
            continue
        text = data.decode("utf-8", errors="replace")
        if used:
            batch.append(separator)
        batch.append(text)
        batch_chars += len(text) + len(separator)
        used += 1
        total_bytes += len(data)
        if batch_chars >= _BATCH_CHARS:
            flush()
            batch_chars = 0
    flush()
    return used, skipped, total_bytes


def prepare_data(
    sources: Sequence[str | Path],
    out_dir: Path,
    *,
    max_bytes: int | None = None,
    patterns: Sequence[str] = DEFAULT_PATTERNS,
    max_vocab: int = 256,
    separator: str = "\n",
) -> PrepareReport:
    """Tokenise the text of `sources` by character into `out_dir`/tokens.bin and meta.json.

    `max_bytes` keeps only the first bytes of the corpus, in sorted file order (the last file is cut).
    `max_vocab` (2..65536) caps the vocabulary; rarer characters map to the unknown id.
    """
    started = time.perf_counter()
    out_dir = Path(out_dir)
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1):
        raise DataError(f"max_bytes must be an integer >= 1 or None, got {max_bytes!r}")
    if isinstance(max_vocab, bool) or not isinstance(max_vocab, int) or not 2 <= max_vocab <= 65536:
        raise DataError(f"max_vocab must be an integer in 2..65536, got {max_vocab!r}")
    if out_dir.exists() and not out_dir.is_dir():
        raise DataError(f"output {out_dir} exists and is not a directory")
    files = collect_files(sources, patterns)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DataError(f"cannot create output directory {out_dir}: {exc.strerror}") from None

    tag = f".tmp-{os.getpid()}"
    scratch = out_dir / f"codepoints{tag}"
    tokens_tmp = out_dir / f"{TOKENS_FILE}{tag}"
    meta_tmp = out_dir / f"{META_FILE}{tag}"
    try:
        counts = np.zeros(_MAX_CODE, dtype=np.int64)
        with scratch.open("wb") as spool:
            used, skipped, total_bytes = _spool(files, spool, counts, max_bytes, separator)
        num_tokens = int(counts.sum())
        if num_tokens == 0:
            raise DataError(f"the corpus is empty: {used} text files, {skipped} binary files skipped")

        vocab_codes = _choose_vocab(counts, max_vocab)
        unk_id = int(np.searchsorted(vocab_codes, ord(UNK_CHAR)))
        dtype = dtype_for_vocab(len(vocab_codes))
        lut = np.full(int(np.flatnonzero(counts)[-1]) + 1, unk_id, dtype=dtype)
        in_range = vocab_codes[vocab_codes < len(lut)]
        lut[in_range] = np.searchsorted(vocab_codes, in_range)
        digest = hashlib.sha256()
        codes_all = np.memmap(scratch, dtype=np.uint32, mode="r")
        with tokens_tmp.open("wb") as out:
            for start in range(0, num_tokens, _BATCH_CHARS):
                chunk = lut[codes_all[start : start + _BATCH_CHARS]]
                digest.update(chunk.tobytes())
                chunk.tofile(out)
            out.flush()
            os.fsync(out.fileno())
        del codes_all
        sha256 = digest.hexdigest()

        meta = {
            "version": META_VERSION,
            "vocab": [chr(c) for c in vocab_codes.tolist()],
            "unk_id": unk_id,
            "num_tokens": num_tokens,
            "dtype": dtype,
            "sha256": sha256,
            "separator": separator,
            "sources": {
                "roots": [str(s) for s in sources],
                "patterns": list(patterns),
                "files": used,
                "skipped_binary": skipped,
                "bytes": total_bytes,
                "max_bytes": max_bytes,
            },
        }
        meta_tmp.write_text(json.dumps(meta, indent=1) + "\n", encoding="utf-8")
        # meta.json goes first, so a crash between the renames leaves "no meta.json", never a mismatch.
        (out_dir / META_FILE).unlink(missing_ok=True)
        os.replace(tokens_tmp, out_dir / TOKENS_FILE)
        os.replace(meta_tmp, out_dir / META_FILE)
    except OSError as exc:
        raise DataError(f"cannot write data set to {out_dir}: {exc}") from None
    finally:
        for tmp in (scratch, tokens_tmp, meta_tmp):
            tmp.unlink(missing_ok=True)

    return PrepareReport(
        files=used,
        skipped_files=skipped,
        bytes=total_bytes,
        tokens=num_tokens,
        vocab_size=len(vocab_codes),
        unk_id=unk_id,
        out_dir=out_dir,
        tokens_path=out_dir / TOKENS_FILE,
        meta_path=out_dir / META_FILE,
        sha256=sha256,
        elapsed_s=time.perf_counter() - started,
    )
