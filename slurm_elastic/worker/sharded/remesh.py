"""Move a `fully_shard`-ed model and its optimizer onto another generation's mesh, in place.

FSDP2 fixes a parameter's sharding when `fully_shard` runs: its shard's rows, the padded buffer the
all-gather reads, the DTensor spec. When the world size changes, each `FSDPParam` is re-initialised for the
new mesh from a meta tensor of the parameter's full shape (nothing is all-gathered or materialised), and
its new local rows, received from peers, are installed in a fresh padded buffer. The optimizer's
parameters and its sharded state (AdamW's moments) are re-pointed to the new DTensors.

What the model is as the user wrote it (which modules are FSDP units, mixed precision, resharding after
forward) is kept. Limits: a 1-D mesh (HSDP's replica groups are the library's, see `decide.shardlayout`),
`reshard_after_forward` True or False (not an int), no CPU offload, dim-0 sharding (no
`shard_placement_fn`); `entries` refuses anything else by name.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp._fully_shard._fsdp_api import CPUOffloadPolicy
from torch.distributed.fsdp._fully_shard._fsdp_common import FSDPMeshInfo, HSDPMeshInfo
from torch.distributed.fsdp._fully_shard._fsdp_param import FSDPParam
from torch.distributed.tensor import DTensor

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.sharded.collectives import fsdp_modules
from slurm_elastic.worker.sharded.mesh import wanted_shard_group


@dataclass(frozen=True)
class Entry:
    """One sharded tensor of the training state: a parameter ("param") or one of its optimizer moments."""

    fqn: str
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def row_numel(self) -> int:
        return math.prod(self.shape[1:])

    @property
    def row_bytes(self) -> int:
        return self.row_numel * self.dtype.itemsize

    def to_json(self) -> list[Any]:
        return [self.fqn, self.key, list(self.shape), str(self.dtype).removeprefix("torch.")]

    @classmethod
    def from_json(cls, data: list[Any]) -> Entry:
        fqn, key, shape, dtype = data
        found = getattr(torch, str(dtype), None)
        if not isinstance(found, torch.dtype):
            raise ConfigError(f"invalid dtype {dtype!r} for {fqn}.{key} in a peer's state layout")
        return cls(str(fqn), str(key), tuple(int(s) for s in shape), found)


def fsdp_params(model: nn.Module) -> dict[str, FSDPParam]:
    """Every FSDP2-managed parameter by its name in `model.named_parameters()`, checked for what remesh supports."""
    by_id: dict[int, FSDPParam] = {}
    for module in fsdp_modules(model):
        for group in module._get_fsdp_state()._fsdp_param_groups:
            if isinstance(group.mesh_info, HSDPMeshInfo) or not isinstance(group.mesh_info, FSDPMeshInfo):
                raise ConfigError(
                    "elastic FSDP2 shards on placeholder_mesh(), a 1-D mesh: for HSDP pass "
                    "placeholder_mesh(shard_group=N) instead of a 2-D mesh; replicate() (DDP) meshes are not supported"
                )
            post = group.post_forward_mesh_info
            if post is not None and post is not group.mesh_info:
                raise ConfigError("elastic FSDP2 needs reshard_after_forward=True or False, not an int")
            if isinstance(group.offload_policy, CPUOffloadPolicy):
                raise ConfigError("elastic FSDP2 does not support CPUOffloadPolicy yet")
            for fp in group.fsdp_params:
                if fp.fsdp_placement.dim != 0:
                    raise ConfigError(f"elastic FSDP2 shards on dim 0 only; found {fp.fsdp_placement}")
                by_id[id(fp.sharded_param)] = fp
    named = {name: by_id[id(p)] for name, p in model.named_parameters() if id(p) in by_id}
    missing = [name for name, p in model.named_parameters() if id(p) not in by_id]
    if missing:
        raise ConfigError(f"parameters not sharded by fully_shard: {missing[:5]}; apply fully_shard to the root")
    return named


def shard_group_wanted(model: nn.Module) -> int | None:
    """The HSDP shard group size the script's placeholder meshes ask for (None: plain FSDP2), the same for all."""
    asked = {
        wanted_shard_group(group.mesh_info.mesh)
        for module in fsdp_modules(model)
        for group in module._get_fsdp_state()._fsdp_param_groups
    }
    if len(asked) > 1:
        found = sorted(asked, key=lambda v: -1 if v is None else v)
        raise ConfigError(f"the model's fully_shard meshes ask for different shard groups {found}: use one mesh")
    return next(iter(asked), None)


