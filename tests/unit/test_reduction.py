"""Bucketed, overlapped gradient reduction: buckets, accumulation modes, launch order, sums over real gloo ranks."""

from __future__ import annotations

import datetime
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from slurm_elastic.errors import ConfigError, ElasticError
from slurm_elastic.worker.membership.comm import Group, Interrupt
from slurm_elastic.worker.replicated.reduction import CONTROL_SLOTS, GradientReducer, reduce_dtype_of


def mlp(seed: int = 0, sizes: tuple[int, ...] = (8, 16, 16, 4)) -> nn.Sequential:
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def batches(n: int, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(5, 8, generator=g), torch.randn(5, 4, generator=g)) for _ in range(n)]


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return ((model(x) - y) ** 2).mean()


def reference_grads(
    model: nn.Module, data: list[tuple[torch.Tensor, torch.Tensor]], weights: list[float]
) -> list[torch.Tensor]:
    """sum_i w_i * grad(loss_i), each gradient computed alone, summed in float64."""
    total = [torch.zeros_like(p, dtype=torch.float64) for p in model.parameters()]
    for batch, w in zip(data, weights, strict=True):
        model.zero_grad(set_to_none=True)
        loss_of(model, batch).backward()
        for t, p in zip(total, model.parameters(), strict=True):
            assert p.grad is not None
            t += w * p.grad.double()
    model.zero_grad(set_to_none=True)
    return total


def run_step(
    red: GradientReducer, model: nn.Module, data: list[Any], weights: list[float], group: Group | None = None
) -> tuple[float, bool]:
    red.begin(group)
    for i, (batch, w) in enumerate(zip(data, weights, strict=True)):
        loss = loss_of(model, batch)
        closing = i == len(data) - 1
        red.add_control(loss, w, False if closing else None)
        red.backward(loss, w, closing=closing)
    return red.wait()


# --- buckets ----------------------------------------------------------------------------------------


def test_buckets_follow_reverse_registration_order_and_their_size_cap() -> None:
    model = mlp(sizes=(8, 64, 64, 4))  # weights of 512, 4096, 256 elements (and biases)
    params = list(model.parameters())
    red = GradientReducer(params, "float32", bucket_mb=4096 * 4 / 2**20)  # 4096 float32 elements per bucket
    order = [s.param for b in red.buckets for s in b.slots]
    assert order == list(reversed(params))
    for b in red.buckets[:-1]:
        assert b.numel * 4 >= 4096 * 4 or b is red.buckets[-1]
    assert [b.control for b in red.buckets] == [False] * (len(red.buckets) - 1) + [True]
    assert red.buckets[-1].acc.numel() == red.buckets[-1].numel + CONTROL_SLOTS
    assert sum(b.numel for b in red.buckets) == sum(p.numel() for p in params)


def test_one_bucket_when_it_fits_and_a_bad_setting_is_refused() -> None:
    assert GradientReducer(list(mlp().parameters()), "float32").bucket_count == 1
    with pytest.raises(ConfigError, match="bucket_mb"):
        GradientReducer(list(mlp().parameters()), "float32", bucket_mb=0)
    with pytest.raises(ConfigError, match=r"float16.*float32, bfloat16, float64"):
        reduce_dtype_of("float16")


# --- accumulation, one rank ---------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_one_rank_gets_the_weighted_sum_of_its_micro_batches(dtype: str) -> None:
    model, data, weights = mlp(), batches(3), [0.25, 0.25, 0.5]
    want = reference_grads(model, data, weights)
    red = GradientReducer(list(model.parameters()), dtype, bucket_mb=0.001)  # type: ignore[arg-type]
    loss, change = run_step(red, model, data, weights)
    tol = {"float64": 1e-7, "float32": 1e-6, "bfloat16": 1e-2}[dtype]
    for p, w in zip(model.parameters(), want, strict=True):
        assert p.grad is not None and p.grad.dtype == p.dtype
        if dtype == "float64":  # the same float64 sum, rounded once to the parameter's dtype
            assert torch.equal(p.grad, w.to(p.dtype))
        assert torch.allclose(p.grad.double(), w, rtol=tol, atol=tol * w.abs().max().item())
    expected_loss = sum(w * loss_of(model, b).item() for b, w in zip(data, weights, strict=True))
    assert loss == pytest.approx(expected_loss, rel=tol * 10) and change is False


def test_fast_mode_gradients_are_views_of_the_bucket_and_survive_zero_grad_between_micro_batches() -> None:
    model, data, weights = mlp(), batches(2), [0.5, 0.5]
    want = reference_grads(model, data, weights)
    red = GradientReducer(list(model.parameters()), "float32")
    red.begin(None)
    for i, (batch, w) in enumerate(zip(data, weights, strict=True)):
        model.zero_grad(set_to_none=True)  # a DDP habit: the accumulated part lives in the bucket anyway
        loss = loss_of(model, batch)
        red.backward(loss, w, closing=i == 1)
    red.wait()
    for p, w in zip(model.parameters(), want, strict=True):
        assert p.grad is not None and torch.allclose(p.grad.double(), w, atol=1e-6)
    bucket = red.buckets[0]
    assert all(s.param.grad is not None and s.param.grad.data_ptr() == s.address for s in bucket.slots)


