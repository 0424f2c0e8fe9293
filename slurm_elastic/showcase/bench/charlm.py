"""The workload both step loops time: the examples' char-LM (what users run), and the record each rank writes."""

from __future__ import annotations

import argparse
import json
import resource
import sys
from pathlib import Path

import torch

from slurm_elastic.showcase.workload import EXAMPLES


def model(args: argparse.Namespace, vocab: int) -> torch.nn.Module:
    sys.path.insert(0, str(EXAMPLES))  # the examples' own model, so the benchmark times what users run
    from char_model import CharTransformer

    torch.manual_seed(0)
    return CharTransformer(vocab, args.seq_len, args.dim, args.layers, args.heads, dropout=0.0)


def report(out: Path, rank: int, starts: list[float], params: int, opt_bytes: tuple[int, int] = (0, 0)) -> None:
    """`opt_bytes`: (optimizer state bytes this rank holds, the full state's), for a sharded model."""
    out.mkdir(parents=True, exist_ok=True)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux: kilobytes
    record = {"rank": rank, "step_starts": starts, "peak_rss_mb": round(peak_kb / 1024, 1), "params": params}
    record |= {"opt_bytes": opt_bytes[0], "opt_full_bytes": opt_bytes[1]}
    (out / f"rank{rank}.json").write_text(json.dumps(record))
