"""A character-level GPT trained the way popular single-file scripts do it (nanoGPT's train.py, for one):
DDP under torchrun when RANK is set, else one process; batches drawn as random windows of a memory-mapped
token file; gradient accumulation with `require_backward_grad_sync`; float16 with a GradScaler (by default
on CUDA; bfloat16 on CPU); an evaluation and a checkpoint of its own every few iterations; `--init-from resume`;
and a `while True` loop that breaks at max_iters (or after an evaluation only).

Its elastic version, examples/gpt_elastic.py, differs in 20 lines (`diff examples/gpt_plain.py
examples/gpt_elastic.py`): the job draws each micro-batch through the script's own get_batch with a
generator seeded by the batch's place in the run, hands the script's GradScaler the summed gradients, and
starts the data where the script's own checkpoint was taken. slurm-elastic sets no RANK, so the script's
one-process path runs and the job does the data parallelism.

    slurm-elastic prepare-data --out data/stdlib
    torchrun --nproc-per-node 2 examples/gpt_plain.py --data data/stdlib --out-dir out
    slurm-elastic run --local --nodes 2 -- python examples/gpt_elastic.py --data data/stdlib --out-dir out
"""

import argparse
import json
import math
import os
from contextlib import nullcontext

import numpy as np
import torch
import torch.nn.functional as F
from torch.distributed import destroy_process_group, init_process_group
from torch.nn.parallel import DistributedDataParallel as DDP

import slurm_elastic as se
from char_model import CharTransformer

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--data", required=True, help="a directory made by `slurm-elastic prepare-data`")
p.add_argument("--out-dir", default="out")
p.add_argument("--init-from", default="scratch", choices=["scratch", "resume"])
p.add_argument("--max-iters", type=int, default=200)
p.add_argument("--eval-interval", type=int, default=50)
p.add_argument("--eval-iters", type=int, default=10)
p.add_argument("--eval-only", action="store_true")
p.add_argument("--always-save-checkpoint", action="store_true")
p.add_argument("--batch-size", type=int, default=8)
p.add_argument("--block-size", type=int, default=64)
p.add_argument("--gradient-accumulation-steps", type=int, default=4)
p.add_argument("--learning-rate", type=float, default=3e-3)
p.add_argument("--warmup-iters", type=int, default=20)
p.add_argument("--lr-decay-iters", type=int, default=2000)
p.add_argument("--grad-clip", type=float, default=1.0)
p.add_argument("--seed", type=int, default=1337)
p.add_argument("--dtype", choices=["float16", "bfloat16"], default=None, help="default: float16 on CUDA, else bfloat16")
cfg = p.parse_args()
gradient_accumulation_steps, batch_size, block_size = cfg.gradient_accumulation_steps, cfg.batch_size, cfg.block_size

ddp = int(os.environ.get("RANK", -1)) != -1  # a torchrun run?
if ddp:
    init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    ddp_rank, ddp_local_rank, ddp_world_size = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
    device = f"cuda:{ddp_local_rank}" if torch.cuda.is_available() else "cpu"
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank  # each process gets a different seed
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    master_process, seed_offset, ddp_world_size = True, 0, 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
if device.startswith("cuda"):
    torch.cuda.set_device(device)
tokens_per_iter = gradient_accumulation_steps * ddp_world_size * batch_size * block_size
if master_process:
    print(f"tokens per iteration will be: {tokens_per_iter:,}")
    os.makedirs(cfg.out_dir, exist_ok=True)
torch.manual_seed(cfg.seed + seed_offset)
device_type = "cuda" if "cuda" in device else "cpu"
dtype = cfg.dtype or ("float16" if device_type == "cuda" else "bfloat16")  # float16 needs the GradScaler below
ptdtype = {"bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
ctx = nullcontext() if device_type == "mps" else torch.amp.autocast(device_type=device_type, dtype=ptdtype)

with open(os.path.join(cfg.data, "meta.json")) as f:
    meta = json.load(f)
tokens = np.memmap(os.path.join(cfg.data, "tokens.bin"), dtype=meta["dtype"], mode="r")
splits = {"train": tokens[: int(0.9 * len(tokens))], "val": tokens[int(0.9 * len(tokens)) :]}


def get_batch(split, generator=None):
    data = splits[split]
    ix = torch.randint(len(data) - block_size, (batch_size,), generator=generator)
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.stack([torch.from_numpy(data[i + 1 : i + 1 + block_size].astype(np.int64)) for i in ix])
    return x.to(device), y.to(device)


iter_num, best_val_loss = 0, 1e9
model = CharTransformer(len(meta["vocab"]), block_size, dim=64, layers=2, heads=4, dropout=0.0)
checkpoint = None
if cfg.init_from == "resume":
    checkpoint = torch.load(os.path.join(cfg.out_dir, "ckpt.pt"), map_location=device, weights_only=True)
    model.load_state_dict(checkpoint["model"])
    iter_num, best_val_loss = checkpoint["iter_num"], checkpoint["best_val_loss"]
model.to(device)
scaler = torch.amp.GradScaler(device_type, enabled=(dtype == "float16"))
optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=0.1)
if checkpoint is not None:
    optimizer.load_state_dict(checkpoint["optimizer"])
checkpoint = None  # free up memory
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank] if device_type == "cuda" else None)
raw_model = model.module if ddp else model
job = se.ElasticJob(model, optimizer, scaler=scaler, batch_fn=lambda g: get_batch("train", g), micro_batch=batch_size,
    global_batch=tokens_per_iter // block_size, clip_grad_norm=cfg.grad_clip, start_step=iter_num)  # fmt: skip


def loss_of(logits, targets):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(cfg.eval_iters)
        for k in range(cfg.eval_iters):
            X, Y = get_batch(split)
            with ctx:
                losses[k] = loss_of(model(X), Y).item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):  # linear warmup, then cosine decay to a tenth
    if it < cfg.warmup_iters:
        return cfg.learning_rate * (it + 1) / (cfg.warmup_iters + 1)
    ratio = min(1.0, (it - cfg.warmup_iters) / max(1, cfg.lr_decay_iters - cfg.warmup_iters))
    return cfg.learning_rate * (0.1 + 0.45 * (1.0 + math.cos(math.pi * ratio)))


for step in job.steps(cfg.max_iters + 1):
    iter_num = job.step
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % cfg.eval_interval == 0 and job.rank == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        if losses["val"] < best_val_loss or cfg.always_save_checkpoint:
            best_val_loss = losses["val"].item()
            if iter_num > 0:
                checkpoint = {
                    "model": raw_model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "iter_num": iter_num,
                    "best_val_loss": best_val_loss,
                }
                print(f"saving checkpoint to {cfg.out_dir}")
                torch.save(checkpoint, os.path.join(cfg.out_dir, "ckpt.pt"))
    if iter_num == 0 and cfg.eval_only:
        break
    for micro_step, (X, Y) in enumerate(step.micro_batches()):
        if ddp:  # sync gradients at the last micro step only
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        with ctx:
            loss = loss_of(model(X), Y)
        step.backward(scaler.scale(loss))
    if cfg.grad_clip != 0.0:
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    iter_num += 1
    if iter_num > cfg.max_iters:
        break

if ddp:
    destroy_process_group()
