"""What one rank of a sharded (FSDP2) job holds: its own shard of every parameter and optimizer moment, and
a mirror of the shard of the rank it mirrors (its "ward", on another node), kept at the same step.

The mirror is a second sharded instance, as HyperPod keeps one, placed like Gemini's buddy copies: each
step, once its gradients are reduced, a rank sends its gradient shard to the rank mirroring it, and both
apply the same optimizer update to their copy of the shard (AdamW is elementwise: the same bits). So the
mirror costs a point-to-point send of one gradient shard and a second optimizer update on one shard per
step, and the memory of one more shard of parameters and moments; it is never stale, and a step commits
on both copies or on neither (`decide.heal`). A digest of each copy is taken at every commit, so a copy
that changed since (bad memory, a stray write) is refused when it would serve a peer.
"""

from __future__ import annotations

import copy
from collections import OrderedDict, defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from slurm_elastic.decide.shardlayout import Layout
from slurm_elastic.errors import ConfigError, UsageError
from slurm_elastic.worker.checkpoints import userstate
from slurm_elastic.worker.checkpoints.state import from_json, to_json
from slurm_elastic.worker.lossscale import LossScaling
from slurm_elastic.worker.membership.comm import Group
from slurm_elastic.worker.phases import PhaseHooks
from slurm_elastic.worker.sharded.checksum import digest
from slurm_elastic.worker.sharded.collectives import StepCollectives, install
from slurm_elastic.worker.sharded.mesh import GenerationMesh
from slurm_elastic.worker.sharded.remesh import Entry, entries, fsdp_params, local, sharded_state_keys


@dataclass
class Pending:
    """The reduced gradients of step `step`, held between the gradient exchange and the commit."""

    step: int
    own: list[torch.Tensor]  # this rank's gradient rows, one per parameter (canonical order)
    mirror: list[torch.Tensor] | None  # its ward's


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ConfigError(
                f"optimizer state {where} is a tensor of shape {tuple(value.shape)} not shaped like its parameter"
            )
        return {"__scalar__": value.item(), "dtype": str(value.dtype).removeprefix("torch.")}
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v, f"{where}.{k}") for k, v in value.items()}
    raise ConfigError(f"cannot transfer {type(value).__name__} at {where}: expected numbers, strings or scalars")


def _unplain(value: Any) -> Any:
    if isinstance(value, dict) and "__scalar__" in value:
        return torch.tensor(value["__scalar__"], dtype=getattr(torch, value["dtype"]))
    if isinstance(value, dict):
        return {k: _unplain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unplain(v) for v in value]
    return value


