"""Checkpoint files a script names (job.save / resume_from), the weights alone, and how many disaster-recovery
checkpoints are kept."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from slurm_elastic.config import resolve_config, training_env
from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.checkpoints.checkpoint import (
    CheckpointError,
    DisasterRecovery,
    list_checkpoints,
    read_checkpoint,
    read_model_state,
    write_checkpoint,
)
from slurm_elastic.worker.env import worker_env
from slurm_elastic.worker.replicated.replica import Replica

pytestmark = pytest.mark.timeout(30)


def replica(seed: int) -> Replica:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    return Replica(model, torch.optim.SGD(model.parameters(), lr=0.1), None, {"epochs_run": seed})


def test_a_saved_file_restores_the_replica_and_yields_the_weights_alone(tmp_path: Path) -> None:
    src = replica(1)
    src.step, src.cursor = 12, 96
    path = tmp_path / "sub" / "snap.pt"
    write_checkpoint(path, src.step, src.capture())
    assert [p.name for p in path.parent.iterdir()] == ["snap.pt"], "no temporary file left"
    step, snap = read_checkpoint(path)
    dst = replica(2)
    dst.restore(snap)
    assert (step, dst.step, dst.cursor, dst.extra["epochs_run"]) == (12, 12, 96, 1)
    weights = read_model_state(path)
    assert weights.keys() == {"weight", "bias"} and torch.equal(weights["weight"], src.model.weight)


def test_unreadable_or_foreign_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match=r"no checkpoint at .*missing\.pt"):
        read_checkpoint(tmp_path / "missing.pt")
    (tmp_path / "torn.pt").write_bytes(b"\x80\x02 not a zip")
    with pytest.raises(CheckpointError, match=r"torn\.pt is not a readable checkpoint"):
        read_checkpoint(tmp_path / "torn.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    with pytest.raises(CheckpointError, match=r"list\.pt is not a slurm-elastic checkpoint: format 'list'"):
        read_checkpoint(tmp_path / "list.pt")


def test_the_newest_k_disaster_recovery_checkpoints_are_kept(tmp_path: Path) -> None:
    dr = DisasterRecovery(tmp_path, every=1, background=False, report=lambda kind, fields: None, keep=3)
    r = replica(0)
    for step in range(1, 6):
        r.step = step
        dr.after_commit(r, rank=0)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4, 5]


def test_checkpoint_keep_is_a_job_setting_that_reaches_the_workers() -> None:
    cfg = resolve_config({"checkpoint_keep": "5"}, {})
    env = training_env(cfg)
    assert env["SLURM_ELASTIC_CHECKPOINT_KEEP"] == "5" and worker_env(env).checkpoint_keep == 5
    assert "SLURM_ELASTIC_CHECKPOINT_KEEP" not in training_env(resolve_config({}, {})), "the default stays implicit"
    with pytest.raises(ConfigError, match="invalid --checkpoint-keep: '0'"):
        resolve_config({"checkpoint_keep": "0"}, {})


def test_sharded_metadata_takes_enum_members_by_name_and_nothing_else_through_getattr() -> None:
    import pickle

    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING

    from slurm_elastic.worker.sharded.dcpmeta import MetadataUnpickler

    class ByName:  # how Python 3.11.2 pickles an enum member
        def __init__(self, target: object, name: str) -> None:
            self.target, self.name = target, name

        def __reduce__(self) -> tuple[object, tuple[object, str]]:
            return getattr, (self.target, self.name)

    def load(obj: object) -> object:
        return MetadataUnpickler(io.BytesIO(pickle.dumps(obj))).load()

    member = _MEM_FORMAT_ENCODING.TORCH_CONTIGUOUS_FORMAT
    assert load(ByName(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")) is member
    for hostile in (ByName(_MEM_FORMAT_ENCODING, "__class__"), ByName(Path, "home")):
        with pytest.raises(pickle.UnpicklingError, match="refusing"):
            load(hostile)
