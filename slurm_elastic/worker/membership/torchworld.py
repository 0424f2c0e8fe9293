"""torch.distributed's default process group, kept as this process's current generation.

A script's helpers ask torch, not the job: `dist.get_rank()`, `dist.get_world_size()`, DCP's state-dict,
save and load functions, DTensor and logging libraries all look up the default group. The job forms a group
of its own for each generation (`runtime`); while a generation stands, its backend is also torch's default
group (wrapped and registered the way `init_process_group` registers one), and it is taken out before that
group is abandoned, so the default never points at a dead group. Between generations there is none.

Only where one rank lives in the process: ranks that are threads of one process (tests) share torch's
globals, and a script that formed a default group of its own keeps it.
"""

from __future__ import annotations

import contextlib
from typing import Any, cast

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from slurm_elastic.logs import get_logger
from slurm_elastic.worker.membership.registered import RegisteredGroup, register

log = get_logger("slurm_elastic.worker")


class DefaultGroup:
    """Installs a generation's group as torch's default one, and takes it out again."""

    def __init__(self) -> None:
        self._installed: RegisteredGroup | None = None
        self._warned = False

    @property
    def installed(self) -> bool:
        return self._installed is not None

    def install(self, backend: Any, rank: int, world: int, device_type: str, store: Any) -> None:
        """Make `backend` (a generation's gloo or NCCL backend; None for a world of one) torch's default group.
        `store` backs `dist.new_group()` calls the script makes (None: a store of this process only)."""
        self.remove()
        if dist.is_initialized():  # the script's own init_process_group: not ours to replace
            self._warn_once("default_group_kept", "the script initialized torch.distributed itself")
            return
        try:
            held = register(backend, rank, world, device_type, "world")
            self._into_torch(held, world, device_type, store)
        except (AttributeError, RuntimeError, TypeError) as exc:  # a torch without these private helpers
            self._warn_once("default_group_unavailable", f"this torch lacks what registers it: {exc}"[:300])
            return
        self._installed = held

    @staticmethod
    def _into_torch(held: RegisteredGroup, world: int, device_type: str, store: Any) -> None:
        """Torch's tables, as `init_process_group` fills them for its default group."""
        pg, name = held.group, held.name
        kind = "nccl" if device_type == "cuda" else "gloo"
        world_ = c10d._world
        world_.pg_map[pg] = (kind, store if store is not None else dist.HashStore())
        world_.pg_names[pg] = cast(Any, name)
        world_.pg_group_ranks[pg] = {i: i for i in range(world)}
        world_.pg_backend_config[pg] = f"{device_type}:{kind}"
        world_.pg_to_tag[pg] = f"ptd:{name}"
        world_.tags_to_pg.setdefault(f"ptd:{name}", []).append(pg)
        world_.tags_to_pg.setdefault("", []).append(pg)
        c10d._update_default_pg(pg)

    def _warn_once(self, event: str, why: str) -> None:
        if not self._warned:
            self._warned = True
            log.warning(event, why=why)

    def remove(self) -> None:
        """Take the installed group out of torch's globals (a script's `destroy_process_group()` may have)."""
        held, self._installed = self._installed, None
        if held is None:
            return
        pg, world_ = held.group, c10d._world
        if world_.default_pg is pg:
            c10d._update_default_pg(None)
        for table in (world_.pg_map, world_.pg_names, world_.pg_group_ranks, world_.pg_backend_config):
            table.pop(pg, None)
        tag = world_.pg_to_tag.pop(pg, None)
        for key in (tag, ""):
            with contextlib.suppress(KeyError, ValueError):
                world_.tags_to_pg[key or ""].remove(pg)
        held.close()


__all__ = ["DefaultGroup"]