def is_sharded(model: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in model.parameters())


def local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def entries(
    params: dict[str, FSDPParam], optimizer: torch.optim.Optimizer, state_keys: dict[str, list[str]]
) -> list[Entry]:
    """The sharded tensors in a fixed order: each parameter (`fsdp_params`), then its sharded optimizer state by key."""
    out = []
    for fqn, fp in params.items():
        shape, dtype = tuple(fp._orig_size), fp.sharded_param.dtype
        out.append(Entry(fqn, "param", shape, dtype))
        for key in state_keys.get(fqn, []):
            state = optimizer.state.get(fp.sharded_param, {}).get(key)
            out.append(Entry(fqn, key, shape, state.dtype if isinstance(state, torch.Tensor) else dtype))
    return out


def sharded_state_keys(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, list[str]]:
    """Per parameter, the optimizer state entries shaped like it (sharded like it): AdamW's moments."""
    keys: dict[str, list[str]] = {}
    for fqn, fp in fsdp_params(model).items():
        state = optimizer.state.get(fp.sharded_param, {})
        keys[fqn] = sorted(k for k, v in state.items() if isinstance(v, DTensor))
    return keys


def rebind(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    mesh_info_of: Any,
    rows: dict[tuple[str, str], torch.Tensor],
) -> None:
    """Re-shard every FSDP2 parameter onto the mesh `mesh_info_of()` describes, with local rows `rows[(fqn,
    key)]` (exactly this rank's rows of the new layout) for the parameters and their optimizer state."""
    params = fsdp_params(model)
    for module in fsdp_modules(model):
        state = module._get_fsdp_state()
        if state._is_root:
            module.reset_iter_state()
        module.reshard()
    info: FSDPMeshInfo = mesh_info_of()
    old_to_new: dict[int, nn.Parameter] = {}
    groups_done: set[int] = set()
    for module in fsdp_modules(model):
        for group in module._get_fsdp_state()._fsdp_param_groups:
            if id(group) in groups_done:
                continue
            groups_done.add(id(group))
            keep_post = group.post_forward_mesh_info is not None
            group.mesh_info = info
            group.post_forward_mesh_info = info if keep_post else None
    for fqn, fp in params.items():
        old = fp.sharded_param
        meta = nn.Parameter(torch.empty(fp._orig_size, dtype=old.dtype, device="meta"), requires_grad=old.requires_grad)
        fp.post_forward_mesh_info = info if fp.post_forward_mesh_info is not None else None
        fp._init_sharded_param(meta, fp.device, None, info)
        if fp.post_forward_mesh_info is not None:
            fp._init_sharded_post_forward_param_metadata(meta)
        fp.all_gather_outputs = []
        if hasattr(fp, "_unsharded_param"):
            del fp._unsharded_param
        mine = rows[(fqn, "param")]
        n = fp.sharded_size[0]
        if mine.shape != fp.sharded_size:
            raise ValueError(
                f"{fqn}: received rows of shape {tuple(mine.shape)}, the new shard is {tuple(fp.sharded_size)}"
            )
        padded = torch.zeros(fp.padded_sharded_param_size, dtype=old.dtype, device=fp.device)
        padded.narrow(0, 0, n).copy_(mine)
        fp._sharded_param_data = padded.view(-1)
        new = nn.Parameter(fp.to_sharded_dtensor(padded.narrow(0, 0, n)), requires_grad=old.requires_grad)
        fp.sharded_param = new
        fp._setattr_on_modules(new)
        old_to_new[id(old)] = new
        state = optimizer.state.pop(old, {})
        moved = {key: value for key, value in state.items() if not isinstance(value, DTensor)}
        for (name, key), value in rows.items():
            if name == fqn and key != "param":
                moved[key] = fp.to_sharded_dtensor(value)
        if moved:
            optimizer.state[new] = moved
    for param_group in optimizer.param_groups:
        param_group["params"] = [old_to_new.get(id(p), p) for p in param_group["params"]]


__all__ = [
    "Entry",
    "entries",
    "fsdp_params",
    "is_sharded",
    "local",
    "rebind",
    "shard_group_wanted",
    "sharded_state_keys",
]