class ShardedReplica:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        scheduler: Any | None,
        extra: dict[str, Any] | None = None,
        *,
        phases: PhaseHooks,
        scaling: LossScaling | None = None,
    ) -> None:
        self.model, self.optimizer, self.scheduler = model, optimizer, scheduler
        self.scaling = scaling  # float16's gradient scaler, whose scale is part of the replicated state
        self.extra: dict[str, Any] = extra if extra is not None else {}  # the user's dict, restored in place
        self.params = fsdp_params(model)  # fqn -> FSDPParam: stable objects, re-meshed in place
        self.step = 0
        self.cursor = 0
        self.reference_world: int | None = None
        self.global_batch: int | None = None  # set by the first generation when the script gave no batch policy
        self.step_fn: Callable[[], Any] = optimizer.step  # the real step (the script's own may be a no-op)
        self.fresh = True
        self.world, self.index, self.ward = 1, 0, -1  # the layout held: its own shard, the one it mirrors
        self.wards: tuple[int, ...] | None = None
        self.shard_group_wanted: int | None = None  # HSDP's shard group size, as the script asked for it
        self.layout: Layout | None = None  # the generation's (None until the first one formed)
        self.shards: Group | None = None  # this rank's shard group (FSDP2's collectives) in the generation
        self.replicas: Group | None = None  # the ranks holding the same shard (HSDP's gradient sum)
        self.keys: dict[str, list[str]] = {fqn: [] for fqn in self.params}
        self.mirror_params: dict[str, nn.Parameter] = {}
        self.mirror_opt: torch.optim.Optimizer | None = None
        self.pending: Pending | None = None
        self.digests = (0, 0)  # own, mirror: taken when `step` was committed
        self.sealed: list[tuple[int, int, int]] | None = None  # where each own tensor was then (`seal`)
        self.last_norm2, self.last_lr_factor = 0.0, 1.0
        self.collectives: StepCollectives | None = None
        self.mesh: GenerationMesh | None = None  # the generation's mesh the model is on (None: the script's own)
        self.clip: float | None = None
        self.checkpoint_dir: Path | None = None  # where a job that starts fresh finds its sharded checkpoints
        self.phases = phases  # where tests act: e.g. on what this rank sends when re-sharding (worker.phases)
        self.on_refused: Callable[[str], None] | None = None  # one event per refused copy or transfer
        install(model, self._current_collectives)

    def _current_collectives(self) -> StepCollectives:
        if self.collectives is None:
            raise ConfigError("the sharded model ran outside a step: call it inside job.steps()/job.micro_batches()")
        return self.collectives

    @property
    def committed_step(self) -> int:
        return -1 if self.fresh else self.step

    @property
    def first_replica(self) -> bool:
        """Whether this rank is in the first replica group: the one that writes checkpoints and counts norms."""
        return self.replicas is None or self.replicas.rank == 0

    # --- the tensors held -----------------------------------------------------------------------------

    def entries(self) -> list[Entry]:
        return entries(self.params, self.optimizer, self.keys)

    def held(self, entry: Entry) -> torch.Tensor:
        """The parameter or optimizer state as the script sees it (a DTensor)."""
        param = self.params[entry.fqn].sharded_param
        return param if entry.key == "param" else cast(torch.Tensor, self.optimizer.state[param][entry.key])

    def own(self, entry: Entry) -> torch.Tensor:
        return local(self.held(entry))

    def mirrored(self, entry: Entry) -> torch.Tensor:
        param = self.mirror_params[entry.fqn]
        if entry.key == "param":
            return param.data
        assert self.mirror_opt is not None
        return cast(torch.Tensor, self.mirror_opt.state[param][entry.key])

    def copies(self) -> dict[str, tuple[int, int, dict[int, torch.Tensor]]]:
        """What this rank can serve: role -> (world, shard index, rows per entry index)."""
        listed = self.entries()
        out = {"primary": (self.world, self.index, {i: self.own(e) for i, e in enumerate(listed)})}
        if self.ward >= 0 and self.mirror_params:
            out["mirror"] = (self.world, self.ward, {i: self.mirrored(e) for i, e in enumerate(listed)})
        return out

    def take_digests(self) -> tuple[int, int]:
        listed = self.entries()
        own = digest(self.own(e) for e in listed)
        mirror = digest(self.mirrored(e) for e in listed) if self.ward >= 0 and self.mirror_params else 0
        return own, mirror

    def seal(self) -> None:
        """The state held is the committed (or installed) one: take its digests, and note where each own
        tensor lies and how often it was written, which the next step checks (`check_sealed`)."""
        self.digests = self.take_digests()
        self.sealed = self._whereabouts()

    def _whereabouts(self) -> list[tuple[int, int, int]]:
        """Per own tensor: its storage, and the write counts of it and of its DTensor (an in-place op on a
        DTensor counts on the DTensor only; the job's own optimizer steps write the local rows)."""
        return [(local(t).data_ptr(), local(t)._version, t._version) for t in map(self.held, self.entries())]

    def self_check(self) -> tuple[bool, bool]:
        """Whether each copy is still what was committed (always true before the first commit)."""
        if self.fresh:
            return True, True
        own, mirror = self.take_digests()
        return own == self.digests[0], mirror == self.digests[1]

    # --- small, replicated state (JSON) ---------------------------------------------------------------

    def small_state(self) -> dict[str, Any]:
        state: dict[str, dict[str, Any]] = {}
        for fqn, fp in self.params.items():
            per = self.optimizer.state.get(fp.sharded_param, {})
            state[fqn] = {k: _plain(v, f"{fqn}.{k}") for k, v in per.items() if not isinstance(v, DTensor)}
        return {
            "progress": {
                "step": self.step,
                "cursor": self.cursor,
                "reference_world": self.reference_world,
                "global_batch": self.global_batch,
                "scaler": self.scaling.state() if self.scaling is not None else None,
            },
            "extra": to_json(userstate.capture(self.extra), "extra_state"),
            "groups": [
                _plain({k: v for k, v in g.items() if k != "params"}, "param_groups")
                for g in self.optimizer.param_groups
            ],
            "state": state,
            "keys": self.keys,
            "scheduler": _plain(self.scheduler.state_dict(), "scheduler") if self.scheduler is not None else None,
            "norm2": self.last_norm2,
            "lr_factor": self.last_lr_factor,
        }

    def set_small_state(self, small: dict[str, Any]) -> None:
        progress = small["progress"]
        self.step, self.cursor = int(progress["step"]), int(progress["cursor"])
        if progress.get("reference_world") is not None:
            self.reference_world = int(progress["reference_world"])
        if progress.get("global_batch") is not None:
            self.global_batch = int(progress["global_batch"])
        if self.scaling is not None:
            self.scaling.load(progress.get("scaler"))
        if small.get("extra"):
            userstate.restore(self.extra, from_json(small["extra"]))
        for group, saved in zip(self.optimizer.param_groups, small["groups"], strict=True):
            group.update(_unplain(saved))
        for fqn, fp in self.params.items():
            per = self.optimizer.state[fp.sharded_param]
            per.update(_unplain(small["state"].get(fqn, {})))
        if self.scheduler is not None and small["scheduler"] is not None:
            self.scheduler.load_state_dict(_unplain(small["scheduler"]))
        self.last_norm2, self.last_lr_factor = float(small["norm2"]), float(small["lr_factor"])
        self.fresh = False

    # --- one step -------------------------------------------------------------------------------------

    def check_sealed(self) -> None:
        """Refuse a step whose shards the script wrote since the last commit (a load of its own checkpoint
        inside the loop): their mirrors would not follow, and a recovery would bring back what it replaced."""
        if self.sealed is not None and self._whereabouts() != self.sealed:
            raise UsageError(
                "the sharded model or optimizer state was written between steps (a checkpoint loaded inside the "
                "loop?): the job's second copy of each shard would not follow it; load before ElasticJob(...) "
                "or pass resume_from="
            )

    def begin(self, collectives: StepCollectives) -> None:
        self.collectives = collectives
        self.pending = None
        for fp in self.params.values():
            fp.sharded_param.grad = None

    def grads(self) -> list[torch.Tensor]:
        out = []
        for fp in self.params.values():
            grad = fp.sharded_param.grad
            rows = local(fp.sharded_param)
            out.append(torch.zeros_like(rows) if grad is None else local(grad))
        return out

    def local_norm2(self, grads: list[torch.Tensor]) -> float:
        return float(sum(float(g.double().pow(2).sum()) for g in grads))

    def prepare(self, step: int, own: list[torch.Tensor], mirror: list[torch.Tensor] | None) -> None:
        self.pending = Pending(step, own, mirror)

    def commit(
        self, step: int, samples: int, norm2: float, clip: float | None, lr_factor: float, *, skip: bool = False
    ) -> None:
        """Apply step `step` to the own shard and the mirrored one, from the pending gradients. `skip`: the
        scheduler's step only (float16 gradients that overflowed on some rank, as GradScaler.step skips)."""
        pending = self.pending
        if pending is None or pending.step != step:
            raise ConfigError(f"no gradients of step {step} to commit")
        if not skip:
            self._optimizer_steps(pending, norm2, clip, lr_factor)
        if self.scheduler is not None:
            self.scheduler.step()
        for fp in self.params.values():
            fp.sharded_param.grad = None
        self.pending = None
        self.step, self.cursor, self.fresh = step, self.cursor + samples, False
        self.last_norm2, self.last_lr_factor = norm2, lr_factor
        self.learn_keys()
        self.seal()

    def learn_keys(self) -> None:
        """Which optimizer state is shaped like the parameters, once there is any: the first step makes it,
        or the script loaded its own checkpoint's before the job formed."""
        if not any(self.keys.values()):
            self.keys = sharded_state_keys(self.model, self.optimizer)

    def _optimizer_steps(self, pending: Pending, norm2: float, clip: float | None, lr_factor: float) -> None:
        coef = 1.0
        if clip is not None:
            coef = min(1.0, clip / (norm2**0.5 + 1e-6))
        hyper = [{k: v for k, v in g.items() if k != "params"} for g in self.optimizer.param_groups]
        for grad in pending.own:
            if coef != 1.0:
                grad.mul_(coef)
        if all(self.optimizer.state.get(fp.sharded_param) for fp in self.params.values()):
            shards = self._local_optimizer(pending.own)
            _optimizer_step(shards, lr_factor, shards.step)
        else:  # the first step creates the optimizer's (DTensor) state, as the script's optimizer would
            for fp, grad in zip(self.params.values(), pending.own, strict=True):
                fp.sharded_param.grad = fp.to_sharded_dtensor(grad) if not isinstance(grad, DTensor) else grad
            _optimizer_step(self.optimizer, lr_factor, self.step_fn)
        if self.mirror_opt is not None and pending.mirror is not None:
            for group, saved in zip(self.mirror_opt.param_groups, hyper, strict=True):
                group.update(saved)
            for param, grad in zip(self.mirror_params.values(), pending.mirror, strict=True):
                param.grad = grad.mul_(coef) if coef != 1.0 else grad
            _optimizer_step(self.mirror_opt, lr_factor, self.mirror_opt.step)
            for param in self.mirror_params.values():
                param.grad = None

    def _local_optimizer(self, grads: list[torch.Tensor]) -> torch.optim.Optimizer:
        """The script's optimizer over this rank's local rows, which share storage with the DTensor parameters
        and moments: the update is the same elementwise arithmetic, without DTensor's dispatch, whose sharding
        propagation runs again on every new generation's mesh (0.15 s of a 0.16 s optimizer step measured).
        Built at each commit, so it always sees the current tensors; the script's step hooks do not run."""
        group_of = {id(p): i for i, g in enumerate(self.optimizer.param_groups) for p in g["params"]}
        groups: list[dict[str, Any]] = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": []} for g in self.optimizer.param_groups
        ]
        opt = _clone_optimizer(self.optimizer, groups)
        for fp, grad in zip(self.params.values(), grads, strict=True):
            param = fp.sharded_param
            rows = local(param).detach()  # a leaf over the same storage
            rows.grad = grad
            groups[group_of[id(param)]]["params"].append(rows)
            state = self.optimizer.state[param]  # scalars (the step counter) shared, updated in place
            opt.state[rows] = {k: local(v) if isinstance(v, DTensor) else v for k, v in state.items()}
        return opt

    # --- a new layout ---------------------------------------------------------------------------------

    def set_mirror(self, ward: int, rows: dict[tuple[str, str], torch.Tensor]) -> None:
        """Hold shard `ward` (rows per (fqn, key)) as a mirror, with an optimizer like the user's over it."""
        self.ward = ward
        if ward < 0:
            self.mirror_params, self.mirror_opt = {}, None
            return
        self.mirror_params = {fqn: nn.Parameter(rows[(fqn, "param")], requires_grad=False) for fqn in self.params}
        group_of = {id(p): i for i, g in enumerate(self.optimizer.param_groups) for p in g["params"]}
        groups: list[dict[str, Any]] = [
            {**{k: v for k, v in g.items() if k != "params"}, "params": []} for g in self.optimizer.param_groups
        ]
        for fqn, fp in self.params.items():
            groups[group_of[id(fp.sharded_param)]]["params"].append(self.mirror_params[fqn])
        opt = _clone_optimizer(self.optimizer, groups)
        for fqn, fp in self.params.items():
            main = self.optimizer.state.get(fp.sharded_param, {})
            state: dict[str, Any] = {
                k: v.clone() if isinstance(v, torch.Tensor) else v
                for k, v in main.items()
                if not isinstance(v, DTensor)
            }
            for key in self.keys.get(fqn, []):
                state[key] = rows[(fqn, key)]
            if state:
                opt.state[self.mirror_params[fqn]] = state
        self.mirror_opt = opt


def _optimizer_step(optimizer: torch.optim.Optimizer, lr_factor: float, step: Callable[[], Any]) -> None:
    if lr_factor == 1.0:
        step()
        return
    saved = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * lr_factor
    try:
        step()
    finally:
        for group, lr in zip(optimizer.param_groups, saved, strict=True):
            group["lr"] = lr


def _clone_optimizer(optimizer: torch.optim.Optimizer, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """An optimizer of the same class and settings over other parameters, without the original's hooks."""
    clone = copy.copy(optimizer)
    for own in ("step", "zero_grad"):  # the job's guard (optguard) binds these to the original: drop them
        clone.__dict__.pop(own, None)
    clone.state = defaultdict(dict)
    clone.param_groups = groups
    for name in ("_optimizer_step_pre_hooks", "_optimizer_step_post_hooks"):
        if hasattr(optimizer, name):
            setattr(clone, name, OrderedDict())
    return clone


__all__ = ["Pending", "ShardedReplica"]
