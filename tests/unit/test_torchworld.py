"""torch.distributed's default group as the job's (`membership.torchworld`): installed, it answers torch's
own calls; removed, nothing of it stays in torch's tables; a script's own default group is never replaced."""

from __future__ import annotations

import datetime

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from slurm_elastic.worker.membership.torchworld import DefaultGroup


def tables_size() -> tuple[int, ...]:
    w = c10d._world
    return len(w.pg_map), len(w.pg_names), len(w.pg_group_ranks), len(w.pg_backend_config), len(w.pg_to_tag)


def test_installed_it_answers_torch_and_removed_it_leaves_nothing() -> None:
    assert not dist.is_initialized()
    before = tables_size()
    world = DefaultGroup()
    world.install(None, 0, 1, "cpu", None)
    try:
        assert dist.is_initialized() and (dist.get_rank(), dist.get_world_size()) == (0, 1)
        t = torch.tensor([3.0])
        dist.all_reduce(t)
        assert t.item() == 3.0
        world.install(None, 0, 1, "cpu", None)  # the next generation replaces it
        assert dist.is_initialized() and tables_size()[0] == before[0] + 1
    finally:
        world.remove()
    assert not dist.is_initialized() and tables_size() == before
    world.remove()  # twice: nothing to do


def test_a_scripts_own_default_group_is_kept() -> None:
    store = dist.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        own = c10d._get_default_group()
        world = DefaultGroup()
        world.install(None, 0, 1, "cpu", None)
        assert c10d._get_default_group() is own and not world.installed
        world.remove()
        assert c10d._get_default_group() is own
    finally:
        dist.destroy_process_group()
