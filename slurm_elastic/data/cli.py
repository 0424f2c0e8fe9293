"""The `prepare-data` subcommand; the top-level CLI mounts it with `add_parser`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from slurm_elastic.data.prepare import DEFAULT_PATTERNS, default_corpus, prepare_data
from slurm_elastic.errors import DataError

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add `prepare-data` to `subparsers`; the parsed namespace's `func` is `run`."""
    parser = subparsers.add_parser(
        "prepare-data",
        help="build a character-level token data set from text files",
        description="Build tokens.bin and meta.json in --out from text files (default: the Python stdlib).",
    )
    parser.add_argument(
        "--source",
        dest="sources",
        action="append",
        metavar="PATH",
        help="file, directory (walked recursively) or glob; repeatable (default: the standard library)",
    )
    parser.add_argument("--out", required=True, type=Path, metavar="DIR", help="output directory")
    parser.add_argument(
        "--max-mb", type=float, metavar="N", help="keep only the first N megabytes (10^6 bytes) of the corpus"
    )
    parser.add_argument(
        "--pattern",
        dest="patterns",
        action="append",
        metavar="GLOB",
        help=f"file name pattern inside directories; repeatable (default: {' '.join(DEFAULT_PATTERNS)})",
    )
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Prepare the data set; 0 on success, 2 with a one-line message on stderr for bad input."""
    try:
        max_bytes = None
        if args.max_mb is not None:
            if not args.max_mb > 0:
                raise DataError(f"--max-mb must be > 0, got {args.max_mb}")
            max_bytes = max(1, int(args.max_mb * 1_000_000))
        report = prepare_data(
            args.sources or default_corpus(),
            args.out,
            max_bytes=max_bytes,
            patterns=tuple(args.patterns or DEFAULT_PATTERNS),
        )
    except DataError as exc:
        print(f"slurm-elastic: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_json()) if args.json else report.summary())
    return 0
