"""A script's own batch sampling: `ElasticJob(batch_fn=get_batch, micro_batch=B, global_batch=G)`.

Some scripts have no data set to order: they draw each batch themselves (random windows of a token file,
say). The job then keeps one stream of positions as for a data set, without epochs, and each micro-batch
is the `micro_batch` positions [p, p + micro_batch) of it. For each micro-batch the job calls
`batch_fn(generator)`, with a `torch.Generator` seeded by the run's seed and p alone: a re-run step draws
the same batches on whichever rank draws them, a resize keeps the stream (the global batch is cut into the
same micro-batches at any world size), and the ledger records each micro-batch's positions once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from slurm_elastic.errors import ConfigError

# The positions of a sampled job's stream: more than any run draws, so it never ends an epoch.
SAMPLED_STREAM = 2**62

BatchFn = Callable[[torch.Generator], Any]


def batch_seed(seed: int, position: int) -> int:
    """The seed of the micro-batch that starts at stream `position` of a run seeded with `seed` (SeedSequence
    mixes both, so neighbouring places and seeds give unrelated streams; numpy specifies it bit for bit)."""
    return int(np.random.SeedSequence([seed, position]).generate_state(1, np.uint64)[0])


def check_multiple(micro_batch: int, **batch: int | None) -> None:
    """Every micro-batch of a sampled job is one whole call: the step's batch must be cut into whole ones."""
    for name, size in batch.items():
        if size is not None and size % micro_batch:
            raise ConfigError(
                f"{name} {size} is not a multiple of micro_batch {micro_batch}: with batch_fn= each call "
                "draws one whole micro-batch"
            )


class SampledBatches:
    """Loads a sampled job's micro-batch from its place in the stream (run by the prefetcher or its pool)."""

    def __init__(self, batch_fn: BatchFn, seed: int, micro_batch: int) -> None:
        self.batch_fn, self.seed, self.micro_batch = batch_fn, seed, micro_batch

    def __call__(self, start: int, size: int) -> Any:
        if size != self.micro_batch or start % self.micro_batch:
            raise ConfigError(
                f"positions [{start}, {start + size}) are not one micro-batch of {self.micro_batch}: "
                "with batch_fn= the step's batch must be a multiple of micro_batch"
            )
        generator = torch.Generator()
        generator.manual_seed(batch_seed(self.seed, start))
        return self.batch_fn(generator)


__all__ = ["SAMPLED_STREAM", "BatchFn", "SampledBatches", "batch_seed", "check_multiple"]
