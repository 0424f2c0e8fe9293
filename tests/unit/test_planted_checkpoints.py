"""Checkpoint files planted by someone who can write to the checkpoint directory (a team's shared directory, a
copied checkpoint): each kind of file, with a hostile payload, is refused before anything in it runs, through
the very read path a resuming job takes. A payload that would run writes a marker file; none may exist after.

Kinds: DCP's `.metadata` (a pickle), DCP's `*.distcp` (torch.load per tensor), `done.json`, `small.json`, and a
replicated job's `.pt` (disaster-recovery `step-*.pt`, and the script's own `job.save` / `resume_from` file)."""

from __future__ import annotations

import io
import json
import os
import pickle
import stat
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, MetadataIndex

from slurm_elastic.worker.checkpoints.checkpoint import CheckpointError, load_latest, read_checkpoint, read_model_state
from slurm_elastic.worker.replicated.replica import Replica
from slurm_elastic.worker.replicated.snapshot import resume
from slurm_elastic.worker.sharded.checkpoint import ShardedCheckpoints, complete_checkpoints, load_shard, save_shard

pytestmark = pytest.mark.timeout(60)
META = "torch.distributed.checkpoint.metadata"
STEP = 4
MAGIC = b"slurm-elastic checkpoint\n"
SMALL = {"progress": {"step": STEP, "cursor": 32}, "keys": {"w": []}, "groups": [{"lr": 0.1}], "state": {"w": {}}}


# --- payloads, built from pickle opcodes ----------------------------------------------------------------------


def _s(text: str) -> bytes:
    raw = text.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def call(module: str, name: str, *args: str) -> bytes:
    """module.name(*args), through STACK_GLOBAL and REDUCE."""
    return _s(module) + _s(name) + b"\x93" + b"(" + b"".join(_s(a) for a in args) + b"tR"


def old_call(module: str, name: str, *args: str) -> bytes:
    """The same through the text GLOBAL opcode."""
    return b"c" + f"{module}\n{name}\n".encode() + b"(" + b"".join(_s(a) for a in args) + b"tR"


