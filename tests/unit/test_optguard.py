"""The script's optimizer.step()/zero_grad() are no-ops inside the job's loop, and an LR scheduler built
before the job neither warns nor misses a step."""

from __future__ import annotations

import warnings

import torch

from slurm_elastic.worker.optguard import guard_optimizer


def test_a_scheduler_built_before_the_guard_sees_the_real_steps_without_warning() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    in_loop, ignored = [True], []
    real_step = guard_optimizer(optimizer, lambda: in_loop[0], ignored.append)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.detach().clone()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "optimizer.step() has been overridden", "called before" and the like
        optimizer.step()  # the script's own call inside the loop: ignored
        assert torch.equal(model.weight, before) and ignored == ["optimizer.step"]
        real_step()  # the job's step
        scheduler.step()
    assert not torch.equal(model.weight, before)
    assert scheduler.get_last_lr() == [0.5]
    in_loop[0] = False
    optimizer.step()  # outside the loop the script's call steps as usual
    assert ignored == ["optimizer.step"]
