"""A small synthetic data set for the Trainer examples (no download): a fixed random linear map plus noise."""

import torch
from torch.utils.data import Dataset


class RegressionData(Dataset):
    """`size` samples (x, y) with y = x @ w + noise; seeded, so every rank builds the same data set."""

    def __init__(self, size: int, dim: int = 20) -> None:
        g = torch.Generator().manual_seed(1234)
        self.x = torch.randn(size, dim, generator=g)
        self.y = self.x @ torch.randn(dim, 1, generator=g) + 0.1 * torch.randn(size, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x[i], self.y[i]
