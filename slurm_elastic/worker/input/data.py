"""Where a job's batches come from: a map-style data set and a DataLoader's settings.

`ElasticJob(dataset=..., collate_fn=..., num_workers=..., pin_memory=...)` takes them as a DataLoader
would; `ElasticJob(loader=DataLoader(...))` takes the data set and those settings from a DataLoader the
script already builds (its `batch_size` becomes the micro-batch unless `micro_batch=` is given). The
sampler is not used: the job orders the samples itself (one global stream, shuffled per epoch from the
seed, exactly once across failures and resizes), so only its `shuffle` is kept.

`ElasticLoader(dataset, batch_size=..., ...)` replaces the line that builds `DataLoader(...,
sampler=DistributedSampler(...))`: once given to `ElasticJob(loader=...)`, iterating it yields this
rank's micro-batches of the current epoch (inside `job.epochs()`), so the loop body stays as it was,
`loader.sampler.set_epoch(epoch)` included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from torch.utils.data import (
    DataLoader,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    default_collate,
)

from slurm_elastic.errors import ConfigError, UsageError
from slurm_elastic.worker.input.sampled import SAMPLED_STREAM, BatchFn


class Samples(Protocol):
    """A map-style data set, as torch's DataLoader takes: `len(data)` samples, `data[i]` the i-th."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> Any: ...


@dataclass(frozen=True)
class DataSettings:
    dataset: Samples | None  # None: the script samples its own batches (`batch_fn`)
    micro_batch: int
    collate: Callable[[list[Any]], Any]
    num_workers: int
    pin_memory: bool
    shuffle: bool
    worker_init: Callable[[int], None] | None = None
    batch_fn: BatchFn | None = None

    @property
    def num_samples(self) -> int:
        """The stream positions of one epoch."""
        return len(self.dataset) if self.dataset is not None else SAMPLED_STREAM


class EpochBatches(Protocol):
    """What an ElasticLoader asks of the job it is bound to."""

    @property
    def epoch(self) -> int: ...

    def micro_batches(self, total_steps: int | None = None) -> Any: ...

    def micro_batches_per_epoch(self) -> int: ...


class _EpochCheck:
    """`loader.sampler`: `set_epoch(e)` (a DistributedSampler habit) only checks that e is the job's epoch."""

    def __init__(self, loader: ElasticLoader) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        job = self._loader.bound()
        if epoch != job.epoch:
            raise UsageError(
                f"sampler.set_epoch({epoch!r}) but the job is in epoch {job.epoch}: the job orders the samples "
                "itself; iterate `for epoch in job.epochs(n)` and pass that epoch"
            )


class ElasticLoader:
    """A DataLoader's arguments for an ElasticJob (no sampler: the job orders the samples, shuffled per epoch
    unless shuffle=False). Iterating it, once bound with `ElasticJob(loader=...)`, yields this rank's
    micro-batches of the current epoch; `len()` is their number at the current world size."""

    def __init__(
        self,
        dataset: Samples,
        batch_size: int = 1,
        shuffle: bool = True,
        *,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        worker_init_fn: Callable[[int], None] | None = None,
        drop_last: bool = False,
    ) -> None:
        if drop_last:
            raise ConfigError(
                "drop_last=True: an elastic job drops no sample (each epoch's last step takes the next's)"
            )
        self.dataset = _map_style(dataset)
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.worker_init_fn = worker_init_fn
        self.sampler = _EpochCheck(self)
        self._job: EpochBatches | None = None

    def bind(self, job: EpochBatches) -> None:
        if self._job is not None and self._job is not job:
            raise UsageError("this ElasticLoader already belongs to another ElasticJob: build one loader per job")
        self._job = job

    def bound(self) -> EpochBatches:
        if self._job is None:
            raise UsageError("an ElasticLoader yields batches once given to ElasticJob(loader=...)")
        return self._job

    def __iter__(self) -> Any:
        return iter(self.bound().micro_batches())

    def __len__(self) -> int:
        return self.bound().micro_batches_per_epoch()


def _map_style(dataset: Any) -> Any:
    if isinstance(dataset, IterableDataset) or not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
        raise ConfigError(
            f"dataset {type(dataset).__name__} is not map-style: the job needs len(dataset) and dataset[i] "
            "(an IterableDataset cannot be resumed exactly once)"
        )
    return dataset


