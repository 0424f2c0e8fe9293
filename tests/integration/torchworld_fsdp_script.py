"""An FSDP2 script with its own DCP checkpointer, as the public FSDP2 examples write it: after the loop every
rank calls DCP's `get_model_state_dict`/`get_optimizer_state_dict` and `dcp.save` (which ask
torch.distributed's default group), and rank 0 also writes the full state dict (`full_tensor()` gathers) for
comparison. `--load DIR` loads such a checkpoint before training (`dcp.load` and `set_model_state_dict`/
`set_optimizer_state_dict`, as the examples resume) and goes on from step `--start-step`.
`--gates STEP:FILE,...` makes every rank wait before step STEP until FILE exists (saying `at gate STEP`)."""

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))

import slurm_elastic as se
from llama_model import Llama, Sequences


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--dcp", type=Path, required=True)
    parser.add_argument("--full", type=Path, required=True)
    parser.add_argument("--gates", default="")
    parser.add_argument("--load", type=Path)
    parser.add_argument("--start-step", type=int, default=0)
    args = parser.parse_args()
    gates = [(int(step), Path(path)) for step, path in (g.split(":", 1) for g in args.gates.split(",") if g)]
    mesh = se.placeholder_mesh()
    torch.manual_seed(0)
    model = Llama(vocab=64, dim=32, layers=2, heads=4)
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    if args.load:  # on every rank, before the job: the model is still whole on the placeholder mesh
        state = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
        dcp.load(state, checkpoint_id=args.load)
        set_model_state_dict(model, state["model"])
        set_optimizer_state_dict(model, optimizer, state["optim"])
    data = Sequences(512, seed=0)
    job = se.ElasticJob(model, optimizer, dataset=data, micro_batch=4, global_batch=24, start_step=args.start_step)
    for x, y in job.micro_batches(args.steps):
        for step, gate in gates:
            if job.step + 1 >= step and not gate.exists():
                print(f"at gate {step}", flush=True)  # out of every collective: a peer may die now
            while job.step + 1 >= step and not gate.exists():
                time.sleep(0.02)
        job.backward(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))

    own = {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optimizer)}
    dcp.save(own, checkpoint_id=args.dcp)  # every rank: its shards
    full = {name: value.full_tensor() for name, value in model.state_dict().items()}
    if dist.get_rank() == 0:
        torch.save(full, args.full)
    print(f"saved by rank {dist.get_rank()} of {dist.get_world_size()}", flush=True)


if __name__ == "__main__":
    main()
