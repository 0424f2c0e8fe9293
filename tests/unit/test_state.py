"""Training state as JSON metadata plus one packed byte buffer: capture/restore, pack/unpack, fingerprints."""

from __future__ import annotations

import json
import math
import random
from typing import Any

import numpy as np
import pytest
import torch

from slurm_elastic.worker.checkpoints.state import (
    Layout,
    Snapshot,
    StateError,
    capture,
    fingerprint,
    from_json,
    layout_of,
    pack,
    restore,
    to_json,
    unpack,
)


def make(seed: int) -> tuple[torch.nn.Sequential, torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5**step)
    return model, optimizer, scheduler


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    x, y = torch.randn(16, 4, generator=gen), torch.randn(16, 2, generator=gen)
    optimizer.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    optimizer.step()
    scheduler.step()


def transfer(snap: Snapshot) -> Snapshot:
    """What a peer does: JSON for the metadata, one packed uint8 buffer for the tensors."""
    layout = layout_of(snap.tensors)
    buf = pack(snap.tensors, layout).clone()
    received = Layout.from_json(json.loads(json.dumps(layout.to_json())))
    return Snapshot(json.loads(json.dumps(snap.meta)), unpack(buf, received))


def assert_same_tree(a: Any, b: Any, path: str = "") -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor), path
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), path
        for k in a:
            assert_same_tree(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list | tuple):
        assert type(a) is type(b) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, f"{path}[{i}]")
    else:
        assert a == b, path


def test_capture_restore_round_trip_through_a_transfer() -> None:
    model, optimizer, scheduler = make(0)
    for step in range(2):
        train_step(model, optimizer, scheduler, step)
    assert optimizer.state_dict()["state"]  # AdamW moments exist
    torch.manual_seed(1234)
    random.seed(99)
    np.random.seed(7)
    progress = {"step": 2, "cursor": 128, "history": [1.5, 2.5], "pair": (1, "a"), "none": None}
    snap = transfer(capture(model, optimizer, scheduler, progress))
    expected_draws = (torch.rand(5), random.random(), np.random.rand(3))

    other, other_opt, other_sched = make(1)
    train_step(other, other_opt, other_sched, 7)
    torch.manual_seed(0)
    got = restore(other, other_opt, other_sched, snap)

    assert got == progress
    assert_same_tree(model.state_dict(), other.state_dict())
    assert_same_tree(optimizer.state_dict(), other_opt.state_dict())
    assert_same_tree(scheduler.state_dict(), other_sched.state_dict())
    assert other_sched.get_last_lr() == scheduler.get_last_lr()
    draws = (torch.rand(5), random.random(), np.random.rand(3))
    assert torch.equal(draws[0], expected_draws[0]) and draws[1] == expected_draws[1]
    assert np.array_equal(draws[2], expected_draws[2])
    # the restored replica trains on exactly like the original (moments, step counts and lr all restored)
    train_step(model, optimizer, scheduler, 5)
    train_step(other, other_opt, other_sched, 5)
    assert_same_tree(model.state_dict(), other.state_dict())
    assert fingerprint(model) == fingerprint(other)


def test_restore_without_a_scheduler() -> None:
    model, optimizer, scheduler = make(0)
    train_step(model, optimizer, scheduler, 0)
    snap = transfer(capture(model, optimizer, None, {}))
    other, other_opt, _ = make(3)
    assert restore(other, other_opt, None, snap) == {}
    assert_same_tree(model.state_dict(), other.state_dict())


@pytest.mark.parametrize(
    ("progress", "where"),
    [
        ({"sampler": object()}, "cannot transfer object at state.progress.sampler"),
        ({"hist": [1, {"seen": {1, 2}}]}, "cannot transfer set at state.progress.hist[1].seen"),
        ({"fn": len}, "builtin_function_or_method at state.progress.fn"),
    ],
)
def test_unsupported_object_names_its_path(progress: dict[str, Any], where: str) -> None:
    model, optimizer, scheduler = make(0)
    with pytest.raises(StateError) as exc:
        capture(model, optimizer, scheduler, progress)
    assert where in str(exc.value)


def test_unknown_encoding_is_refused() -> None:
    model, optimizer, scheduler = make(0)
    snap = capture(model, optimizer, scheduler, {})
    snap.meta["__d__"].append([{"__pickle__": "x"}, 1])
    with pytest.raises(StateError, match="unknown state encoding"):
        restore(model, optimizer, scheduler, snap)