def _shuffle_of(sampler: Any) -> bool:
    if isinstance(sampler, DistributedSampler):
        return bool(sampler.shuffle)
    if isinstance(sampler, RandomSampler):
        return True
    if isinstance(sampler, SequentialSampler):
        return False
    raise ConfigError(
        f"the loader's sampler {type(sampler).__name__} is not supported: the job orders the samples itself "
        "(valid: DataLoader(shuffle=True/False) or a DistributedSampler)"
    )


def data_settings(
    *,
    dataset: Any,
    loader: Any,
    micro_batch: int | None,
    collate_fn: Callable[[list[Any]], Any] | None,
    num_workers: int | None,
    pin_memory: bool | None,
    shuffle: bool | None,
    batch_fn: BatchFn | None = None,
) -> DataSettings:
    """Resolve the data arguments of ElasticJob; explicit arguments win over the loader's settings."""
    if batch_fn is not None:
        return _sampled(batch_fn, dataset, loader, micro_batch, collate_fn, num_workers, pin_memory, shuffle)
    worker_init = None
    if loader is not None:
        if dataset is not None:
            raise ConfigError("give dataset= or loader=, not both")
        if not isinstance(loader, DataLoader | ElasticLoader):
            raise ConfigError(f"loader must be a DataLoader or an ElasticLoader, got {type(loader).__name__}")
        dataset = _map_style(loader.dataset)
        micro_batch = micro_batch if micro_batch is not None else loader.batch_size
        collate_fn = collate_fn or loader.collate_fn
        num_workers = num_workers if num_workers is not None else loader.num_workers
        pin_memory = pin_memory if pin_memory is not None else loader.pin_memory
        if shuffle is None:
            shuffle = loader.shuffle if isinstance(loader, ElasticLoader) else _shuffle_of(loader.sampler)
        worker_init = loader.worker_init_fn
    if dataset is None:
        raise ConfigError(
            "no data: give dataset= (a map-style data set), loader= (a DataLoader) or batch_fn= (draws a batch)"
        )
    _map_style(dataset)
    if micro_batch is None:
        raise ConfigError("no micro_batch: give micro_batch= (samples per micro-batch) or a loader with batch_size")
    if not isinstance(num_workers, int | None) or (num_workers or 0) < 0:
        raise ConfigError(f"invalid num_workers {num_workers!r}: expected an integer >= 0")
    return DataSettings(
        dataset=dataset,
        micro_batch=micro_batch,
        collate=collate_fn or default_collate,
        num_workers=num_workers or 0,
        pin_memory=True if pin_memory is None else bool(pin_memory),
        shuffle=True if shuffle is None else bool(shuffle),
        worker_init=worker_init,
    )


def _sampled(
    batch_fn: Any,
    dataset: Any,
    loader: Any,
    micro_batch: int | None,
    collate_fn: Any,
    num_workers: int | None,
    pin_memory: bool | None,
    shuffle: bool | None,
) -> DataSettings:
    """The data settings of a script that samples its own batches (worker.input.sampled)."""
    if not callable(batch_fn):
        raise ConfigError(f"batch_fn must be a function of a torch.Generator, got {type(batch_fn).__name__}")
    given = [n for n, v in (("dataset", dataset), ("loader", loader), ("collate_fn", collate_fn)) if v is not None]
    if shuffle is not None:
        given.append("shuffle")
    if given:
        raise ConfigError(f"batch_fn= draws the batches itself: give it without {', '.join(given)}")
    if micro_batch is None:
        raise ConfigError("no micro_batch: give micro_batch= (the samples each batch_fn call returns)")
    if not isinstance(num_workers, int | None) or (num_workers or 0) < 0:
        raise ConfigError(f"invalid num_workers {num_workers!r}: expected an integer >= 0")
    return DataSettings(
        dataset=None,
        micro_batch=micro_batch,
        collate=default_collate,  # not used: batch_fn returns whole batches
        num_workers=num_workers or 0,
        pin_memory=True if pin_memory is None else bool(pin_memory),
        shuffle=False,
        batch_fn=batch_fn,
    )