def test_exact_mode_does_not_depend_on_how_micro_batches_are_split() -> None:
    """Two 'ranks' each summing half of the micro-batches, then added in float64, give the one-rank bits."""
    data, weights = batches(4), [0.25] * 4
    model = mlp()
    one = GradientReducer(list(model.parameters()), "float64")
    run_step(one, model, data, weights)
    whole = [p.grad.clone() for p in model.parameters()]  # type: ignore[union-attr]
    one.close()
    parts = []
    for half in (slice(0, 2), slice(2, 4)):
        red = GradientReducer(list(model.parameters()), "float64")
        run_step(red, model, data[half], weights[half])
        parts.append([b.acc.clone() for b in red.buckets])
        red.close()
    summed = [a + b for a, b in zip(*parts, strict=True)]
    red = GradientReducer(list(model.parameters()), "float64")
    for b, acc in zip(red.buckets, summed, strict=True):
        for s in b.slots:
            s.param.grad = acc[s.offset : s.offset + s.numel].view(s.param.shape).to(torch.float32)
    assert all(torch.equal(p.grad, w) for p, w in zip(model.parameters(), whole, strict=True))  # type: ignore[arg-type]


def test_backward_outside_a_step_is_refused() -> None:
    model = mlp()
    red = GradientReducer(list(model.parameters()), "float32")
    with pytest.raises(ElasticError, match="outside a step"):
        loss_of(model, batches(1)[0]).backward()
    red.close()
    loss_of(model, batches(1)[0]).backward()  # without the reducer's hooks, plain autograd again


def test_abandon_never_reuses_buffers() -> None:
    model = mlp()
    red = GradientReducer(list(model.parameters()), "float32")
    run_step(red, model, batches(1), [1.0])
    before = [b.acc.data_ptr() for b in red.buckets]
    red.abandon()
    assert all(b.acc.data_ptr() != old for b, old in zip(red.buckets, before, strict=True))
    assert all(p.grad is None for p in model.parameters())


def test_an_unused_parameter_contributes_zeros_and_every_bucket_still_starts() -> None:
    model = mlp()
    extra = nn.Linear(3, 3)  # never used in forward
    params = [*model.parameters(), *extra.parameters()]
    red = GradientReducer(params, "float32", bucket_mb=0.0001)
    launched: list[int] = []
    red.begin(None, on_launch=launched.append)
    loss = loss_of(model, batches(1)[0])
    red.backward(loss, 1.0, closing=True)
    assert launched == list(range(red.bucket_count))
    red.wait()
    assert all(p.grad is not None and not p.grad.any() for p in extra.parameters())


def test_buckets_start_in_index_order_even_when_gradients_arrive_out_of_order() -> None:
    class Reversed(nn.Module):
        """Uses its layers in the opposite order of registration: gradients arrive in registration order."""

        def __init__(self) -> None:
            super().__init__()
            self.last = nn.Linear(16, 4)
            self.first = nn.Linear(8, 16)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.last(torch.tanh(self.first(x)))

    model = Reversed()
    red = GradientReducer(list(model.parameters()), "float32", bucket_mb=0.0001)
    launched: list[int] = []
    red.begin(None, on_launch=launched.append)
    red.backward(loss_of(model, batches(1)[0]), 1.0, closing=True)
    assert launched == sorted(launched) == list(range(red.bucket_count))


# --- over real gloo ranks (threads of this process) -----------------------------------------------------


def run_ranks(world: int, body: Callable[[int, Group], Any]) -> list[Any]:
    store = dist.HashStore()
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def target(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(dist.PrefixStore("t", store), rank, world, datetime.timedelta(seconds=30))
            results[rank] = body(rank, Group(pg, rank, world, 1, Interrupt()))
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=target, args=(r,)) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    return results


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16"])
def test_sums_over_ranks_overlap_backward_and_carry_loss_and_change_flag(dtype: str) -> None:
    data, world = batches(6), 3
    weights = [1 / 6] * 6
    want = reference_grads(mlp(), data, weights)
    models = [mlp() for _ in range(world)]  # built here: threads share torch's global RNG

    def body(rank: int, group: Group) -> tuple[list[torch.Tensor], float, bool, list[int]]:
        model = models[rank]
        red = GradientReducer(list(model.parameters()), dtype, bucket_mb=0.0005)  # type: ignore[arg-type]
        started_during_backward: list[int] = []
        red.begin(group, on_launch=lambda i: started_during_backward.append(i) if red._active else None)
        mine = data[2 * rank : 2 * rank + 2]
        for i, batch in enumerate(mine):
            loss = loss_of(model, batch)
            closing = i == 1
            red.add_control(loss, 1 / 6, (rank == 2) if closing else None)
            red.backward(loss, 1 / 6, closing=closing)
        loss_sum, change = red.wait()
        return [p.grad.clone() for p in model.parameters()], loss_sum, change, started_during_backward  # type: ignore[union-attr]

    results = run_ranks(world, body)
    tol = {"float64": 1e-7, "float32": 1e-6, "bfloat16": 2e-2}[dtype]
    losses = [sum(loss_of(mlp(), b).item() for b in data) / 6]
    for grads, loss_sum, change, started in results:
        assert change is True, "one rank's flag reaches every rank"
        assert loss_sum == pytest.approx(losses[0], rel=max(tol, 1e-6) * 10)
        assert started, "buckets start while the backward still runs"
        for g, w in zip(grads, want, strict=True):
            assert torch.allclose(g.double(), w, rtol=tol, atol=tol * w.abs().max().item())
    assert all(torch.equal(a, b) for a, b in zip(results[0][0], results[1][0], strict=True)), "ranks agree bit for bit"
