"""A small character-level transformer and its data, shared by the plain and the elastic example."""

from __future__ import annotations

import argparse
import math
import os

import torch
import torch.nn.functional as F
from torch import nn

from slurm_elastic.data import TokenDataset


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        p = self.dropout if self.training else 0.0
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.norm2(x))


class CharTransformer(nn.Module):
    def __init__(self, vocab: int, seq_len: int, dim: int = 64, layers: int = 2, heads: int = 4, dropout: float = 0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq_len, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads, dropout) for _ in range(layers)])
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.norm(self.blocks(self.tok(idx) + self.pos(pos))))


def lr_schedule(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, total - warmup))))

    return factor


def save(model: nn.Module, path: str) -> None:
    """Write the model's state dict (unwrapped from DDP, if wrapped)."""
    torch.save(getattr(model, "module", model).state_dict(), path)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description="train a small character-level transformer")
    p.add_argument("--data", required=True, help="directory made by `slurm-elastic prepare-data`")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--global-batch", type=int, default=32)
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--save", default=None, help="write the final model's state dict here (rank 0)")
    p.add_argument("--device", type=pick_device, default="auto", help="cpu, cuda, cuda:N, or auto: this process's GPU, else the CPU")  # fmt: skip # noqa: E501
    return p.parse_args()


def pick_device(requested: str) -> torch.device:
    """`auto`: the GPU of this process's LOCAL_RANK (as torchrun and slurm-elastic number them) where there are
    GPUs, else the CPU. A GPU becomes the current one, where the process groups' tensors go."""
    if requested == "auto":
        if not torch.cuda.is_available():
            return torch.device("cpu")
        requested = f"cuda:{int(os.environ.get('LOCAL_RANK', 0)) % torch.cuda.device_count()}"
    try:
        device = torch.device(requested)
    except RuntimeError:
        raise argparse.ArgumentTypeError(f"{requested!r} is not a device: use cpu, cuda, cuda:N or auto") from None
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return device


def build(
    args: argparse.Namespace,
) -> tuple[TokenDataset, CharTransformer, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(args.seed)
    data = TokenDataset(args.data, args.seq_len)
    model = CharTransformer(data.vocab_size, args.seq_len, args.dim, args.layers, args.heads).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_schedule(args.warmup, args.steps))
    return data, model, optimizer, scheduler
