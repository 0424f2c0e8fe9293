"""Reading a DCP checkpoint's `.metadata`, a pickle, from a directory others may have written to.

The unpickler resolves only exact (module, name) pairs from a table built here: DCP's metadata classes (each
checked, when the table is built, to be a class defined where the pair says), torch's dtypes (values, not
callables), and three narrow wrappers that accept known values only (a tensor layout by name, an enum member
by name, a path made of strings). A name with a dot is refused (pickle would walk it attribute by attribute,
out of the module), and so is every other pair: nothing is imported or looked up by a name from the file.
BUILD, which sets attributes, applies to instances of those classes only, never to a class or a module.

The metadata found is then checked: DCP's own types everywhere, tensors only (a "bytes" entry would make DCP
unpickle a file's bytes with `torch.load(weights_only=False)`), and every storage file a plain `*.distcp` name
inside the rank's directory (never absolute, `..` or a path).
"""

from __future__ import annotations

import enum
import importlib
import io
import pathlib
import pickle
import re
from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)

MAX_METADATA_BYTES = 256 * 1024 * 1024
_METADATA = "torch.distributed.checkpoint.metadata"
_CLASSES = {
    _METADATA: (
        "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
        "MetadataIndex", "StorageMeta", "_MEM_FORMAT_ENCODING",
    ),
    "torch.distributed.checkpoint.filesystem": ("_StorageInfo",),
    "torch": ("Size",),
}  # fmt: skip
_FILE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*\.distcp$")
_LAYOUTS = {str(v): v for v in vars(torch).values() if isinstance(v, torch.layout)}


def _classes() -> dict[tuple[str, str], type]:
    """Each listed class that this torch has, defined where its (module, name) says."""
    out = {}
    for module, names in _CLASSES.items():
        found = importlib.import_module(module)
        for name in names:
            cls = getattr(found, name, None)
            if isinstance(cls, type) and cls.__module__ == module and cls.__qualname__ == name:
                out[module, name] = cls
    return out


CLASSES = _classes()
_ENUMS = tuple(cls for cls in CLASSES.values() if issubclass(cls, enum.Enum))
_BUILDABLE = tuple(cls for cls in CLASSES.values() if not issubclass(cls, enum.Enum | torch.Size))


def _layout(name: Any) -> torch.layout:
    """torch.serialization._get_layout, for the names of torch's layouts only."""
    if isinstance(name, str) and name in _LAYOUTS:
        return _LAYOUTS[name]
    raise pickle.UnpicklingError(f"refusing layout {str(name)[:60]!r}, expected one of {sorted(_LAYOUTS)}")


def _enum_member(cls: Any, name: Any) -> Any:
    """`getattr` as a pickle may call it: a member, by name, of one of the enums above. Python 3.11.2 pickles
    such members by name (`getattr(_MEM_FORMAT_ENCODING, "TORCH_CONTIGUOUS_FORMAT")`), 3.11.7 by value."""
    if any(cls is e for e in _ENUMS) and isinstance(name, str) and name in cls.__members__:
        return cls[name]
    raise pickle.UnpicklingError(f"refusing getattr({str(cls)[:60]}, {str(name)[:60]!r})")


def _path(*parts: Any) -> pathlib.PurePosixPath:
    """A path (StorageMeta's checkpoint id, which loading does not use) made of strings only."""
    if all(isinstance(p, str) for p in parts):
        return pathlib.PurePosixPath(*parts)
    raise pickle.UnpicklingError("refusing a path made of something other than strings")


_WRAPPERS: dict[tuple[str, str], Callable[..., Any]] = {
    ("torch.serialization", "_get_layout"): _layout,
    ("builtins", "getattr"): _enum_member,
    ("pathlib", "PosixPath"): _path,
    ("pathlib", "PurePosixPath"): _path,
    ("pathlib._local", "PosixPath"): _path,
}
_DTYPES = {("torch", name): v for name, v in vars(torch).items() if isinstance(v, torch.dtype)}
ALLOWED: dict[tuple[str, str], Any] = {**CLASSES, **_WRAPPERS, **_DTYPES}


