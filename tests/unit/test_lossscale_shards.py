"""The gradient scaler's sharded path (worker.lossscale): each rank unscales its own gradient shard, and the
scale follows the overflow the ranks agreed on by GradScaler.update's own rule. Checked against torch's
GradScaler driven through its own unscale_ and update on the same sequence of steps."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastic.worker.lossscale import LossScaling


def scaling(**kwargs: float) -> LossScaling:
    scaler = torch.amp.GradScaler("cpu", **kwargs)  # type: ignore[arg-type]
    scaler.scale(torch.ones(()))  # the scale exists once the first loss was scaled
    return LossScaling(scaler, in_loop=lambda: False, ignored=lambda _name: None)


def torch_after(overflows: list[bool], **kwargs: float) -> dict[str, float]:
    """GradScaler's own state after these steps: unscale_ of a gradient that is inf where a step overflowed."""
    scaler = torch.amp.GradScaler("cpu", **kwargs)  # type: ignore[arg-type]
    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.0)
    for overflowed in overflows:
        scaler.scale(torch.ones(()))
        param.grad = torch.full((2,), float("inf") if overflowed else 1.0)
        scaler.unscale_(opt)
        scaler.update()
    return scaler.state_dict()


@settings(max_examples=200, deadline=None)
@given(
    overflows=st.lists(st.booleans(), max_size=30),
    growth_interval=st.integers(1, 5),
    growth_factor=st.sampled_from([2.0, 1.5, 3.0]),
    backoff_factor=st.sampled_from([0.5, 0.25, 0.7]),
    init_scale=st.sampled_from([2.0**16, 3.0, 2.0**127]),
)
def test_the_agreed_update_follows_gradscaler_exactly(
    overflows: list[bool], growth_interval: int, growth_factor: float, backoff_factor: float, init_scale: float
) -> None:
    kwargs = {"init_scale": init_scale, "growth_factor": growth_factor, "backoff_factor": backoff_factor}
    ours = scaling(growth_interval=growth_interval, **kwargs)
    for overflowed in overflows:
        ours.update_agreed(overflowed)
    assert ours.state() == torch_after(overflows, growth_interval=growth_interval, **kwargs)


def test_a_shard_is_unscaled_in_place_and_an_overflow_is_reported() -> None:
    ours = scaling(init_scale=4.0)
    clean = [torch.tensor([4.0, 8.0]), torch.tensor([-2.0])]
    assert ours.unscale_shards(clean)
    assert [g.tolist() for g in clean] == [[1.0, 2.0], [-0.5]]
    assert not ours.unscale_shards([torch.tensor([1.0]), torch.tensor([float("nan")])])
    assert not ours.unscale_shards([torch.tensor([float("inf")])])
    assert ours.unscale_shards([])  # an empty shard (more ranks than rows) is clean
