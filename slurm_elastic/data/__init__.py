"""Exactly-once data: the global sample order, the committed cursor and a character-level token data set.

`TokenDataset` imports torch (about 1.5 s); it is loaded on first use so that `prepare-data` and the
order/cursor arithmetic stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from slurm_elastic.data.order import Cursor, SampleOrder
from slurm_elastic.data.prepare import PrepareReport, default_corpus, prepare_data

if TYPE_CHECKING:
    from slurm_elastic.data.tokens import TokenDataset

__all__ = ["Cursor", "PrepareReport", "SampleOrder", "TokenDataset", "default_corpus", "prepare_data"]


def __getattr__(name: str) -> Any:
    if name == "TokenDataset":
        from slurm_elastic.data.tokens import TokenDataset

        return TokenDataset
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