def pickled(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


def touch(marker: Path) -> str:
    return f"touch {marker}"


class Runs:
    """An object whose unpickling runs a shell command (what a hostile file holds)."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (self.command,)


# --- a real checkpoint, read as a resuming job reads it -------------------------------------------------------


class _Param:
    def to_sharded_dtensor(self, rows: torch.Tensor) -> torch.Tensor:
        return rows


class OneTensor:
    """What `load_shard` asks of a sharded replica, for one parameter `w` (a plain tensor: one rank, no mesh)."""

    def __init__(self) -> None:
        self.rows = torch.zeros(3, 4)
        self.params = {"w": _Param()}

    def entries(self) -> list[Any]:
        return [SimpleNamespace(fqn="w", key="param")]

    def own(self, entry: Any) -> torch.Tensor:
        return self.rows


def write_sharded(directory: Path, value: float = 1.0, step: int = STEP) -> Path:
    small = {**SMALL, "progress": {"step": step, "cursor": 32}}
    save_shard(directory, step, 0, 1, {"w/param": torch.full((3, 4), value)}, small)
    return directory / f"step-{step:09d}" / "rank-00000"


def load(directory: Path, step: int = STEP) -> OneTensor:
    replica = OneTensor()
    load_shard(directory, step, 1, replica)  # type: ignore[arg-type]
    return replica


def refused(call_it: Any, match: str | None = None) -> str:
    with pytest.raises(CheckpointError, match=match) as caught:
        call_it()
    message = str(caught.value)
    assert "\n" not in message, message
    return message


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "ran"


# --- DCP's .metadata ------------------------------------------------------------------------------------------


def _hostile_metadata(marker: Path) -> dict[str, bytes]:
    cmd = touch(marker)
    return {
        "os.system through DCP's metadata module": pickled(call(META, "os.system", cmd)),
        "os.system through GLOBAL": pickled(old_call(META, "os.system", cmd)),
        "a dotted name through torch": pickled(call("torch", "serialization.os.system", cmd)),
        "a dotted name through pathlib": pickled(call("pathlib", "os.system", cmd)),
        "a dotted name through DCP's filesystem": pickled(call(f"{META[:-9]}.filesystem", "os.system", cmd)),
        "a dotted name reaching a class's globals": pickled(call(META, "Metadata.__init__.__globals__", cmd)),
        "os.system": pickled(call("os", "system", cmd)),
        "posix.system": pickled(call("posix", "system", cmd)),
        "builtins.eval": pickled(call("builtins", "eval", f"__import__('os').system({cmd!r})")),
        "builtins.exec": pickled(call("builtins", "exec", f"__import__('os').system({cmd!r})")),
        "getattr of the os module DCP imports": pickled(
            _s("builtins") + _s("getattr") + b"\x93" + _s(META) + _s("os") + b"\x93" + _s("system") + b"\x86R"
            + _s(cmd) + b"\x85R"
        ),
        "a function of DCP's metadata module": pickled(call(META, "dataclass", "x")),
        "attributes set on the torch module": pickled(
            _s(META) + _s("torch") + b"\x93" + b"N}" + _s("planted_by_checkpoint") + b"\x88s\x86b"
        ),
        "attributes set on a metadata class": pickled(
            _s(META) + _s("Metadata") + b"\x93" + b"N}" + _s("planted_by_checkpoint") + b"\x88s\x86b"
        ),
    }  # fmt: skip


HOSTILE_METADATA = list(_hostile_metadata(Path("/m")))


@pytest.mark.parametrize("kind", HOSTILE_METADATA)
def test_a_planted_metadata_is_refused_before_anything_in_it_runs(tmp_path: Path, marker: Path, kind: str) -> None:
    from torch.distributed.checkpoint.metadata import Metadata as Meta

    rank = write_sharded(tmp_path / "ckpt")
    (rank / ".metadata").write_bytes(_hostile_metadata(marker)[kind])
    message = refused(lambda: load(tmp_path / "ckpt"), match="refusing")
    assert ".metadata" in message
    assert not marker.exists(), "the planted command ran"
    assert not hasattr(torch, "planted_by_checkpoint") and not hasattr(Meta, "planted_by_checkpoint")


def test_the_allow_list_holds_classes_defined_where_they_claim_dtypes_and_narrow_wrappers() -> None:
    from slurm_elastic.worker.sharded import dcpmeta

    assert dcpmeta.CLASSES, "DCP's metadata classes were found in this torch"
    for (module, name), found in dcpmeta.ALLOWED.items():
        assert "." not in name, name
        if (module, name) in dcpmeta.CLASSES:
            assert isinstance(found, type) and (found.__module__, found.__qualname__) == (module, name)
        elif isinstance(found, torch.dtype):
            assert module == "torch"
        else:
            assert found.__module__ == dcpmeta.__name__, f"{module}.{name} is one of our wrappers"
    assert dcpmeta._layout("torch.strided") is torch.strided
    for bad in ("os.system", 1):
        with pytest.raises(pickle.UnpicklingError, match="refusing layout"):
            dcpmeta._layout(bad)
    with pytest.raises(pickle.UnpicklingError, match="strings"):
        dcpmeta._path("a", 1)


def _rewrite_metadata(rank: Path, change: Any) -> None:
    meta: Metadata = pickle.loads((rank / ".metadata").read_bytes())  # our own file, for the test
    change(meta)
    (rank / ".metadata").write_bytes(pickle.dumps(meta))


@pytest.mark.parametrize("where", ["parent", "absolute", "subdirectory"])
def test_metadata_naming_a_file_outside_the_rank_directory_is_refused(tmp_path: Path, where: str) -> None:
    # The user's other model (a private one): a planted metadata must not read it into this job's model.
    secret = write_sharded(tmp_path / "private", value=7.0) / "__0_0.distcp"
    rank = write_sharded(tmp_path / "ckpt")
    names = {
        "parent": "../../../private/step-000000004/rank-00000/__0_0.distcp",
        "absolute": str(secret),
        "subdirectory": "sub/__0_0.distcp",
    }
    (rank / "sub").mkdir()
    os.link(secret, rank / "sub" / "__0_0.distcp")

    def aim(meta: Metadata) -> None:
        for index, info in meta.storage_data.items():
            meta.storage_data[index] = _StorageInfo(names[where], info.offset, info.length)

    _rewrite_metadata(rank, aim)
    replica = OneTensor()
    refused(lambda: load_shard(tmp_path / "ckpt", STEP, 1, replica), match=r"plain \*\.distcp name")  # type: ignore[arg-type]
    assert not replica.rows.any(), "nothing was read into the model"


@pytest.mark.parametrize("link", ["the tensor file", "the rank directory", "the step directory"])
def test_a_link_planted_in_a_checkpoint_is_not_followed_when_reading(tmp_path: Path, link: str) -> None:
    private = write_sharded(tmp_path / "private", value=7.0)
    rank = write_sharded(tmp_path / "ckpt")
    if link == "the tensor file":
        (rank / "__0_0.distcp").unlink()
        (rank / "__0_0.distcp").symlink_to(private / "__0_0.distcp")
    else:
        target = rank if link == "the rank directory" else rank.parent
        source = private if link == "the rank directory" else private.parent
        os.rename(target, tmp_path / "moved")
        target.symlink_to(source)
    replica = OneTensor()
    refused(lambda: load_shard(tmp_path / "ckpt", STEP, 1, replica), match="symbolic link")  # type: ignore[arg-type]
    assert not replica.rows.any()


# --- DCP's *.distcp -------------------------------------------------------------------------------------------


def test_a_bytes_entry_whose_file_holds_a_pickle_is_refused_before_dcp_unpickles_it(
    tmp_path: Path, marker: Path
) -> None:
    # DCP reads a "bytes" entry with torch.load(weights_only=False): metadata built from DCP's own classes alone,
    # naming such an entry, would run the pickle in the tensor file.
    rank = write_sharded(tmp_path / "ckpt")
    payload = pickle.dumps(Runs(touch(marker)))
    (rank / "__0_0.distcp").write_bytes(payload)

    def as_bytes(meta: Metadata) -> None:
        meta.state_dict_metadata["w/param"] = BytesStorageMetadata()
        meta.storage_data = {MetadataIndex("w/param"): _StorageInfo("__0_0.distcp", 0, len(payload))}

    _rewrite_metadata(rank, as_bytes)
    refused(lambda: load(tmp_path / "ckpt"), match="tensors only")
    assert not marker.exists(), "the planted command ran"


def test_a_tensor_file_holding_a_hostile_pickle_is_refused(tmp_path: Path, marker: Path) -> None:
    # Each tensor is read by DCP with torch.load(weights_only=True): safe from torch 2.6 on (this test passes on
    # the code before the fix too, as torch 2.13 refuses the pickle itself).
    rank = write_sharded(tmp_path / "ckpt")
    blob = io.BytesIO()
    torch.save(Runs(touch(marker)), blob)
    (rank / "__0_0.distcp").write_bytes(blob.getvalue())

    def whole_file(meta: Metadata) -> None:
        for index in meta.storage_data:
            meta.storage_data[index] = _StorageInfo("__0_0.distcp", 0, len(blob.getvalue()))

    _rewrite_metadata(rank, whole_file)
    refused(lambda: load(tmp_path / "ckpt"), match="cannot read the checkpoint")
    assert not marker.exists(), "the planted command ran"


def test_sharded_checkpoints_are_not_read_by_a_torch_whose_weights_only_can_be_bypassed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_sharded(tmp_path / "ckpt")
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    refused(lambda: load(tmp_path / "ckpt"), match=r"needs torch >= 2\.6 \(torch 2\.5\.1")


# --- done.json and small.json ---------------------------------------------------------------------------------

HOSTILE_DONE = {
    "a billion ranks": '{"world": 1000000000, "step": 4}',
    "a negative world": '{"world": -1, "step": 4}',
    "no rank": '{"world": 0, "step": 4}',
    "a boolean world": '{"world": true, "step": 4}',
    "a list for a world": '{"world": [1], "step": 4}',
    "an infinite world": '{"world": Infinity, "step": 4}',
    "another step": '{"world": 1, "step": 8}',
    "a list": "[1, 2]",
    "null": "null",
    "not JSON": "{world",
    "deeply nested": "[" * 3000,
    "a huge file": " " * (1 << 20) + '{"world": 1, "step": 4}',
}


@pytest.mark.parametrize("kind", list(HOSTILE_DONE))
def test_a_hostile_done_json_is_skipped_with_a_report_and_an_older_checkpoint_is_used(
    tmp_path: Path, kind: str
) -> None:
    write_sharded(tmp_path / "ckpt", step=2)
    rank = write_sharded(tmp_path / "ckpt", step=STEP)
    (rank / "done.json").write_text(HOSTILE_DONE[kind])
    reports: list[tuple[str, dict[str, Any]]] = []
    checkpoints = ShardedCheckpoints(tmp_path / "ckpt", 0, False, lambda k, f: reports.append((k, f)))
    assert checkpoints.load_into(SimpleNamespace()) is True  # type: ignore[arg-type]
    assert complete_checkpoints(tmp_path / "ckpt") == [(2, 1)]
    assert [k for k, _ in reports] == ["checkpoint_skipped"], reports
    assert reports[0][1]["path"].endswith("step-000000004")


@pytest.mark.parametrize("kind", ["a FIFO", "a link to a file", "a directory"])
def test_a_done_json_that_is_no_regular_file_is_skipped_without_blocking(tmp_path: Path, kind: str) -> None:
    rank = write_sharded(tmp_path / "ckpt")
    (rank / "done.json").unlink()
    if kind == "a FIFO":
        os.mkfifo(rank / "done.json")  # an open for reading would wait for a writer forever
    elif kind == "a link to a file":
        (tmp_path / "done").write_text('{"world": 1, "step": 4}')
        (rank / "done.json").symlink_to(tmp_path / "done")
    else:
        (rank / "done.json").mkdir()
    reports: list[str] = []
    assert not ShardedCheckpoints(tmp_path / "ckpt", 0, False, lambda k, f: reports.append(k)).load_into(
        SimpleNamespace()  # type: ignore[arg-type]
    )
    assert reports == ["checkpoint_skipped"]


def test_a_world_larger_than_the_rank_directories_present_is_incomplete_at_once(tmp_path: Path) -> None:
    rank = write_sharded(tmp_path / "ckpt")
    (rank / "done.json").write_text('{"world": 65536, "step": 4}')  # within the limit, but 1 directory
    assert complete_checkpoints(tmp_path / "ckpt") == []  # incomplete: at once, no report


HOSTILE_SMALL = {
    "a list": "[]",
    "a hundred thousand state names": json.dumps({**SMALL, "keys": {"w": [f"k{i}" for i in range(100_000)]}}),
    "state names that repeat": json.dumps({**SMALL, "keys": {"w": ["exp_avg", "exp_avg"]}}),
    "a state name that is a path": json.dumps({**SMALL, "keys": {"w": ["../x"]}}),
    "another step": json.dumps({**SMALL, "progress": {"step": 8, "cursor": 32}}),
    "a negative cursor": json.dumps({**SMALL, "progress": {"step": 4, "cursor": -1}}),
    "a group replacing the parameters": json.dumps({**SMALL, "groups": [{"lr": 0.1, "params": [1, 2]}]}),
    "no state": json.dumps({k: v for k, v in SMALL.items() if k != "state"}),
    "not JSON": "{",
}


@pytest.mark.parametrize("kind", list(HOSTILE_SMALL))
def test_a_hostile_small_json_is_refused_with_one_line(tmp_path: Path, kind: str) -> None:
    rank = write_sharded(tmp_path / "ckpt")
    (rank / "small.json").write_text(HOSTILE_SMALL[kind])
    refused(lambda: load(tmp_path / "ckpt"), match="small.json")


def test_a_small_json_too_large_or_no_regular_file_is_refused_without_reading_it(tmp_path: Path) -> None:
    rank = write_sharded(tmp_path / "ckpt")
    with open(rank / "small.json", "r+b") as fh:
        fh.truncate(64 * 1024 * 1024 + 1)  # sparse: one byte over the limit
    refused(lambda: load(tmp_path / "ckpt"), match="the limit is")
    (rank / "small.json").unlink()
    os.mkfifo(rank / "small.json")
    refused(lambda: load(tmp_path / "ckpt"), match="not a regular file")


# --- a replicated job's .pt -----------------------------------------------------------------------------------


def _replica() -> Replica:
    model = torch.nn.Linear(4, 3)
    return Replica(model, torch.optim.SGD(model.parameters(), lr=0.1), None)


def _hostile_pt(marker: Path) -> dict[str, bytes]:
    zipped = io.BytesIO()
    torch.save({"format": 1, "step": 1, "meta": "{}", "tensors": [Runs(touch(marker))]}, zipped)
    return {
        "a bare pickle": pickle.dumps(Runs(touch(marker)), protocol=2),
        "torch.save's zip": zipped.getvalue(),
    }


@pytest.mark.parametrize("kind", list(_hostile_pt(Path("/m"))))
def test_a_planted_pt_is_refused_on_every_read_path(tmp_path: Path, marker: Path, kind: str) -> None:
    # torch 2.13's weights_only refuses these already (this test passes on the old code too); the next test is
    # the one about a torch whose weights_only can be bypassed.
    path = tmp_path / "ckpt" / "step-000000010.pt"
    path.parent.mkdir()
    path.write_bytes(_hostile_pt(marker)[kind])
    refused(lambda: read_checkpoint(path))
    refused(lambda: read_model_state(path))
    refused(lambda: resume(_replica(), path))
    skipped: list[Path] = []
    assert load_latest(path.parent, on_skip=lambda p, e: skipped.append(p)) is None and skipped == [path]
    assert not marker.exists(), "the planted command ran"


def test_the_first_format_never_reaches_torch_load_on_a_torch_before_2_6(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch < 2.6's weights_only could be bypassed (CVE-2025-32434): on such a torch, a file in the first
    # format (torch.save) must be refused by name before torch.load sees it.
    path = tmp_path / "step-000000010.pt"
    torch.save({"format": 1, "step": 10, "meta": "{}", "tensors": []}, path)
    loads: list[Any] = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    monkeypatch.setattr(torch, "__version__", "2.5.1")
    refused(lambda: read_checkpoint(path), match=r"torch 2\.5\.1 cannot read safely .* torch >= 2\.6")
    skipped: list[str] = []
    assert load_latest(tmp_path, on_skip=lambda p, e: skipped.append(e)) is None
    assert "torch >= 2.6" in skipped[0] and loads == []


def test_a_file_of_the_first_format_still_resumes_on_torch_2_6_or_newer(tmp_path: Path) -> None:
    src = _replica()
    src.step = 12
    snap = src.capture()
    path = tmp_path / "old.pt"
    torch.save({"format": 1, "step": 12, "meta": json.dumps(snap.meta), "tensors": snap.tensors}, path)
    dst = _replica()
    resume(dst, path)
    assert dst.step == 12 and torch.equal(dst.model.weight, src.model.weight)
    assert torch.equal(read_model_state(path)["bias"], src.model.bias)


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    raw = [t.contiguous().reshape(-1).view(torch.uint8) for t in (a, b)]
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(*raw)


def test_the_new_format_is_written_and_read_without_pickle(tmp_path: Path) -> None:
    from slurm_elastic.worker.checkpoints.checkpoint import write_checkpoint
    from slurm_elastic.worker.checkpoints.ckptformat import DTYPES
    from slurm_elastic.worker.checkpoints.ckptformat import MAGIC as written
    from slurm_elastic.worker.checkpoints.state import Snapshot

    tensors = [torch.arange(6, dtype=torch.float32).reshape(2, 3).t(), torch.tensor(3.5), torch.empty(0, 5)]
    tensors += [torch.arange(3).to(d) for d in DTYPES.values()]
    meta = {"t": [{"__t__": i} for i in range(len(tensors))]}
    write_checkpoint(tmp_path / "f.pt", 7, Snapshot(meta, tensors))
    assert written == MAGIC and (tmp_path / "f.pt").read_bytes().startswith(MAGIC), "a JSON header, no pickle"
    step, snap = read_checkpoint(tmp_path / "f.pt")
    assert step == 7 and snap.meta == meta
    assert all(_same(a, b) for a, b in zip(tensors, snap.tensors, strict=True))


def _header(tensors: list[Any], data: bytes = b"", meta: str = "{}", **fields: Any) -> bytes:
    values = {"format": 2, "step": 1, "byteorder": "little", "tensors": tensors, **fields}
    raw = (json.dumps(values)[:-1] + f', "meta": {meta}}}').encode()
    pad = -(len(MAGIC) + 8 + len(raw)) % 64
    return MAGIC + len(raw).to_bytes(8, "little") + raw + bytes(pad) + data


HOSTILE_HEADERS = {
    "a header longer than the file": MAGIC + (2**60).to_bytes(8, "little") + b"{}",
    "bytes past the end": _header([["float32", [1000, 1000], 0, 4_000_000]], bytes(64)),
    "overlapping tensors": _header([["float32", [4], 0, 16], ["float32", [4], 8, 16]], bytes(64)),
    "a negative offset": _header([["float32", [4], -64, 16]], bytes(64)),
    "an unknown dtype": _header([["object", [1], 0, 8]], bytes(64)),
    "a shape that needs other bytes": _header([["float32", [1000], 0, 16]], bytes(64)),
    "an empty but huge shape": _header([["float32", [0, 2**70], 0, 0]]),
    "a boolean size": _header([["float32", [True], 0, 4]], bytes(64)),
    "too many dimensions": _header([["float32", [1] * 100, 0, 4]], bytes(64)),
    "another byte order": _header([], byteorder="big"),
    "another format": _header([], format=3),
    "a negative step": _header([], step=-1),
    "a deeply nested meta": _header([], meta="[" * 100_000 + "]" * 100_000),
}  # fmt: skip


@pytest.mark.parametrize("kind", list(HOSTILE_HEADERS))
def test_a_hostile_header_is_refused_before_any_tensor_is_read(tmp_path: Path, kind: str) -> None:
    (tmp_path / "f.pt").write_bytes(HOSTILE_HEADERS[kind])
    refused(lambda: read_checkpoint(tmp_path / "f.pt"), match="not a readable checkpoint")


def test_a_meta_that_points_past_the_tensors_is_refused_by_name(tmp_path: Path) -> None:
    from slurm_elastic.worker.checkpoints.checkpoint import write_checkpoint
    from slurm_elastic.worker.checkpoints.state import Snapshot

    write_checkpoint(tmp_path / "a.pt", 1, Snapshot({"__d__": [["model", {"__t__": 5}]]}, [torch.zeros(1)]))
    refused(lambda: read_model_state(tmp_path / "a.pt"), match=r"tensor index 5 .* expected 0 to 0")
    write_checkpoint(
        tmp_path / "b.pt", 1, Snapshot({"__d__": [["model", {"__np__": [1], "dtype": "V1000000000"}]]}, [])
    )
    refused(lambda: read_model_state(tmp_path / "b.pt"), match="numpy dtype 'V1000000000'")


def test_a_disaster_recovery_file_that_is_a_link_is_skipped(tmp_path: Path) -> None:
    from slurm_elastic.worker.checkpoints.checkpoint import write_checkpoint

    src = _replica()
    write_checkpoint(tmp_path / "elsewhere.pt", 9, src.capture())
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "step-000000009.pt").symlink_to(tmp_path / "elsewhere.pt")
    skipped: list[str] = []
    assert load_latest(tmp_path / "ckpt", on_skip=lambda p, e: skipped.append(e)) is None
    assert "symbolic link" in skipped[0]
    assert stat.S_ISLNK(os.lstat(tmp_path / "ckpt" / "step-000000009.pt").st_mode)
