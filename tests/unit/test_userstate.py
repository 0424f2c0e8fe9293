"""The user's extra state: validated at construction, captured with the replica, restored in place."""

from __future__ import annotations

import json
from typing import Any

import pytest
import torch

from slurm_elastic.worker.checkpoints import userstate
from slurm_elastic.worker.checkpoints.state import Layout, Snapshot, StateError, layout_of, pack, unpack
from slurm_elastic.worker.replicated.replica import Replica

pytestmark = pytest.mark.timeout(30)


class Counter:
    """A user object with state_dict / load_state_dict (a tokenizer offset, say)."""

    def __init__(self) -> None:
        self.offset = 0

    def state_dict(self) -> dict[str, Any]:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.offset = int(state["offset"])


def transfer(snap: Snapshot) -> Snapshot:
    layout = layout_of(snap.tensors)
    buf = pack(snap.tensors, layout).clone()
    return Snapshot(json.loads(json.dumps(snap.meta)), unpack(buf, Layout.from_json(layout.to_json())))


def replica(extra: dict[str, Any]) -> Replica:
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    return Replica(model, torch.optim.SGD(model.parameters(), lr=0.1), None, extra)


def test_extra_state_travels_with_the_replica_and_is_restored_in_place() -> None:
    ema = torch.nn.Linear(3, 2)
    with torch.no_grad():
        ema.weight.fill_(0.5)
    source_extra = {"epoch": 3, "best": 0.25, "ema": ema, "moments": torch.arange(4.0), "hist": [1.5, (2, "a")]}
    source_extra["tok"] = Counter()
    source_extra["tok"].offset = 1234
    src = replica(source_extra)
    src.step, src.cursor = 7, 84

    ema2, tensor2, tok2 = torch.nn.Linear(3, 2), torch.zeros(4), Counter()
    live = {"epoch": 0, "best": float("inf"), "ema": ema2, "moments": tensor2, "tok": tok2, "new": "kept"}
    dst = replica(live)
    dst.restore(transfer(src.capture()))

    assert (dst.step, dst.cursor) == (7, 84)
    assert live["epoch"] == 3 and live["best"] == 0.25 and live["hist"] == [1.5, (2, "a")]
    assert live["ema"] is ema2 and torch.equal(ema2.weight, ema.weight), "objects are loaded in place"
    assert live["moments"] is tensor2 and torch.equal(tensor2, torch.arange(4.0)), "tensors are copied in place"
    assert live["tok"] is tok2 and tok2.offset == 1234
    assert live["new"] == "kept", "an entry the snapshot lacks keeps its value"


def test_a_snapshot_without_extra_state_restores_nothing_of_it() -> None:
    old = replica({})
    snap = old.capture()
    snap.meta["__d__"] = [kv for kv in snap.meta["__d__"] if kv[0] != "extra"]  # as written before extra state
    live = {"epoch": 5}
    replica(live).restore(snap)
    assert live == {"epoch": 5}


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"sampler": object()}, "extra_state['sampler']"),
        ({"seen": {1, 2}}, "cannot transfer set at extra_state['seen']"),
        ({1: 2}, "extra_state key 1 is a int: keys must be strings"),
        ([1, 2], "extra_state must be a dict of named entries, got list"),
    ],
)
def test_a_bad_entry_is_refused_at_construction_naming_it(extra: Any, message: str) -> None:
    with pytest.raises(StateError) as exc:
        userstate.validate(extra)
    assert message in str(exc.value)
    assert "\n" not in str(exc.value)