def _build(self: pickle._Unpickler) -> None:
    target = self.stack[-2]  # type: ignore[attr-defined]  # BUILD's state is on top of its target
    if type(target) not in _BUILDABLE:
        raise pickle.UnpicklingError(f"refusing to set the attributes of {str(target)[:60]}")
    pickle._Unpickler.load_build(self)  # type: ignore[attr-defined]


class MetadataUnpickler(pickle._Unpickler):
    """The pure-Python unpickler (its BUILD can be checked), resolving names from `ALLOWED` only."""

    dispatch = {**pickle._Unpickler.dispatch, pickle.BUILD[0]: _build}  # type: ignore[dict-item]

    def find_class(self, module: str, name: str) -> Any:
        if "." in name:
            raise pickle.UnpicklingError(f"refusing the dotted name {module}:{name[:80]}")
        found = ALLOWED.get((module, name))
        if found is None:
            raise pickle.UnpicklingError(f"refusing {module[:80]}.{name[:80]}: not one of DCP's metadata classes")
        return found


def loads(data: bytes) -> Any:
    return MetadataUnpickler(io.BytesIO(data)).load()


def _nonneg_ints(value: Any, what: str) -> None:
    if not isinstance(value, torch.Size | tuple | list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise ValueError(f"{what} is {str(value)[:80]}, expected sizes")


def _check_tensor(key: str, meta: Any) -> None:
    if not isinstance(meta, TensorStorageMetadata):
        raise ValueError(f"entry {key[:80]!r} is a {type(meta).__name__}; checkpoints of ours hold tensors only")
    if not isinstance(meta.properties, TensorProperties) or not isinstance(meta.properties.dtype, torch.dtype):
        raise ValueError(f"entry {key[:80]!r} has no valid tensor properties")
    _nonneg_ints(meta.size, f"entry {key[:80]!r}'s size")
    if not isinstance(meta.chunks, list):
        raise ValueError(f"entry {key[:80]!r}'s chunks are a {type(meta.chunks).__name__}")
    for chunk in meta.chunks:
        if not isinstance(chunk, ChunkStorageMetadata):
            raise ValueError(f"entry {key[:80]!r} has a chunk of type {type(chunk).__name__}")
        _nonneg_ints(chunk.offsets, f"a chunk of {key[:80]!r}")
        _nonneg_ints(chunk.sizes, f"a chunk of {key[:80]!r}")
        if len(chunk.offsets) != len(meta.size) or len(chunk.sizes) != len(meta.size):
            raise ValueError(f"a chunk of {key[:80]!r} has another number of dimensions than its tensor")


def _check_storage(index: Any, info: Any) -> None:
    if not isinstance(index, MetadataIndex) or not isinstance(index.fqn, str):
        raise ValueError(f"a storage key is a {type(index).__name__}, expected a MetadataIndex")
    if not isinstance(info, _StorageInfo):
        raise ValueError(f"storage of {index.fqn[:80]!r} is a {type(info).__name__}, expected a _StorageInfo")
    name = info.relative_path
    if not isinstance(name, str) or not _FILE.match(name):
        raise ValueError(f"storage of {index.fqn[:80]!r} names the file {str(name)[:80]!r}: a plain *.distcp name")
    for what in ("offset", "length"):
        value = getattr(info, what)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"storage of {index.fqn[:80]!r} has {what} {str(value)[:40]}")
    if getattr(info, "transform_descriptors", None):  # compression etc.: never written by this code
        raise ValueError(f"storage of {index.fqn[:80]!r} asks for transforms {str(info.transform_descriptors)[:80]}")


def check(found: Any) -> Metadata:
    """`found`, unpickled, as DCP metadata of the kind this code writes; ValueError saying what is wrong."""
    if not isinstance(found, Metadata):
        raise ValueError(f"it holds a {type(found).__name__}, not DCP metadata")
    if not isinstance(found.state_dict_metadata, dict) or not isinstance(found.storage_data, dict):
        raise ValueError("its entries or storage are not mappings")
    for key, meta in found.state_dict_metadata.items():
        if not isinstance(key, str):
            raise ValueError(f"an entry's key is a {type(key).__name__}")
        _check_tensor(key, meta)
    for index, info in found.storage_data.items():
        _check_storage(index, info)
    return found


__all__ = ["ALLOWED", "CLASSES", "MAX_METADATA_BYTES", "MetadataUnpickler", "check", "loads"]
