"""The package's shape: no import cycle anywhere (imports inside functions count), and nothing runs at import.

A cycle hidden by a function-level import still couples two modules both ways; the only imports left out
of the graph are the ones a module makes under `if TYPE_CHECKING:` (they never run)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import slurm_elastic

PACKAGE = Path(slurm_elastic.__file__).parent


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking_block(node: ast.AST) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(module: str, tree: ast.AST, is_package: bool, modules: frozenset[str] = frozenset()) -> set[str]:
    """Every slurm_elastic module this one imports, at any depth outside `if TYPE_CHECKING:` blocks.
    `from pkg import mod` of a known module `pkg.mod` depends on that module, not on what pkg's __init__
    holds (Python runs that __init__ first either way, but it need not import anything)."""
    found: set[str] = set()
    base = module if is_package else module.rpartition(".")[0]
    for node in _import_statements(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        else:
            if node.level:
                anchor = base.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                origin = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                origin = node.module or ""
            names = [f"{origin}.{a.name}" for a in node.names]
            found.update(n for n in names if n in modules)
            if not all(n in modules for n in names):
                found.add(origin)
    return {name for name in found if name == "slurm_elastic" or name.startswith("slurm_elastic.")}


def _import_statements(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, outside `if TYPE_CHECKING:` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if _is_type_checking_block(node):
            assert isinstance(node, ast.If)
            stack.extend(node.orelse)
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = frozenset(files)
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        graph[name] = {t for t in _imports(name, tree, path.name == "__init__.py", modules) if t != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle_through_a_function_level_import() -> None:
    source = "def later():\n    from slurm_elastic.b import thing\n"
    graph = {"slurm_elastic.a": _imports("slurm_elastic.a", ast.parse(source), False), "slurm_elastic.b": set()}
    assert graph["slurm_elastic.a"] == {"slurm_elastic.b"}
    graph["slurm_elastic.b"] = {"slurm_elastic.a"}
    assert cycles(graph) == [["slurm_elastic.a", "slurm_elastic.b"]]
    graph["slurm_elastic.b"] = set()
    assert cycles(graph) == []


def test_relative_imports_resolve_from_a_module_and_from_a_package() -> None:
    tree = ast.parse("from . import sibling\nfrom ..other import name\n")
    modules = frozenset({"slurm_elastic.pkg.sibling", "slurm_elastic.other"})
    assert _imports("slurm_elastic.pkg.mod", tree, False, modules) == modules
    assert _imports("slurm_elastic.pkg", tree, True, modules) == modules  # `.` of a package is itself
    inside = ast.parse("from . import sibling\n")
    assert _imports("slurm_elastic.pkg.mod", inside, False) == {"slurm_elastic.pkg"}  # sibling is no module


def test_imports_under_type_checking_are_left_out() -> None:
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import slurm_elastic.b\n")
    assert _imports("slurm_elastic.a", tree, False) == set()


def test_no_import_cycle_anywhere_in_the_package() -> None:
    found = cycles(import_graph())
    assert found == [], "import cycles (function-level imports count): " + "; ".join(" <-> ".join(c) for c in found)


def test_importing_every_module_starts_no_thread_and_registers_no_exit_hook() -> None:
    """Nothing runs at import: importing the whole package (test doubles included) leaves no thread and no
    atexit hook of ours behind. Checked in a fresh interpreter so that other tests' imports do not hide it."""
    program = f"""
import atexit, importlib, json, pkgutil, threading, sys
sys.path.insert(0, {str(PACKAGE.parent)!r})
import slurm_elastic
registered = []
real_register = atexit.register
def register(fn, *args, **kwargs):
    if str(getattr(fn, "__module__", "")).startswith("slurm_elastic"):  # libraries' own hooks are theirs
        registered.append(f"{{fn.__module__}}.{{fn.__qualname__}}")
    return real_register(fn, *args, **kwargs)
atexit.register = register
before = set(threading.enumerate())
names = [m.name for m in pkgutil.walk_packages(slurm_elastic.__path__, "slurm_elastic.")
         if not m.name.endswith("__main__")]
for name in names:
    importlib.import_module(name)
started = [t.name for t in threading.enumerate() if t not in before]
print(json.dumps({{"modules": len(names), "atexit": registered, "threads": started}}))
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen["modules"] > 50  # the walk really imported the package
    assert seen["atexit"] == [], f"atexit hooks registered at import: {seen['atexit']}"
    assert seen["threads"] == [], f"threads started at import: {seen['threads']}"


def _torch_imports(tree: ast.AST) -> set[str]:
    """The torch modules a module imports, at any depth outside `if TYPE_CHECKING:` blocks."""
    found: set[str] = set()
    for node in _import_statements(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif not node.level and node.module:
            found.add(node.module)
    return {name for name in found if name == "torch" or name.startswith("torch.")}


def test_only_the_sharded_strategy_imports_torchs_private_modules() -> None:
    """torch's private distributed modules (a `_` in the path: FSDP2's internals, c10d's registry) change between
    releases; only `worker.sharded`, which loads for a fully_shard model on a torch it checked first, may import
    them."""
    private = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if name.startswith("slurm_elastic.worker.sharded"):
            continue
        imported = _torch_imports(ast.parse(path.read_text()))
        found = {m for m in imported if m.startswith(("torch.distributed.", "torch._C")) and "._" in m}
        if found:
            private[name] = sorted(found)
    assert private == {}
    sharded = [_torch_imports(ast.parse(p.read_text())) for p in (PACKAGE / "worker" / "sharded").glob("*.py")]
    assert any("torch.distributed.fsdp._fully_shard._fsdp_api" in found for found in sharded)  # the check sees them