def mixed_tensors() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [
        torch.randn(3, 4, generator=gen, dtype=torch.float64),
        torch.randn(5, 2, generator=gen).t(),  # not contiguous
        torch.empty(0, 3, dtype=torch.float32),
        torch.tensor([True, False, True]),
        torch.tensor(7, dtype=torch.int64),  # 0-dim
        torch.randn(3, generator=gen).to(torch.bfloat16),
        torch.randn(3, generator=gen).to(torch.float16),
        torch.tensor([-3, 4], dtype=torch.int8),
        torch.tensor([1, 255], dtype=torch.uint8),
        torch.tensor([1, -2], dtype=torch.int16),
        torch.tensor([2**31 - 1], dtype=torch.int32),
        torch.empty(0, dtype=torch.bool),
        torch.tensor([1 + 2j], dtype=torch.complex64),
        torch.tensor([math.inf, -0.0]),
    ]


def test_pack_unpack_round_trip_mixed_dtypes() -> None:
    tensors = mixed_tensors()
    layout = layout_of(tensors)
    assert layout.total == sum(t.numel() * t.element_size() for t in tensors)
    offsets = [e[2] for e in layout.entries]
    assert offsets == sorted(offsets) and offsets[0] == 0
    buf = pack(tensors, layout)
    assert buf.dtype == torch.uint8 and buf.numel() == layout.total
    back = unpack(buf, Layout.from_json(json.loads(json.dumps(layout.to_json()))))
    assert len(back) == len(tensors)
    for original, restored in zip(tensors, back, strict=True):
        assert restored.dtype == original.dtype and restored.shape == original.shape
        assert torch.equal(restored, original)


def test_unpacked_tensors_do_not_alias_the_buffer() -> None:
    tensors = [torch.arange(4, dtype=torch.float32)]
    layout = layout_of(tensors)
    buf = pack(tensors, layout)
    (back,) = unpack(buf, layout)
    buf.zero_()
    assert torch.equal(back, torch.arange(4, dtype=torch.float32))


def test_pack_needs_one_layout_entry_per_tensor() -> None:
    tensors = mixed_tensors()
    with pytest.raises(ValueError):
        pack(tensors[:-1], layout_of(tensors))


def test_unpack_refuses_an_unknown_dtype() -> None:
    layout = Layout((("torch.float8_e4m3fn", (2,), 0, 2),), 2)
    with pytest.raises(StateError, match=r"cannot restore a tensor of dtype torch\.float8_e4m3fn"):
        unpack(torch.zeros(2, dtype=torch.uint8), layout)


def test_fingerprint() -> None:
    a, _, _ = make(0)
    b, _, _ = make(0)
    c, _, _ = make(1)
    fa = fingerprint(a)
    assert fa == fingerprint(b) and all(math.isfinite(x) for x in fa)
    assert fa != fingerprint(c)
    first_weight, last_bias = next(b.parameters()), list(c.parameters())[-1]
    with torch.no_grad():
        first_weight[0, 0] += 1e-3
    assert fingerprint(b) != fa
    with torch.no_grad():
        first_weight[0, 0] = float("nan")
    assert all(math.isnan(x) for x in fingerprint(b))
    with torch.no_grad():
        last_bias[0] = float("inf")
    assert all(math.isnan(x) for x in fingerprint(c))


def test_fingerprint_is_the_sum_and_the_sum_of_squares() -> None:
    a = torch.nn.Linear(2, 1, bias=False)
    b = torch.nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        a.weight.copy_(torch.tensor([[1.0, 2.0]]))
        b.weight.copy_(torch.tensor([[2.0, 1.0]]))
    assert fingerprint(a) == fingerprint(b) == (3.0, 5.0)  # a known blind spot: a permutation of values
    with torch.no_grad():
        b.weight.copy_(torch.tensor([[0.0, 3.0]]))
    assert fingerprint(a)[0] == fingerprint(b)[0] and fingerprint(a)[1] != fingerprint(b)[1]


def test_small_state_travels_as_json_alone_with_its_tensors_bit_exact() -> None:
    # A sharded job's replicated part (the user's extra state among it) goes through the store as JSON.
    value = {
        "count": 3,
        "ema": torch.tensor([1.5, -2.25, float("nan")], dtype=torch.bfloat16),
        "nested": [torch.arange(6, dtype=torch.int64).reshape(2, 3), "x", None],
        "empty": torch.empty(0, 4),
    }
    back = from_json(json.loads(json.dumps(to_json(value, "extra_state"))))
    assert back["count"] == 3 and back["nested"][1:] == ["x", None]
    assert (
        back["ema"].dtype == torch.bfloat16
        and back["ema"].view(torch.int16).tolist() == value["ema"].view(torch.int16).tolist()
    )
    assert torch.equal(back["nested"][0], value["nested"][0]) and back["empty"].shape == (0, 4)


def test_json_state_with_an_unknown_dtype_is_refused() -> None:
    encoded = to_json({"t": torch.ones(2)}, "extra_state")
    encoded["tensors"][0][0] = "object"
    with pytest.raises(StateError, match="invalid dtype 'object'"):
        from_json(encoded)
